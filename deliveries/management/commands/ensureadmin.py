import os
import secrets

from django.conf import settings
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
            f"  Log in at {admin_url()} and change it there.\n"
        )


def admin_url() -> str:
    """Where the admin answers: the public URL if set, else the address gunicorn
    binds (WEBHOOKER_BIND, as webhooker/gunicorn.conf.py reads it)."""
    if settings.WEBHOOKER_PUBLIC_URL:
        return f"{settings.WEBHOOKER_PUBLIC_URL}/admin/"
    bind = os.environ.get("WEBHOOKER_BIND", "127.0.0.1:8080").split(",")[0].strip()
    if bind.startswith("unix:"):
        return f"/admin/ behind the proxy in front of {bind}"
    host, _, port = bind.rpartition(":")
    if host in ("", "0.0.0.0", "127.0.0.1", "[::]", "[::1]"):  # noqa: S104 (a name to print)
        host = "localhost"
    return f"http://{host}:{port}/admin/"
