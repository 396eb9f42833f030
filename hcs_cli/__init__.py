"""``hcs``: the command-line client of HCS Portal for script users. It talks only to the REST API."""
