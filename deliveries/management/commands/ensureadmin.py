import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = (
        "On first start, create the superuser 'admin' with a random password and print "
        "it once on the terminal. Does nothing when any superuser exists."
    )

    def handle(self, *args, **options):
        users = get_user_model()
        if users.objects.filter(is_superuser=True).exists():
            return
        password = secrets.token_urlsafe(18)
        users.objects.create_superuser("admin", email="", password=password)
        # Written to the terminal only, never through logging: log files outlive
        # the moment and are read by more people than the operator.
        self.stdout.write(
            "\n"
            "  Created the superuser 'admin'. Its password, shown this once:\n"
            f"\n      {password}\n\n"
            "  Log in at http://localhost:8080/admin/ and change it there.\n"
        )
