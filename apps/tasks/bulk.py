"""Bulk writes whose statement count does not grow with the number of rows.

Django's ``bulk_update`` builds one CASE expression per field and batches, which is slow past a few
hundred rows and issues more statements as rows grow. On PostgreSQL the rows are instead copied into
a temporary table (COPY), on SQLite inserted into one with a single prepared statement, and applied with
one ``UPDATE ... FROM``; other databases use ``bulk_update``.

New rows: Django's ``bulk_create`` on PostgreSQL sends every column as one array parameter, which psycopg
adapts value by value in Python (about half of a 5,600-row insert). ``bulk_insert_rows`` takes the primary
keys from the table's sequence in one statement and copies the rows in (COPY, adapted in psycopg's C code).
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import DEFAULT_DB_ALIAS, connections, models


def bulk_update_rows(model: type[models.Model], objs: Sequence[models.Model], fields: Sequence[str]) -> None:
    """Write ``fields`` of ``objs`` (already saved rows) back to the database."""
    if not objs:
        return
    # The connection itself, not django.db.connection: that proxy looks it up in a context-local store on
    # every attribute read, and preparing values reads it several times per value.
    connection = connections[DEFAULT_DB_ALIAS]
    if connection.vendor not in ("postgresql", "sqlite"):
        model.objects.bulk_update(objs, fields, batch_size=500)
        return
    meta = model._meta
    columns = [meta.get_field(name) for name in fields]
    deferred = {f.attname for f in columns} & objs[0].get_deferred_fields()
    if deferred:
        # Reading one would query the database in the middle of the COPY below, on the same connection: a hang.
        raise ValueError(f"bulk_update_rows: {', '.join(sorted(deferred))} not loaded on the {model.__name__} rows")
    rows = [[obj.pk, *(f.get_db_prep_save(getattr(obj, f.attname), connection) for f in columns)] for obj in objs]
    names = ", ".join(connection.ops.quote_name(f.column) for f in columns)
    table = connection.ops.quote_name(meta.db_table)
    pk = connection.ops.quote_name(meta.pk.column)
    assignments = ", ".join(
        f"{connection.ops.quote_name(f.column)} = _bulk_rows.{connection.ops.quote_name(f.column)}" for f in columns
    )
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"CREATE TEMP TABLE _bulk_rows ON COMMIT DROP AS SELECT {pk}, {names} FROM {table} WITH NO DATA"
            )
            with cursor.copy(f"COPY _bulk_rows ({pk}, {names}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        else:
            # SQLite (3.33+ has UPDATE ... FROM): one prepared INSERT run for every row, in the same transaction.
            cursor.execute(f"CREATE TEMP TABLE _bulk_rows AS SELECT {pk}, {names} FROM {table} WHERE 0")
            marks = ", ".join(["%s"] * (len(columns) + 1))
            cursor.executemany(f"INSERT INTO _bulk_rows ({pk}, {names}) VALUES ({marks})", rows)
        cursor.execute(f"UPDATE {table} SET {assignments} FROM _bulk_rows WHERE {table}.{pk} = _bulk_rows.{pk}")
        cursor.execute("DROP TABLE _bulk_rows")


def bulk_insert_rows(model: type[models.Model], objs: Sequence[models.Model]) -> None:
    """Insert ``objs`` (new rows of ``model``, without primary keys) and set their primary keys, as
    ``bulk_create`` does. Model ``save()`` and signals are not run, as with ``bulk_create``."""
    if not objs:
        return
    connection = connections[DEFAULT_DB_ALIAS]
    if connection.vendor != "postgresql":
        model.objects.bulk_create(objs, batch_size=500)
        return
    meta = model._meta
    columns = [f for f in meta.concrete_fields if not f.primary_key]
    table = connection.ops.quote_name(meta.db_table)
    pk = connection.ops.quote_name(meta.pk.column)
    names = ", ".join(connection.ops.quote_name(f.column) for f in columns)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, %s)) FROM generate_series(1, %s)",
            [meta.db_table, meta.pk.column, len(objs)],
        )
        keys = [row[0] for row in cursor.fetchall()]
        # Insert-time timestamps (auto_now / auto_now_add): one for the whole insert, as one statement would
        # stamp its rows, taken by the field's own pre_save on the first row; every other field's pre_save runs
        # per row, as an INSERT through Django would run it.
        stamps = {
            f: f.pre_save(objs[0], True)
            for f in columns
            if getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False)
        }
        rows = []
        for obj, key in zip(objs, keys, strict=True):
            obj.pk = key
            row = [key]
            for f in columns:
                if f in stamps:
                    value = stamps[f]
                    setattr(obj, f.attname, value)
                else:
                    value = f.pre_save(obj, True)
                row.append(f.get_db_prep_save(value, connection))
            rows.append(row)
        with cursor.copy(f"COPY {table} ({pk}, {names}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
    for obj in objs:
        obj._state.adding = False
        obj._state.db = connection.alias
