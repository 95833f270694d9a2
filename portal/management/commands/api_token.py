"""Issue a personal API token. The token is printed once; only its SHA-256 is stored."""
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from gates.models import ApiToken


class Command(BaseCommand):
    help = "Issue an API token for USERNAME (printed once; store it safely)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="cli", help="What the token is for")

    def handle(self, *args, username: str, name: str, **options) -> None:
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None:
            raise CommandError(f"no active user named {username!r}")
        _, key = ApiToken.issue(user, name)
        self.stdout.write(key)
