"""``manage.py check_backends``: compare every enabled cluster's backend with the database."""

from django.core.management.base import BaseCommand, CommandError

from apps.control import invariants


class Command(BaseCommand):
    help = "List jobs of no live attempt, duplicate jobs, devices held twice and lost submissions; exit 1 if any."

    def handle(self, *args, **options):
        problems = invariants.check()
        for problem in problems:
            self.stdout.write(str(problem))
        if problems:
            raise CommandError(f"{len(problems)} problem(s) between the backends and the database")
        self.stdout.write(self.style.SUCCESS("backends and database agree"))
