"""The agent's whole configuration: six environment variables, and the refusal of any control-plane secret.

A site agent runs on a customer's jump host. It needs its control plane's address, its own token and a folder for
its key; it must never hold what would let it past its own site (the database, ``SECRET_KEY``, the bucket's key,
the broker). Finding one of those in its environment is a deployment mistake: it says which and does not start.
"""
from __future__ import annotations

import ipaddress
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from runners import sealing
from runners.agent import policy as address_policy

URL = "FXPILOT_AGENT_URL"
TOKEN = "FXPILOT_AGENT_TOKEN"
STATE = "FXPILOT_AGENT_STATE"
CA = "FXPILOT_AGENT_CA"
SLOTS = "FXPILOT_AGENT_SLOTS"
ALLOW = address_policy.ALLOW
VARIABLES = (URL, TOKEN, STATE, CA, SLOTS, ALLOW)

# What the control plane holds and a site agent must not: each would reach beyond the agent's own site.
FORBIDDEN = {
    "DATABASE_URL": "the control plane's database login",
    "SECRET_KEY": "the control plane's SECRET_KEY",
    "FXPILOT_S3_SECRET_ACCESS_KEY": "the evidence bucket's secret key",
    "AWS_SECRET_ACCESS_KEY": "an object-storage secret key",
    "CELERY_BROKER_URL": "the control plane's broker address",
}

DEFAULT_SLOTS = 8
MAX_SLOTS = 64
KEY_FILE = "agent.key"


class ConfigError(Exception):
    """The agent cannot start with this environment; the message says which variable and why."""


@dataclass(frozen=True)
class Config:
    url: str  # the control plane's base URL, without a trailing slash
    token: str = field(repr=False)
    state: Path
    ca: Path | None = None
    slots: int = DEFAULT_SLOTS
    policy: address_policy.AddressPolicy = field(default_factory=address_policy.AddressPolicy)

    @property
    def key_path(self) -> Path:
        return self.state / KEY_FILE

    @property
    def api(self) -> str:
        return self.url + "/agent/v1"

    def insecure_transport(self) -> bool:
        """True when the token would cross a network in clear (http:// to anything but this machine)."""
        parts = urlsplit(self.url)
        if parts.scheme == "https":
            return False
        host = parts.hostname or ""
        if host == "localhost":
            return False
        try:
            return not ipaddress.ip_address(host).is_loopback
        except ValueError:
            return True


def refuse_control_plane_secrets(environ) -> None:
    present = [name for name in FORBIDDEN if environ.get(name)]
    if present:
        name = present[0]
        raise ConfigError(f"the site agent must not hold {FORBIDDEN[name]}: unset {name} in its environment "
                          "(a site agent needs only " + ", ".join(VARIABLES[:3]) + " and optionally "
                          + ", ".join(VARIABLES[3:]) + ")")


def load(environ=None) -> Config:
    """The configuration from the environment, or ConfigError naming the variable that is missing or wrong."""
    environ = os.environ if environ is None else environ
    refuse_control_plane_secrets(environ)
    url = environ.get(URL, "").strip()
    if not url:
        raise ConfigError(f"{URL} is not set: the control plane's address, e.g. https://fxpilot.example.com")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 — raises ValueError on a port that is not a number
    except ValueError as exc:
        raise ConfigError(f"{URL} is not an address ({exc})") from None
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ConfigError(f"{URL} must be a plain address, without a user name, a password, a query or a fragment")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{URL} must be an http:// or https:// address with a host name, not {url!r}")
    token = environ.get(TOKEN, "").strip()
    if not token:
        raise ConfigError(f"{TOKEN} is not set: the site agent's token, shown once by "
                          "`python manage.py site_agent SITE --print-env`")
    if any(c.isspace() for c in token) or not token.isprintable():
        raise ConfigError(f"{TOKEN} holds spaces or control characters; copy the token again")
    state = environ.get(STATE, "").strip()
    if not state:
        raise ConfigError(f"{STATE} is not set: a folder for the agent's own key, e.g. /var/lib/fxpilot-agent")
    ca = environ.get(CA, "").strip()
    ca_path = None
    if ca:
        ca_path = Path(ca)
        if not ca_path.is_file():
            raise ConfigError(f"{CA} names {ca}, which is not a file (a PEM bundle of the CA certificates to trust)")
    slots_text = environ.get(SLOTS, "").strip()
    slots = DEFAULT_SLOTS
    if slots_text:
        try:
            slots = int(slots_text)
        except ValueError:
            raise ConfigError(f"{SLOTS} must be a whole number of parallel calls, not {slots_text!r}") from None
        if not 1 <= slots <= MAX_SLOTS:
            raise ConfigError(f"{SLOTS} must be between 1 and {MAX_SLOTS}, not {slots}")
    try:
        allowed = address_policy.AddressPolicy.parse(environ.get(ALLOW, ""))
    except address_policy.PolicyError as exc:
        raise ConfigError(str(exc)) from None
    return Config(url=url.rstrip("/"), token=token, state=Path(state), ca=ca_path, slots=slots, policy=allowed)


# --- the agent's own key ----------------------------------------------------------------------

def _state_dir(path: Path) -> None:
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{STATE}: cannot make the folder {path} ({exc.strerror or exc})") from None
    if not path.is_dir():
        raise ConfigError(f"{STATE}: {path} is not a folder")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        try:
            path.chmod(0o700)
        except OSError as exc:
            raise ConfigError(f"{STATE}: {path} is open to other users (mode {mode:o}) and cannot be made 0700 "
                              f"({exc.strerror or exc})") from None


def load_or_make_key(config: Config) -> tuple[str, bool]:
    """(the agent's X25519 private key, True if it was made now). Made once, 0600, written atomically; reused."""
    _state_dir(config.state)
    path = config.key_path
    made = False
    if not path.exists():
        private, _public = sealing.new_keypair()
        tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}.new")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, (private + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # never replaces a key another start made meanwhile
            made = True
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        dir_fd = os.open(config.state, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise ConfigError(f"{STATE}: the agent's key {path} is readable by other users (mode {mode:o}); "
                          f"make it 0600 (chmod 600 {path})")
    text = path.read_text().strip()
    try:
        sealing.public_of(text)
    except sealing.SealError:
        raise ConfigError(f"{STATE}: {path} does not hold an agent key; move it away to make a new one "
                          "(the control plane then needs a new token: the key is enrolled with the first hello)") from None
    return text, made
