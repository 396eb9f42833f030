/* The library after next_a.c in the search order (see there). */
int hcs_which(void) { return 'b'; }
