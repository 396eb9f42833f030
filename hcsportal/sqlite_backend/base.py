"""Django's SQLite backend, with the integer ranges of PostgreSQL and the query parameter limit SQLite reports.

SQLite stores any integer a 64-bit column holds, so Django's SQLite backend lets an ``IntegerField`` take values a
PostgreSQL ``integer`` refuses: a form or the API would accept on the embedded default what they refuse on
PostgreSQL, and the OpenAPI schema, which states each field's bounds, would differ between the two. With the
ranges of Django's base backend (those of PostgreSQL), validation and the schema are the same on both.

Django also assumes at most 999 parameters per statement (SQLite's limit before 3.32), so a bulk insert of a
thousand rows became nine statements; the limit this SQLite was built with (32,766 by default since 3.32) makes it
one, as on PostgreSQL.
"""

from __future__ import annotations

import sqlite3

from django.db.backends.base.operations import BaseDatabaseOperations
from django.db.backends.sqlite3 import base, features, operations
from django.utils.functional import cached_property


class DatabaseFeatures(features.DatabaseFeatures):
    @cached_property
    def max_query_params(self) -> int:
        self.connection.ensure_connection()
        return self.connection.connection.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)


class DatabaseOperations(operations.DatabaseOperations):
    integer_field_range = BaseDatabaseOperations.integer_field_range


class DatabaseWrapper(base.DatabaseWrapper):
    features_class = DatabaseFeatures
    ops_class = DatabaseOperations
