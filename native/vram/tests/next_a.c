/* Two libraries defining the same symbol: dlsym(RTLD_NEXT) from the first must find the second's. */
#define _GNU_SOURCE
#include <dlfcn.h>
int hcs_which(void) { return 'a'; }
int hcs_next(void) { return ((int (*)(void))dlsym(RTLD_NEXT, "hcs_which"))(); }
