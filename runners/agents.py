"""Site agents' credentials: a bearer token per site, shown once, stored hashed, revocable; and the agent's key.

A token is ``fxa_`` + 40 URL-safe characters. Only its SHA-256 is stored (like the portal's API tokens): looking
a presented token up by its hash compares nothing secret character by character, and a copy of the database
gives nobody a token. Enrolling a site's agent revokes the one before (rotation); revoking one touches no
other site.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import shlex
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from runners.credentials import reseal_for_agent
from runners.models import Credential, Site, SiteAgent
from runners.sealing import check_public

logger = logging.getLogger(__name__)

TOKEN_PREFIX = "fxa_"
SEEN_EVERY = timedelta(seconds=10)  # last_seen / last_address are written at most this often


DEFAULT_URL = "http://127.0.0.1:8000"
STATE_ROOT = "/var/lib/fxpilot-agent"


def control_plane_url() -> str:
    """The address agents reach the control plane at: the portal's SITE_URL."""
    return (getattr(settings, "SITE_URL", "") or DEFAULT_URL).rstrip("/")


def default_state(site: Site) -> str:
    """Where the agent keeps its key on the jump host, unless its maker says otherwise."""
    return f"{STATE_ROOT}/{site.queue}"


def agent_env(agent: SiteAgent, token: str, *, url: str, state: str) -> str:
    """The agent's whole configuration, as an environment file (shell and systemd EnvironmentFile alike): the
    control plane's address, the token (shown this once) and the state folder; nothing else."""
    site = agent.site
    lines = [
        f"# fxpilot site agent of site {site.name} (queue {site.queue}, code {site.code}), "
        f"enrolled {timezone.localtime(agent.created):%Y-%m-%d %H:%M %Z}.",
        "# The token is shown this once and cannot be shown again: keep this file on the site's jump host only,",
        "# readable by the agent's user alone (chmod 600). A new enrolment revokes this token.",
        "# The agent needs Python 3.11+ with paramiko, cryptography and PyNaCl (requirements-agent.txt in the site's",
        "# agent kit, on the portal's site page) and fxpilot's runners/agent code; no Django, no database.",
        f"FXPILOT_AGENT_URL={shlex.quote(url)}",
        f"FXPILOT_AGENT_TOKEN={token}",
        f"FXPILOT_AGENT_STATE={shlex.quote(state)}",
    ]
    return "\n".join(lines) + "\n"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", errors="replace")).hexdigest()


def create_agent(site: Site, *, created_by=None) -> tuple[SiteAgent, str]:
    """A fresh agent credential for `site`, revoking the site's active one; returns (agent, token). The token is
    not stored and cannot be shown again."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(30)
    with transaction.atomic():
        revoke_agents(site)
        agent = SiteAgent.objects.create(site=site, token_prefix=token[:8], token_hash=hash_token(token),
                                         created_by=created_by)
    logger.info("site agent %s… enrolled for site %s", agent.token_prefix, site.name)
    return agent, token


def revoke_agents(site: Site) -> int:
    """Revoke the site's active agent(s); their token is refused from now on. Returns how many."""
    count = SiteAgent.objects.filter(site=site, revoked_at=None).update(revoked_at=timezone.now())
    if count:
        logger.info("site agent of site %s revoked", site.name)
    return count


def authenticate(token: str | None, *, address: str = "") -> SiteAgent | None:
    """The active agent whose token this is, or None (unknown, malformed or revoked). Notes when it was seen."""
    if not token or not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    digest = hash_token(token)
    agent = SiteAgent.objects.select_related("site").filter(token_hash=digest).first()
    if agent is None or not hmac.compare_digest(agent.token_hash, digest) or agent.revoked_at is not None:
        return None
    now = timezone.now()
    if agent.last_seen is None or now - agent.last_seen >= SEEN_EVERY or agent.last_address != address[:64]:
        SiteAgent.objects.filter(pk=agent.pk).update(last_seen=now, last_address=address[:64])
        agent.last_seen, agent.last_address = now, address[:64]
    return agent


class KeyConflict(Exception):
    """The agent's token is enrolled with another public key."""


def register_key(agent: SiteAgent, public_key: str, *, version: str = "") -> int:
    """The agent's hello: register its public key (first hello) or check it is the registered one (KeyConflict),
    then seal to it every credential of the site it cannot open yet. Returns how many were (re)sealed."""
    key = check_public(public_key)  # SealError when it is not an X25519 public key
    with transaction.atomic():
        current = SiteAgent.objects.select_for_update().get(pk=agent.pk)
        if current.revoked_at is not None:
            raise KeyConflict("this agent's token was revoked")
        if current.public_key and current.public_key != key:
            raise KeyConflict("this agent's token is enrolled with another key; enrol the agent again "
                              "(manage.py site_agent SITE --print-env) to use a new key")
        fields = {"version": (version or "")[:64]}
        if not current.public_key:
            fields["public_key"] = key
        SiteAgent.objects.filter(pk=agent.pk).update(**fields)
        for name, value in fields.items():
            setattr(agent, name, value)
        resealed = reseal_for_agent(agent)
    stale = Credential.objects.filter(site=agent.site_id).exclude(sealed_key="").exclude(sealed_to=agent).count()
    if stale:
        logger.warning("site %s: %d credential(s) are sealed to a previous agent key and cannot be opened by the "
                       "enrolled agent; upload them again", agent.site.name, stale)
    return resealed
