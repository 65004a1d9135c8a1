from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from rest_framework import serializers

from deliveries.models import ApiKey


class Command(BaseCommand):
    help = "Create an API key for a user and print it (on the last line): it is shown only once."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", required=True, help="what the key is for, e.g. 'terraform'")
        parser.add_argument(
            "--expires", help="when the key stops working, ISO 8601 (default: never)"
        )

    def handle(self, *args, username, name, expires, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user {username!r}.")
        api_key = ApiKey(user=user, name=name)
        if expires:
            try:
                api_key.expires_at = serializers.DateTimeField().to_internal_value(expires)
            except serializers.ValidationError:
                raise CommandError(f"--expires {expires!r} is not an ISO 8601 time.") from None
        key = api_key.set_new_key()
        api_key.full_clean()
        api_key.save()
        self.stdout.write(f"API key {name!r} for {username} (shown only this once):")
        self.stdout.write(key)
