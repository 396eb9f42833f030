"""Bulk writes whose statement count does not grow with the number of rows.

Django's ``bulk_update`` builds one CASE expression per field and batches, which is slow past a few
hundred rows and issues more statements as rows grow. On PostgreSQL the rows are instead copied into
a temporary table (COPY) and applied with one ``UPDATE ... FROM``; other databases use ``bulk_update``.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connection, models


def bulk_update_rows(model: type[models.Model], objs: Sequence[models.Model], fields: Sequence[str]) -> None:
    """Write ``fields`` of ``objs`` (already saved rows) back to the database."""
    if not objs:
        return
    if connection.vendor != "postgresql":
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
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TEMP TABLE _bulk_rows ON COMMIT DROP AS SELECT {pk}, {names} FROM {table} WITH NO DATA")
        with cursor.copy(f"COPY _bulk_rows ({pk}, {names}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        assignments = ", ".join(
            f"{connection.ops.quote_name(f.column)} = _bulk_rows.{connection.ops.quote_name(f.column)}" for f in columns
        )
        cursor.execute(f"UPDATE {table} SET {assignments} FROM _bulk_rows WHERE {table}.{pk} = _bulk_rows.{pk}")
        cursor.execute("DROP TABLE _bulk_rows")
