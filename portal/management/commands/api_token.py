"""API tokens from the command line: issue one (printed once; only its SHA-256 is stored), list, revoke.

    manage.py api_token USERNAME [--name WHAT] [--days N]   issue (N days, default FXPILOT_API_TOKEN_DAYS = 90)
    manage.py api_token --list [USERNAME]                    every token (or USERNAME's): prefix, state, expiry
    manage.py api_token --revoke PREFIX [USERNAME]           revoke the token whose prefix is PREFIX

A token is never printed but when it is issued; the list shows its first 12 characters (its prefix).
"""
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from gates.models import API_TOKEN_MAX_DAYS, ApiToken, api_token_days


def state_of(token: ApiToken) -> str:
    if token.revoked:
        return "revoked"
    return "expired" if token.expired else "active"


class Command(BaseCommand):
    help = ("Issue an API token for USERNAME (printed once; store it safely), or --list / --revoke tokens. "
            "Every token expires (--days, default FXPILOT_API_TOKEN_DAYS).")

    def add_arguments(self, parser) -> None:
        parser.add_argument("username", nargs="?")
        parser.add_argument("--name", default="cli", help="What the token is for")
        parser.add_argument("--days", type=int, help=f"days the token lives (1–{API_TOKEN_MAX_DAYS}; default "
                            "FXPILOT_API_TOKEN_DAYS, 90)")
        action = parser.add_mutually_exclusive_group()
        action.add_argument("--list", action="store_true", help="list tokens (USERNAME's, or everyone's)")
        action.add_argument("--revoke", metavar="PREFIX", help="revoke the token with this prefix (fxp_…)")

    def handle(self, *args, username: str | None, name: str, days: int | None, list: bool, revoke: str | None,
               **options) -> None:
        user = None
        if username:
            user = get_user_model().objects.filter(username=username).first()
            if user is None:
                raise CommandError(f"no user named {username!r}")
        if list:
            tokens = ApiToken.objects.select_related("user").order_by("user__username", "-created")
            if user is not None:
                tokens = tokens.filter(user=user)
            for token in tokens:
                used = (f"last used {timezone.localtime(token.last_used):%Y-%m-%d %H:%M}" if token.last_used
                        else "never used")
                self.stdout.write(f"{token.prefix}…  {token.user.get_username():<16} {state_of(token):<8} "
                                  f"expires {timezone.localtime(token.expires):%Y-%m-%d %H:%M}  {used}  {token.name}")
            return
        if revoke:
            prefix = revoke.strip().rstrip("…").rstrip(".")
            if len(prefix) < 8:
                raise CommandError("give at least the first 8 characters of the token (its prefix, as --list shows)")
            tokens = ApiToken.objects.filter(prefix__startswith=prefix[:12])
            if user is not None:
                tokens = tokens.filter(user=user)
            found = [token for token in tokens if prefix.startswith(token.prefix) or token.prefix.startswith(prefix)]
            if not found:
                raise CommandError(f"no token with the prefix {prefix!r}")
            if len(found) > 1:
                raise CommandError(f"{len(found)} tokens have the prefix {prefix!r}; name the user too")
            token = found[0]
            done = token.revoke()
            self.stdout.write(f"{token.prefix}… of {token.user.get_username()}: "
                              f"{'revoked' if done else 'was already revoked'}")
            return
        if user is None:
            raise CommandError("name the user to issue a token for (or use --list / --revoke)")
        if not user.is_active:
            raise CommandError(f"no active user named {username!r}")
        try:
            token, key = ApiToken.issue(user, name, days=api_token_days() if days is None else days)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(key)
        self.stderr.write(f"expires {timezone.localtime(token.expires):%Y-%m-%d %H:%M} ({token.prefix}…)")
