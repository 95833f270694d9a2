"""A site's agent credential: enrol (print the agent's whole configuration once), revoke, list.

    manage.py site_agent SITE --print-env [--url URL] [--state PATH]   a fresh credential (the old one is revoked)
    manage.py site_agent SITE --revoke                                 revoke the site's agent credential
    manage.py site_agent [SITE] --list                                 agents: prefix, state, created, last seen, key

SITE is the site's code (or its first characters) or its queue name. --print-env prints every variable the agent
(python -m runners.agent) needs and nothing else: no database URL, no SECRET_KEY, no bucket key. The token is shown
this once; only its SHA-256 is kept.
"""
from __future__ import annotations

import shlex

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from gates.codes import CodeNotFound, find_by_code
from runners import agents
from runners.models import Site, SiteAgent

DEFAULT_URL = "http://127.0.0.1:8000"
STATE_ROOT = "/var/lib/fxpilot-agent"


def control_plane_url() -> str:
    """The address agents reach the control plane at: FXPILOT_PUBLIC_URL if set, else the portal's SITE_URL."""
    return (getattr(settings, "FXPILOT_PUBLIC_URL", "") or getattr(settings, "SITE_URL", "") or DEFAULT_URL).rstrip("/")


def find_site(text: str) -> Site:
    try:
        return find_by_code(Site.objects.all(), text, "site", name_field="queue")
    except CodeNotFound as exc:
        raise CommandError(str(exc)) from None


def agent_env(agent: SiteAgent, token: str, *, url: str, state: str) -> str:
    """The agent's whole configuration, as an environment file (shell and systemd EnvironmentFile alike)."""
    site = agent.site
    lines = [
        f"# fxpilot site agent of site {site.name} (queue {site.queue}, code {site.code}), "
        f"enrolled {timezone.localtime(agent.created):%Y-%m-%d %H:%M %Z}.",
        "# The token is shown this once and cannot be shown again: keep this file on the site's jump host only,",
        "# readable by the agent's user alone (chmod 600). A new enrolment revokes this token.",
        f"FXPILOT_AGENT_URL={shlex.quote(url)}",
        f"FXPILOT_AGENT_TOKEN={token}",
        f"FXPILOT_AGENT_STATE={shlex.quote(state)}",
    ]
    return "\n".join(lines) + "\n"


def _when(moment) -> str:
    return f"{timezone.localtime(moment):%Y-%m-%d %H:%M:%S}" if moment else "never"


class Command(BaseCommand):
    help = ("Enrol a site's agent (--print-env: a fresh credential and the agent's whole configuration, shown once; "
            "the previous credential is revoked), --revoke it, or --list agents.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("site", nargs="?", help="the site's code (or its first characters) or its queue name")
        action = parser.add_mutually_exclusive_group(required=True)
        action.add_argument("--print-env", action="store_true",
                            help="create a fresh agent credential and print the agent's environment (shown once)")
        action.add_argument("--revoke", action="store_true", help="revoke the site's agent credential")
        action.add_argument("--list", action="store_true", help="list the agents (of SITE, or of every site)")
        parser.add_argument("--url", help=f"the control plane's address as the agent reaches it (default: "
                                          f"FXPILOT_PUBLIC_URL or SITE_URL, else {DEFAULT_URL})")
        parser.add_argument("--state", help=f"the agent's state folder on the jump host (default: "
                                            f"{STATE_ROOT}/QUEUE)")

    def handle(self, *args, site: str | None, print_env: bool, revoke: bool, list: bool, url: str | None,
               state: str | None, **options) -> None:
        if list:
            self._list(find_site(site) if site else None)
            return
        if not site:
            raise CommandError("name the site: its code or its queue name")
        found = find_site(site)
        if revoke:
            count = agents.revoke_agents(found)
            if not count:
                raise CommandError(f"site {found.name} has no active agent credential")
            self.stdout.write(f"revoked the agent credential of site {found.name}; its agent is refused from now on")
            return
        address = (url or control_plane_url()).rstrip("/")
        if not address.startswith(("https://", "http://")):
            raise CommandError(f"--url {address!r} is not an http:// or https:// address")
        agent, token = agents.create_agent(found)
        self.stdout.write(agent_env(agent, token, url=address, state=state or f"{STATE_ROOT}/{found.queue}"),
                          ending="")

    def _list(self, site: Site | None) -> None:
        rows = SiteAgent.objects.select_related("site").order_by("site__name", "-created")
        if site is not None:
            rows = rows.filter(site=site)
        if not rows:
            self.stdout.write("no site agents")
            return
        for agent in rows:
            state = f"revoked {_when(agent.revoked_at)}" if agent.revoked_at else "active"
            where = f" from {agent.last_address}" if agent.last_address else ""
            self.stdout.write(
                f"{agent.site.queue}\t{agent.token_prefix}…\t{state}\tcreated {_when(agent.created)}\t"
                f"last seen {_when(agent.last_seen)}{where}\tkey {agent.key_fingerprint or 'not registered'}\t"
                f"version {agent.version or '?'}")
