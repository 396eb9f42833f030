"""Print the JSON Schema of a task file (or write it to a file: docs/task-file.schema.json is such a copy)."""

import json
from pathlib import Path

from django.core.management.base import BaseCommand

from apps.tasks.api.file_schema import task_file_schema


def schema_text() -> str:
    return json.dumps(task_file_schema(), indent=2, ensure_ascii=False) + "\n"


class Command(BaseCommand):
    help = "Print the JSON Schema of a task file, as GET /api/v1/tasks/file-schema/ serves it."

    def add_arguments(self, parser):
        parser.add_argument("--file", help="write it to this file instead of standard output")

    def handle(self, *args, file: str | None = None, **options):
        if file:
            Path(file).write_text(schema_text())
        else:
            self.stdout.write(schema_text(), ending="")
