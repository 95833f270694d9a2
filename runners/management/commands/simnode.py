"""Run simulated GPU nodes (SSH servers on 127.0.0.1) in the foreground, or change a running node's faults.

    manage.py simnode --nodes 2 [--base-port 2222] [--dir var/simnodes] [--register-site SITE | --pilot PILOT]
                      [--accept-host-keys] [--fault node1:fx-missing ...] [--time-scale 0.01]
    manage.py simnode fault [--dir D] node1 fx-down on|off
    manage.py simnode fault [--dir D] node1 drop-ssh-after 5        (seconds; "off" clears)
    manage.py simnode rekey [--dir D] node1                          (a new host key: the "host key changed" fault)
"""
from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from gates.codes import CodeNotFound, find_by_code
from gates.models import Pilot
from runners.credentials import create_credential
from runners.models import Node, Site
from runners.simnode.server import BIN_DIR, DEFAULT_USERNAME, SimNodeServer, generate_ed25519, read_public_keys
from runners.simnode.state import FAULTS, load_state, save_state, state_path
from runners.ssh import accept_host_key

# fault name on the command line → (state.json key, value parser)
_FAULTS = {
    "fx-down": ("fx_down", "bool"), "fx-missing": ("fx_missing", "bool"), "refuse-auth": ("refuse_auth", "bool"),
    "corrupt-transfers": ("corrupt_transfers", "bool"), "sudo-password": ("sudo_password", "bool"), "fx-degraded": ("fx_degraded", "float"),
    "slow-disk": ("slow_disk", "float"), "slow-command": ("slow_command_seconds", "float"),
    "drop-ssh-after": ("drop_ssh_after_seconds", "float_or_off"),
    "server-crash-after": ("server_crash_after_requests", "int_or_off"),
    "missing-tools": ("missing_tools", "tools"),  # comma-separated simulated tools to leave off PATH, or off
    "metrics-missing": ("metrics_missing", "bool"),  # the simulated server answers 404 at /metrics
}


def parse_fault(name: str, value: str) -> tuple[str, object]:
    if name not in _FAULTS:
        raise CommandError(f"unknown fault {name!r}; known: {', '.join(sorted(_FAULTS))}")
    key, kind = _FAULTS[name]
    value = value.lower()
    if kind == "tools":
        tools = [] if value in ("off", "none", "") else sorted({t.strip() for t in value.split(",") if t.strip()})
        unknown = [t for t in tools if not (BIN_DIR / t).exists()]
        if unknown:
            known = ", ".join(sorted(p.name for p in BIN_DIR.iterdir()))
            raise CommandError(f"fault {name}: no simulated tool {', '.join(unknown)}; known: {known}")
        return key, tools
    try:
        if kind == "bool":
            if value not in ("on", "off", "true", "false", "1", "0"):
                raise ValueError
            return key, value in ("on", "true", "1")
        if value in ("off", "none") and kind.endswith("_or_off"):
            return key, None
        if kind.startswith("int"):
            return key, int(value)
        number = float(value)
        if number < 0:
            raise ValueError
        return key, number
    except ValueError:
        raise CommandError(f"fault {name}: {value!r} is not a valid value ({kind.replace('_or_off', ' or off')})") from None


def set_fault(root: Path, name: str, value: str) -> dict:
    if not state_path(root).exists():
        raise CommandError(f"{root} holds no simulated node (no state.json)")
    key, parsed = parse_fault(name, value)
    state = load_state(root)
    state["faults"][key] = parsed
    save_state(root, state)
    return state


class Command(BaseCommand):
    help = "Run N simulated GPU nodes over real SSH on 127.0.0.1 (simulated: true), or change one's faults."

    def create_parser(self, prog_name: str, subcommand: str, **kwargs) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        # `simnode fault --dir D node1 fx-down on`: options may sit between the action's words
        parser.parse_args = parser.parse_intermixed_args
        return parser

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", nargs="*", help="empty to run nodes; or: fault NODE NAME VALUE; or: rekey NODE")
        parser.add_argument("--nodes", type=int, default=2)
        parser.add_argument("--base-port", type=int, default=0, help="first port (0 = any free port for each)")
        parser.add_argument("--dir", default=None, help="where sandboxes and keys live (default DATA_DIR/simnodes)")
        parser.add_argument("--username", default=DEFAULT_USERNAME)
        parser.add_argument("--authorized-key", default=None, help="a public key file to authorize instead of a generated one")
        parser.add_argument("--register-site", default=None, metavar="SITE_CODE", help="create the nodes in this site")
        parser.add_argument("--pilot", default=None, metavar="PILOT_CODE", help="create (or reuse) a simulated site of this pilot")
        parser.add_argument("--accept-host-keys", action="store_true", help="accept the host keys at once (demo only)")
        parser.add_argument("--fault", action="append", default=[], metavar="NODE:NAME[=VALUE]")
        parser.add_argument("--time-scale", type=float, default=None)
        parser.add_argument("--run-for", type=float, default=None, help="stop after this many seconds (scripts, tests)")

    def handle(self, *args, **opts) -> None:
        base = Path(opts["dir"] or Path(settings.DATA_DIR) / "simnodes").resolve()
        action = opts["action"]
        if action and action[0] == "fault":
            if len(action) != 4:
                raise CommandError("usage: simnode fault NODE NAME VALUE (e.g. simnode fault node1 fx-down on)")
            state = set_fault(base / action[1], action[2], action[3])
            self.stdout.write(f"{action[1]}: faults now {state['faults']}")
            return
        if action and action[0] == "rekey":
            if len(action) != 2:
                raise CommandError("usage: simnode rekey NODE")
            server = SimNodeServer(base / action[1], action[1], authorized_keys=base / "authorized_keys")
            if not server.host_key_path.exists():
                raise CommandError(f"{action[1]}: no simulated node under {base}")
            self.stdout.write(f"{action[1]}: new host key {server.rekey()}")
            return
        if action:
            raise CommandError(f"unknown action {action[0]!r}; use fault or rekey, or none to run nodes")
        self.run_nodes(base, opts)

    def run_nodes(self, base: Path, opts: dict) -> None:
        count = opts["nodes"]
        if not 1 <= count <= 64:
            raise CommandError("--nodes must be between 1 and 64")
        if opts["base_port"] and not 1024 <= opts["base_port"] <= 65535 - count:
            raise CommandError("--base-port must leave room for every node within 1024–65535")
        if opts["register_site"] and opts["pilot"]:
            raise CommandError("use --register-site or --pilot, not both")
        base.mkdir(parents=True, exist_ok=True)
        authorized = base / "authorized_keys"
        key_path = base / "client_key"
        if opts["authorized_key"]:
            source = Path(opts["authorized_key"])
            if not read_public_keys(source):
                raise CommandError(f"{source}: no public key found (expected lines like 'ssh-ed25519 AAAA… comment')")
            authorized.write_text(source.read_text())
            key_path = None
        else:
            if not key_path.exists():
                generate_ed25519(key_path, comment="fxpilot-simnode-user")
            authorized.write_text(key_path.with_name("client_key.pub").read_text())
        faults = self.parse_fault_flags(opts["fault"], count)
        scale = opts["time_scale"] or settings.FXPILOT_SIM_TIME_SCALE
        servers = []
        try:
            for i in range(1, count + 1):
                name = f"node{i}"
                port = opts["base_port"] + i - 1 if opts["base_port"] else 0
                # One FX array behind the fabric, seen by every node of this simulated cluster.
                server = SimNodeServer(base / name, name, authorized_keys=authorized, username=opts["username"], port=port,
                                       time_scale=scale, fx_array=base / "fx-array")
                server.prepare()
                state = load_state(server.root)
                state["time_scale"] = scale
                state["faults"] = dict(FAULTS, **faults.get(name, {}))
                save_state(server.root, state)
                servers.append(server.start())
        except OSError as exc:
            for server in servers:
                server.stop()
            raise CommandError(f"cannot listen: {exc}") from None
        self.stdout.write(self.style.WARNING("SIMULATED GPU nodes (simulated: true) — not evidence of real hardware"))
        for server in servers:
            self.stdout.write(f"{server.name}  host=127.0.0.1 port={server.port} user={server.username} "
                              f"fingerprint={server.fingerprint} sandbox={server.root}")
        if key_path is not None:
            self.stdout.write(f"user private key: {key_path}")
        if opts["register_site"] or opts["pilot"]:
            self.register(servers, key_path, opts)
        self.stdout.write("running; Ctrl-C to stop")
        self.stdout.flush()
        self.wait(opts["run_for"])
        for server in servers:
            server.stop()
        self.stdout.write("simulated nodes stopped")

    def parse_fault_flags(self, flags: list[str], count: int) -> dict[str, dict]:
        out: dict[str, dict] = {}
        for flag in flags:
            node, _, spec = flag.partition(":")
            name, _, value = spec.partition("=")
            if not node or not name:
                raise CommandError(f"--fault {flag!r}: use NODE:NAME[=VALUE], e.g. node1:fx-missing")
            if node not in {f"node{i}" for i in range(1, count + 1)}:
                raise CommandError(f"--fault {flag!r}: there is no {node} among {count} nodes")
            key, parsed = parse_fault(name, value or "on")
            out.setdefault(node, {})[key] = parsed
        return out

    def register(self, servers: list[SimNodeServer], key_path: Path | None, opts: dict) -> None:
        if key_path is None:
            raise CommandError("registering needs the generated user key; drop --authorized-key")
        try:
            if opts["register_site"]:
                site = find_by_code(Site.objects.all(), opts["register_site"], "site")
            else:
                pilot = find_by_code(Pilot.objects.all(), opts["pilot"], "pilot", name_field="name")
                site, _ = Site.objects.get_or_create(pilot=pilot, name="Simulated site",
                                                     defaults={"queue": f"sim-{str(pilot.code)[:8]}"})
        except CodeNotFound as error:
            raise CommandError(str(error)) from None
        with transaction.atomic():
            credential = create_credential(site, f"simnode key ({key_path.parent.name})", key_path.read_text())
            nodes = []
            for server in servers:
                node, _ = Node.objects.update_or_create(
                    site=site, name=server.name,
                    defaults={"host": "127.0.0.1", "port": server.port, "username": server.username,
                              "credential": credential, "simulated": True, "role": Node.Role.GPU})
                nodes.append(node)
        self.stdout.write(f"registered {len(nodes)} simulated nodes in site {site.name} ({site.code})")
        if not opts["accept_host_keys"]:
            self.stdout.write("host keys are not accepted yet: compare the fingerprints above, then "
                              "manage.py accept_host_key NODE_CODE FINGERPRINT (or pass --accept-host-keys)")
            return
        for node, server in zip(nodes, servers, strict=True):
            # the key is read from the server's own file here, so no network answer is trusted
            key = server.host_key
            Node.objects.filter(pk=node.pk).update(pending_host_key_type=key.get_name(), pending_host_key=key.get_base64(),
                                                   pending_host_key_fingerprint=key.fingerprint)
            node.refresh_from_db()
            accept_host_key(node, key.fingerprint)
            self.stdout.write(f"{node.name}: host key {server.fingerprint} accepted")

    def wait(self, run_for: float | None) -> None:
        stop = threading.Event()
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: stop.set())
        deadline = time.monotonic() + run_for if run_for is not None else None
        while not stop.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                return
            stop.wait(0.2)
