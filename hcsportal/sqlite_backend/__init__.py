"""Django's SQLite backend holding integer columns to the ranges PostgreSQL holds them to (see ``base``)."""
