"""The deployment settings of a pilot (Pilot.deployment): schema, defaults and a strict validator.

Every value here ends up on a node's command line or in a file a remote shell reads, so each is
checked against a narrow pattern before anything is sent; an error names the field that was wrong.
"""
from __future__ import annotations

import copy
import re
import shlex
from dataclasses import dataclass, field, replace
from typing import Any

from django.core.exceptions import ValidationError
from django.utils.translation import gettext as _

from runners.validators import validate_host, validate_nqn, validate_port, validate_vllm_flag

# `dram` is vLLM + LMCache with its DRAM tier only (no disk tier): the customer's alternative without FX (G4).
ARMS = ("recompute", "dram", "local_nvme", "fx")
# Default port offset of each arm from ports.base, so the servers of a run never collide.
ARM_PORT_OFFSETS = {"recompute": 0, "local_nvme": 1, "fx": 2, "dram": 3}
# The arms that run LMCache, and those of them with a disk tier (the device whose reads are counted).
LMCACHE_ARMS = ("dram", "local_nvme", "fx")
DISK_ARMS = ("local_nvme", "fx")
# LMCache's internal API server (loopback only): one port for its scheduler, then one per TP worker
# (LMCache 0.5.6 internal_api_server/api_server.py: port_start + 0 for the scheduler, + 1 + worker_id for a worker).
# Each arm gets a run of 1 + tensor_parallel_size ports from ports.lmcache_api, in the order of ARM_PORT_OFFSETS.
LMCACHE_API_PORT_DEFAULT = 7000
# LMCache's DRAM per TP rank (GiB, LMCache's max_local_cpu_size) when the settings name none: a production-shaped
# pool (tens of GiB per rank; 8 ranks take 256 GiB of host memory). The simulated default is far smaller
# (DEFAULT_SIMULATED), still above one cold-recovery retrieval of the default plan (runners.lmcache.sizing).
MAX_LOCAL_CPU_SIZE_DEFAULT = 32.0
_SHA256 = re.compile(r"^[0-9a-f]{64}$")

_HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
# Absolute or ~/-relative; letters, digits and . _ - + / only (no spaces, no shell metacharacters).
_PATH = re.compile(r"^(/|~/)[A-Za-z0-9._+/-]*$")
_IFNAME = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")
_FLAG = re.compile(r"^--[a-z0-9][a-z0-9-]{0,63}(=[A-Za-z0-9._:/,+@%-]{1,200})?$")
_FLAG_VALUE = re.compile(r"^[A-Za-z0-9._:/,+@%][A-Za-z0-9._:/,+@%-]{0,199}$")
# Flags the deploy step sets itself; letting the settings override them would break the arms.
_RESERVED_FLAGS = {"--port", "--host", "--tensor-parallel-size", "--kv-transfer-config", "--model"}
_FSTYPES = ("xfs", "ext4")
# vLLM's KV connectors the deploy step can configure: LMCache (the pilot's stack) or vLLM's reference
# ExampleConnector, which stores whole prompts' KV as files in the arm's cache directory (for checking the
# pipeline where LMCache cannot run, e.g. the CPU test tier; its files are not LMCache's tiers).
KV_CONNECTORS = ("LMCacheConnectorV1", "ExampleConnector")
# How vLLM is launched: from PATH, a venv, a conda environment, or behind a command prefix (`docker run …`).
LAUNCH_KINDS = ("venv", "conda", "prefix")
_CONDA_ENV = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_WORD = re.compile(r"^[A-Za-z0-9._:/,+@%=-][A-Za-z0-9._:/,+@%=-]{0,299}$")
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,63}$")
_ENV_VALUE = re.compile(r"^[A-Za-z0-9._:/,+@%=-]{0,500}$")
# Variables the deploy step sets itself, or that would make the shell or the dynamic loader run other code.
_RESERVED_ENV = {"VLLM_SERVER_DEV_MODE", "PROMETHEUS_MULTIPROC_DIR", "PATH", "HOME", "SHELL", "IFS", "ENV", "BASH_ENV",
                 "PROMPT_COMMAND", "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "PYTHONPATH", "PYTHONSTARTUP",
                 "PYTHONHOME", "PYTHONINSPECT", "VIRTUAL_ENV", "CONDA_PREFIX", "VLLM_PLUGINS",
                 "PYTHONHASHSEED"}
_RESERVED_ENV_PREFIXES = ("LMCACHE_", "FXPILOT_", "BASH_FUNC_")
# The deploy step has an hour (runners.steps); the health wait gets at most 50 minutes of it, so a slow start is
# refused as too slow by the wait itself, with the server log's tail, not cut off by the step's time limit.
DEPLOY_TIME_LIMIT_S = 3600
HEALTH_TIMEOUT_MAX_S = 3000
# Once G1 has measured a node's cold start of the planned model (first start, compile caches empty), every later
# deploy on that node waits max(COLD_START_FLOOR_S, COLD_START_FACTOR × that cold start) for /health, at most
# HEALTH_TIMEOUT_MAX_S, instead of the fixed `health_timeout_s` (which stays the wait before G1 measured, and G1's
# own wait). A later start may be a cold one again (the default compile caches may be empty), so the factor is on
# the cold start; the floor keeps a quick start (a small model, a simulated node) from a wait a busy node misses.
COLD_START_FACTOR = 2
COLD_START_FLOOR_S = 300
# A prefix word that sets a variable: `env NAME=value`, `docker run -e NAME=value`, `-eNAME=value`, `--env=NAME=value`.
_PREFIX_ASSIGNMENT = re.compile(r"^(?:--env=|-e)?([A-Za-z_][A-Za-z0-9_]*)=")


def _reserved_env(name: str) -> bool:
    return name in _RESERVED_ENV or name.startswith(_RESERVED_ENV_PREFIXES)


class DeploymentSettingsError(ValueError):
    """A deployment setting that cannot be used; `field` is its dotted path (e.g. fx_target.address)."""

    def __init__(self, field_name: str, message: str):
        self.field = field_name
        super().__init__(f"deployment.{field_name}: {message}")


@dataclass(frozen=True)
class Ports:
    base: int = 8000
    arms: dict[str, int] = field(default_factory=dict)
    lmcache_api: int = LMCACHE_API_PORT_DEFAULT

    def lmcache_api_start(self, arm: str, tensor_parallel_size: int) -> int:
        """LMCache's internal_api_server_port_start of an arm (its scheduler's port; worker w listens on start + 1 +
        w); 0 means a free run of ports the node picks (ports.base 0: simulated nodes share a loopback)."""
        if self.base == 0:
            return 0
        return self.lmcache_api + ARM_PORT_OFFSETS.get(arm, 0) * (1 + tensor_parallel_size)

    def for_arm(self, arm: str) -> int:
        """The port of an arm's server; 0 means a free port the node picks (simulated nodes share a loopback)."""
        if arm in self.arms:
            return self.arms[arm]
        if self.base == 0:
            return 0
        return self.base + ARM_PORT_OFFSETS.get(arm, 0)


@dataclass(frozen=True)
class Paths:
    fx_mount: str = "/mnt/fx"
    local_nvme_path: str = "/mnt/nvme0/fxpilot"
    shared_pool: str = "/mnt/fx/fxpilot-shared"
    run_root: str = "~/fxpilot-runs"


@dataclass(frozen=True)
class Sizes:
    chunk_size: int = 256
    max_local_cpu_size: float = MAX_LOCAL_CPU_SIZE_DEFAULT
    max_local_disk_size: float = 200.0


@dataclass(frozen=True)
class LMCacheSettings:
    """`lmcache`: the build the signed plan expects (`fingerprint`: the SHA-256 of runners/remote/lmcache_inspect.py's
    fingerprint, or None: recorded, not compared) and LMCache's disk I/O threads (`disk_io_threads`: None keeps
    LMCache's own default, which the fingerprint records)."""

    fingerprint: str | None = None
    disk_io_threads: int | None = None


@dataclass(frozen=True)
class FxTarget:
    address: str
    nqn: str
    transport: str = "rdma"
    service_id: int = 4420
    host_nqn: str | None = None
    fstype: str = "xfs"


@dataclass(frozen=True)
class Launcher:
    """How `vllm` is run on a node: `kind` "" (from PATH), venv, conda or prefix; plus environment variables."""

    kind: str = ""
    venv: str | None = None
    conda: str | None = None
    prefix: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.kind == "venv":
            out["venv"] = self.venv
        elif self.kind == "conda":
            out["conda"] = self.conda
        elif self.kind == "prefix":
            out["prefix"] = list(self.prefix)
        if self.env:
            out["env"] = dict(self.env)
        return out

    def params(self) -> dict[str, Any]:
        """What deploy.sh reads (params.env)."""
        return {"LAUNCH_KIND": self.kind, "LAUNCH_VENV": self.venv, "LAUNCH_CONDA": self.conda,
                "LAUNCH_PREFIX": list(self.prefix), "LAUNCH_ENV": [f"{name}={value}" for name, value in self.env]}


@dataclass(frozen=True)
class DeploymentSettings:
    model: str
    fx_target: FxTarget
    tensor_parallel_size: int = 8
    ports: Ports = field(default_factory=Ports)
    paths: Paths = field(default_factory=Paths)
    sizes: Sizes = field(default_factory=Sizes)
    use_odirect: bool = True
    drop_page_cache: bool = False
    mkfs_if_empty: bool = False
    roce_interface: str | None = None
    extra_vllm_flags: tuple[str, ...] = ()
    health_timeout_s: int = 1800
    # node name → the address on the cluster fabric its servers listen on, so the other node's client can
    # reach them (G4's cross-instance sharing); a node not listed binds its servers to its loopback.
    fabric_addresses: dict[str, str] = field(default_factory=dict)
    lmcache: LMCacheSettings = field(default_factory=LMCacheSettings)

    def bind_address(self, node_name: str) -> str:
        return self.fabric_addresses.get(node_name, "127.0.0.1")
    launcher: Launcher = field(default_factory=Launcher)
    kv_connector: str = "LMCacheConnectorV1"
    # The real-engine test tier (tests/real) deploys vLLM's ExampleConnector on a real node: it says so here.
    # Anywhere else the deploy refuses that connector on real nodes, and the judge never takes it for LMCache.
    engine_test_tier: bool = False

    @property
    def page_cache_method(self) -> str:
        """How a disk hit is kept from being a DRAM hit, as the manifest states it."""
        return "+".join(name for name, on in (("odirect", self.use_odirect), ("drop_caches", self.drop_page_cache)) if on)

    def with_home(self, home: str) -> DeploymentSettings:
        """These settings with every `~/` path made absolute under the SSH user's home on the node."""
        if not home.startswith("/") or not _PATH.match(home):
            raise DeploymentSettingsError("paths", _("the node reported an unusable home directory %(home)r") % {"home": home})

        def expand(value: str) -> str:
            return home.rstrip("/") + value[1:] if value.startswith("~/") else value

        paths = Paths(**{name: expand(getattr(self.paths, name)) for name in ("fx_mount", "local_nvme_path", "shared_pool",
                                                                                 "run_root")})
        launcher = self.launcher
        if launcher.kind == "venv" and launcher.venv:
            launcher = replace(launcher, venv=expand(launcher.venv))
        return replace(self, paths=paths, model=expand(self.model), launcher=launcher)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "tensor_parallel_size": self.tensor_parallel_size,
            "ports": {"base": self.ports.base, "arms": dict(self.ports.arms),
                      **({"lmcache_api": self.ports.lmcache_api}
                         if self.ports.lmcache_api != LMCACHE_API_PORT_DEFAULT else {})},
            "paths": {"fx_mount": self.paths.fx_mount, "local_nvme_path": self.paths.local_nvme_path,
                      "shared_pool": self.paths.shared_pool, "run_root": self.paths.run_root},
            "sizes": {"chunk_size": self.sizes.chunk_size, "max_local_cpu_size": self.sizes.max_local_cpu_size,
                      "max_local_disk_size": self.sizes.max_local_disk_size},
            "use_odirect": self.use_odirect,
            "drop_page_cache": self.drop_page_cache,
            "fx_target": {"transport": self.fx_target.transport, "address": self.fx_target.address,
                          "service_id": self.fx_target.service_id, "nqn": self.fx_target.nqn,
                          "host_nqn": self.fx_target.host_nqn, "fstype": self.fx_target.fstype},
            "mkfs_if_empty": self.mkfs_if_empty,
            "roce_interface": self.roce_interface,
            "extra_vllm_flags": list(self.extra_vllm_flags),
            "health_timeout_s": self.health_timeout_s,
            **({"fabric_addresses": dict(self.fabric_addresses)} if self.fabric_addresses else {}),
            "launcher": self.launcher.to_dict(),
            "kv_connector": self.kv_connector,
            **({"engine_test_tier": True} if self.engine_test_tier else {}),
            **({"lmcache": {key: value for key, value in (("fingerprint", self.lmcache.fingerprint),
                                                          ("disk_io_threads", self.lmcache.disk_io_threads)) if value}}
               if (self.lmcache.fingerprint or self.lmcache.disk_io_threads) else {}),
        }


@dataclass(frozen=True)
class HealthTimeout:
    """How long a deploy waits for /health, and why: `basis` is "fixed" (the setting `health_timeout_s`: nothing
    measured yet, or `why` says the measurement is not for these settings), "measured" (COLD_START_FACTOR × the cold
    start G1 measured), "floor" (COLD_START_FLOOR_S, above that product) or "cap" (HEALTH_TIMEOUT_MAX_S, below it).
    `cold_start_s` is the measured cold start at the deploy's time scale."""

    seconds: int
    basis: str
    cold_start_s: float | None = None
    why: str = ""           # with basis "fixed": "not-measured", "cold-start" (this deploy measures it), "other-model"

    @property
    def sentence(self) -> str:
        """The wait in one English sentence, for the run's live log (the node page says it in the reader's words)."""
        if self.basis == "fixed":
            reason = {"cold-start": "this start is the cold start G1 measures",
                      "other-model": "the cold start G1 measured was of another model or tensor-parallel size",
                      }.get(self.why, "G1 has not measured this node's cold start")
            return f"{self.seconds} s (deployment.health_timeout_s: {reason})"
        product = f"{COLD_START_FACTOR} × the measured cold start of {self.cold_start_s:.1f} s"
        if self.basis == "floor":
            return f"{self.seconds} s (the floor; {product} is less)"
        if self.basis == "cap":
            return f"{self.seconds} s (the most a deploy may wait; {product} is more)"
        return f"{self.seconds} s ({product})"


def health_timeout(settings: DeploymentSettings, cold_start: dict | None, *, time_scale: float | None = None,
                   measuring: bool = False) -> HealthTimeout:
    """The /health wait of a deploy with these settings on a node whose measured cold start is `cold_start` (the
    Node's record: seconds, model, tensor_parallel_size, time_scale). A measurement counts only for the model and
    tensor-parallel size it was made with; a simulated node's, made at one time scale, is rescaled to the deploy's."""
    fixed = settings.health_timeout_s
    if measuring:
        return HealthTimeout(fixed, "fixed", why="cold-start")
    seconds = (cold_start or {}).get("seconds")
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds <= 0:
        return HealthTimeout(fixed, "fixed", why="not-measured")
    if (cold_start.get("model"), cold_start.get("tensor_parallel_size")) != (settings.model,
                                                                            settings.tensor_parallel_size):
        return HealthTimeout(fixed, "fixed", why="other-model")
    measured_scale = cold_start.get("time_scale")
    if isinstance(measured_scale, (int, float)) and measured_scale > 0 and time_scale:
        seconds = seconds * float(time_scale) / float(measured_scale)
    wanted = int(-(-COLD_START_FACTOR * seconds // 1))  # whole seconds, rounded up
    if wanted > HEALTH_TIMEOUT_MAX_S:
        return HealthTimeout(HEALTH_TIMEOUT_MAX_S, "cap", cold_start_s=seconds)
    if wanted < COLD_START_FLOOR_S:
        return HealthTimeout(COLD_START_FLOOR_S, "floor", cold_start_s=seconds)
    return HealthTimeout(wanted, "measured", cold_start_s=seconds)


def shell_env_file(values: dict[str, Any]) -> str:
    """A file bash sources: every value shell-quoted, lists as bash arrays."""
    lines = []
    for key, value in values.items():
        if not re.fullmatch(r"[A-Z][A-Z0-9_]*", key):
            raise ValueError(f"bad variable name {key!r}")
        if isinstance(value, (list, tuple)):
            lines.append(f"{key}=(" + " ".join(shlex.quote(str(item)) for item in value) + ")")
        else:
            text = "1" if value is True else "0" if value is False else "" if value is None else str(value)
            if any(ch in text for ch in "\x00\n\r"):
                raise ValueError(f"{key}: a line break or NUL cannot reach the node")
            lines.append(f"{key}={shlex.quote(text)}")
    return "\n".join(lines) + "\n"


# Settings for a simulated site: paths inside each node's sandbox, any free port (the nodes share a loopback).
DEFAULT_SIMULATED: dict[str, Any] = {
    "model": "Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8",
    "tensor_parallel_size": 8,
    "ports": {"base": 0},
    "paths": {"fx_mount": "~/mnt/fx", "local_nvme_path": "~/mnt/nvme0/fxpilot", "shared_pool": "~/mnt/fx/fxpilot-shared",
              "run_root": "~/fxpilot-runs"},
    # 1 GiB of LMCache DRAM per rank: small, so that the simulated DRAM tier holds about one 48 Ki-token session and
    # FX sees what DRAM misses, and above one cold-recovery retrieval of the default plan (0.73 GiB per rank) plus
    # the sizing margin (runners.lmcache.SIZING_MARGIN), which the deploy refuses below.
    "sizes": {"chunk_size": 256, "max_local_cpu_size": 1.0, "max_local_disk_size": 200.0},
    "use_odirect": True,
    "drop_page_cache": False,
    "fx_target": {"transport": "rdma", "address": "192.168.100.10", "service_id": 4420,
                  "nqn": "nqn.2026-01.com.example.fx:fx100.pool0"},
    "mkfs_if_empty": False,
    "roce_interface": "ens1f0np0",
    "extra_vllm_flags": [],
    "health_timeout_s": 120,
}

_TOP_KEYS = {"model", "tensor_parallel_size", "ports", "paths", "sizes", "use_odirect", "drop_page_cache", "fx_target",
             "mkfs_if_empty", "roce_interface", "extra_vllm_flags", "health_timeout_s", "fabric_addresses", "launcher",
             "kv_connector", "engine_test_tier", "lmcache"}


def default_simulated() -> dict[str, Any]:
    return copy.deepcopy(DEFAULT_SIMULATED)


def validate_deployment(data: dict[str, Any] | None) -> DeploymentSettings:
    """Check every value of a pilot's deployment settings; raise DeploymentSettingsError naming the first bad field."""
    if not isinstance(data, dict) or not data:
        raise DeploymentSettingsError("", _("the pilot has no deployment settings; fill them in before deploying"))
    _no_unknown(data, _TOP_KEYS, "")
    model = _model(_required(data, "model", ""))
    tp = _int(data.get("tensor_parallel_size", 8), "tensor_parallel_size", 1, 64)
    ports = _ports(_mapping(data.get("ports", {}), "ports"), tp)
    paths = _paths(_mapping(data.get("paths", {}), "paths"))
    sizes = _sizes(_mapping(data.get("sizes", {}), "sizes"))
    use_odirect = _bool(data.get("use_odirect", True), "use_odirect")
    drop_page_cache = _bool(data.get("drop_page_cache", False), "drop_page_cache")
    if not (use_odirect or drop_page_cache):
        raise DeploymentSettingsError("use_odirect", _("turn on use_odirect or drop_page_cache, or a disk hit may be "
                                                       "served from the page cache and measure DRAM instead of disk"))
    fx_target = _fx_target(_mapping(_required(data, "fx_target", ""), "fx_target"))
    roce = data.get("roce_interface")
    if roce is not None and (not isinstance(roce, str) or not _IFNAME.match(roce)):
        raise DeploymentSettingsError("roce_interface", _("%(value)r is not a network interface name") % {"value": roce})
    return DeploymentSettings(
        model=model, fx_target=fx_target, tensor_parallel_size=tp, ports=ports, paths=paths, sizes=sizes,
        use_odirect=use_odirect, drop_page_cache=drop_page_cache,
        mkfs_if_empty=_bool(data.get("mkfs_if_empty", False), "mkfs_if_empty"),
        roce_interface=roce, extra_vllm_flags=_flags(data.get("extra_vllm_flags", [])),
        health_timeout_s=_int(data.get("health_timeout_s", 1800), "health_timeout_s", 1, HEALTH_TIMEOUT_MAX_S),
        fabric_addresses=_fabric_addresses(_mapping(data.get("fabric_addresses", {}), "fabric_addresses")),
        launcher=_launcher(_mapping(data.get("launcher") or {}, "launcher")),
        kv_connector=_kv_connector(data.get("kv_connector", "LMCacheConnectorV1")),
        engine_test_tier=_bool(data.get("engine_test_tier", False), "engine_test_tier"),
        lmcache=_lmcache(_mapping(data.get("lmcache") or {}, "lmcache")),
    )


def _lmcache(data: dict) -> LMCacheSettings:
    _no_unknown(data, {"fingerprint", "disk_io_threads"}, "lmcache.")
    fingerprint = data.get("fingerprint")
    if fingerprint is not None and (not isinstance(fingerprint, str) or not _SHA256.match(fingerprint)):
        raise DeploymentSettingsError("lmcache.fingerprint", _("%(value)r is not a SHA-256 (64 lower-case hex digits)")
                                      % {"value": fingerprint})
    threads = data.get("disk_io_threads")
    if threads is not None:
        threads = _int(threads, "lmcache.disk_io_threads", 1, 256)
    return LMCacheSettings(fingerprint=fingerprint, disk_io_threads=threads)


_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def _fabric_addresses(data: dict) -> dict[str, str]:
    """node name → an IP address literal the node's servers can listen on (not a wildcard, not multicast)."""
    import ipaddress

    out = {}
    for name, value in data.items():
        if not isinstance(name, str) or not _NODE_NAME.match(name):
            raise DeploymentSettingsError("fabric_addresses", _("%(name)r is not a node name") % {"name": name})
        try:
            address = ipaddress.ip_address(value if isinstance(value, str) else "")
        except ValueError:
            raise DeploymentSettingsError(f"fabric_addresses.{name}", _("%(value)r is not an IP address") %
                                          {"value": value}) from None
        if address.is_unspecified or address.is_multicast or getattr(address, "scope_id", None):
            raise DeploymentSettingsError(f"fabric_addresses.{name}", _("%(value)s cannot be listened on: give the "
                                                                        "node's own address on the fabric") %
                                          {"value": value})
        out[name] = str(address)
    return out


def _kv_connector(value: Any) -> str:
    if value not in KV_CONNECTORS:
        raise DeploymentSettingsError("kv_connector", _("%(value)r is not a KV connector the deploy step configures "
                                                        "(%(known)s)") % {"value": value, "known": ", ".join(KV_CONNECTORS)})
    return value


def _launcher(data: dict) -> Launcher:
    """`launcher`: at most one of venv (a path), conda (an environment name or path), prefix (a command's words,
    e.g. `docker run … IMAGE`), and `env` (variables for vLLM). Each word reaches the node shell-quoted."""
    _no_unknown(data, {"venv", "conda", "prefix", "env"}, "launcher.")
    kinds = [kind for kind in LAUNCH_KINDS if data.get(kind) not in (None, "", [])]
    if len(kinds) > 1:
        raise DeploymentSettingsError(f"launcher.{kinds[1]}", _("give one of venv, conda or prefix, not %(kinds)s")
                                      % {"kinds": " and ".join(kinds)})
    kind = kinds[0] if kinds else ""
    venv = conda = None
    prefix: tuple[str, ...] = ()
    if kind == "venv":
        venv = _path(data["venv"], "launcher.venv")
    elif kind == "conda":
        value = data["conda"]
        if isinstance(value, str) and value.startswith(("/", "~/")):
            conda = _path(value, "launcher.conda")
        elif isinstance(value, str) and _CONDA_ENV.match(value):
            conda = value
        else:
            raise DeploymentSettingsError("launcher.conda", _("%(value)r is neither a conda environment name (letters, "
                                                              "digits, . _ -) nor an absolute path") % {"value": value})
    elif kind == "prefix":
        words = data["prefix"]
        if not isinstance(words, list) or not 1 <= len(words) <= 64:
            raise DeploymentSettingsError("launcher.prefix", _("must be a list of 1–64 words, e.g. [docker, run, --rm, "
                                                               "--network=host, IMAGE]"))
        for index, word in enumerate(words):
            if not isinstance(word, str) or not _WORD.match(word):
                raise DeploymentSettingsError(f"launcher.prefix[{index}]", _("%(value)r is not a word of letters, digits "
                                                                             "and . _ : / , + @ %% = -") % {"value": word})
            assigned = _PREFIX_ASSIGNMENT.match(word)
            if assigned and _reserved_env(assigned.group(1).upper()):
                raise DeploymentSettingsError(f"launcher.prefix[{index}]", _(
                    "%(value)r sets %(name)s, which the deploy step sets itself or which would let the shell or the "
                    "loader run other code") % {"value": word, "name": assigned.group(1)})
        prefix = tuple(words)
    env = _mapping(data.get("env") or {}, "launcher.env")
    pairs = []
    for name, value in sorted(env.items()):
        where = f"launcher.env.{name}"
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise DeploymentSettingsError(where, _("is not an environment variable name (A–Z, 0–9, _)"))
        if _reserved_env(name):
            raise DeploymentSettingsError(where, _("is set by the deploy step itself or would let the shell or the "
                                                   "loader run other code"))
        if isinstance(value, bool) or not isinstance(value, (str, int, float)) or not _ENV_VALUE.match(str(value)):
            raise DeploymentSettingsError(where, _("%(value)r is not a value of letters, digits and . _ : / , + @ %% = -")
                                          % {"value": value})
        pairs.append((name, str(value)))
    return Launcher(kind=kind, venv=venv, conda=conda, prefix=prefix, env=tuple(pairs))


def _required(data: dict, key: str, prefix: str) -> Any:
    if data.get(key) in (None, ""):
        raise DeploymentSettingsError(prefix + key, _("is required"))
    return data[key]


def _mapping(value: Any, name: str) -> dict:
    if not isinstance(value, dict):
        raise DeploymentSettingsError(name, _("must be a mapping of settings, not %(type)s") % {"type": type(value).__name__})
    return value


def _no_unknown(data: dict, known: set[str], prefix: str) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise DeploymentSettingsError(prefix + unknown[0], _("is not a known setting (known: %(known)s)")
                                      % {"known": ", ".join(sorted(known))})


def _int(value: Any, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise DeploymentSettingsError(name, _("%(value)r is not a whole number") % {"value": value})
    if not low <= value <= high:
        raise DeploymentSettingsError(name, _("%(value)s is outside %(low)s–%(high)s") % {"value": value, "low": low, "high": high})
    return value


def _number(value: Any, name: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise DeploymentSettingsError(name, _("%(value)r is not a number") % {"value": value})
    if not low < value <= high:
        raise DeploymentSettingsError(name, _("%(value)s is outside (%(low)s, %(high)s]") % {"value": value, "low": low, "high": high})
    return float(value)


def _bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise DeploymentSettingsError(name, _("%(value)r is not true or false") % {"value": value})
    return value


def _path(value: Any, name: str) -> str:
    if not isinstance(value, str) or not _PATH.match(value) or len(value) > 1024:
        raise DeploymentSettingsError(name, _("%(value)r is not an absolute or ~/ path of letters, digits and . _ - + /")
                                      % {"value": value})
    if any(part == ".." for part in value.split("/")):
        raise DeploymentSettingsError(name, _("%(value)r holds a .. component") % {"value": value})
    if value in ("/", "~/"):
        raise DeploymentSettingsError(name, _("%(value)r is a root directory, not a place for the pilot's files") % {"value": value})
    return value.rstrip("/")


def _model(value: Any) -> str:
    if isinstance(value, str) and _HF_ID.match(value) and ".." not in value:
        return value
    if isinstance(value, str) and value.startswith(("/", "~/")):
        return _path(value, "model")
    raise DeploymentSettingsError("model", _("%(value)r is neither a Hugging Face id (org/name) nor an absolute or ~/ path")
                                  % {"value": value})


def _ports(data: dict, tensor_parallel_size: int = 8) -> Ports:
    _no_unknown(data, {"base", "arms", "lmcache_api"}, "ports.")
    base = data.get("base", 8000)
    if base != 0:
        base = _port(base, "ports.base")
        if base + max(ARM_PORT_OFFSETS.values()) > 65535:
            raise DeploymentSettingsError("ports.base", _("%(value)s leaves no room for the arms' ports") % {"value": base})
    api = _port(data.get("lmcache_api", LMCACHE_API_PORT_DEFAULT), "ports.lmcache_api")
    if api + len(ARM_PORT_OFFSETS) * (1 + tensor_parallel_size) > 65536:
        raise DeploymentSettingsError("ports.lmcache_api", _("%(value)s leaves no room for LMCache's API ports (1 + "
                                                             "tensor_parallel_size per arm)") % {"value": api})
    arms = _mapping(data.get("arms", {}), "ports.arms")
    for arm, port in arms.items():
        if arm not in ARMS:
            raise DeploymentSettingsError(f"ports.arms.{arm}", _("is not an arm (arms: %(arms)s)") % {"arms": ", ".join(ARMS)})
        _port(port, f"ports.arms.{arm}")
    return Ports(base=base, arms=dict(arms), lmcache_api=api)


def _port(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise DeploymentSettingsError(name, _("%(value)r is not a port number") % {"value": value})
    try:
        validate_port(value)
    except ValidationError as exc:
        raise DeploymentSettingsError(name, " ".join(exc.messages)) from None
    if value < 1024:
        raise DeploymentSettingsError(name, _("%(value)s is a privileged port; use 1024–65535") % {"value": value})
    return value


def _paths(data: dict) -> Paths:
    _no_unknown(data, {"fx_mount", "local_nvme_path", "shared_pool", "run_root"}, "paths.")
    defaults = Paths()
    values = {name: _path(data.get(name, getattr(defaults, name)), f"paths.{name}")
              for name in ("fx_mount", "local_nvme_path", "shared_pool", "run_root")}
    if not values["shared_pool"].startswith(values["fx_mount"] + "/"):
        raise DeploymentSettingsError("paths.shared_pool", _("%(pool)s is not on the FX mount %(mount)s; every instance must "
                                                             "see the shared pool") % {"pool": values["shared_pool"],
                                                                                       "mount": values["fx_mount"]})
    if _under(values["local_nvme_path"], values["fx_mount"]) or _under(values["fx_mount"], values["local_nvme_path"]):
        raise DeploymentSettingsError("paths.local_nvme_path", _("%(local)s and the FX mount %(mount)s overlap; the two cache "
                                                                 "arms must differ in where the files live")
                                      % {"local": values["local_nvme_path"], "mount": values["fx_mount"]})
    return Paths(**values)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")


def _sizes(data: dict) -> Sizes:
    _no_unknown(data, {"chunk_size", "max_local_cpu_size", "max_local_disk_size"}, "sizes.")
    chunk = _int(data.get("chunk_size", 256), "sizes.chunk_size", 16, 8192)
    cpu = _number(data.get("max_local_cpu_size", MAX_LOCAL_CPU_SIZE_DEFAULT), "sizes.max_local_cpu_size", 0.0, 4096.0)
    disk = _number(data.get("max_local_disk_size", 200.0), "sizes.max_local_disk_size", 0.0, 1_000_000.0)
    if cpu >= disk:
        raise DeploymentSettingsError("sizes.max_local_cpu_size", _("%(cpu)s GB is not smaller than the disk tier (%(disk)s GB): "
                                                                    "recovery would be served from DRAM and never read the disk")
                                      % {"cpu": cpu, "disk": disk})
    return Sizes(chunk_size=chunk, max_local_cpu_size=cpu, max_local_disk_size=disk)


def _fx_target(data: dict) -> FxTarget:
    _no_unknown(data, {"transport", "address", "service_id", "nqn", "host_nqn", "fstype"}, "fx_target.")
    transport = data.get("transport", "rdma")
    if transport != "rdma":
        raise DeploymentSettingsError("fx_target.transport", _("%(value)r is not supported; the FX array is attached over "
                                                               "NVMe-oF RDMA (RoCEv2)") % {"value": transport})
    address = _required(data, "address", "fx_target.")
    try:
        address = validate_host(address if isinstance(address, str) else "")
    except ValidationError as exc:
        raise DeploymentSettingsError("fx_target.address", " ".join(exc.messages)) from None
    service_id = data.get("service_id", 4420)
    if isinstance(service_id, bool) or not isinstance(service_id, int):
        raise DeploymentSettingsError("fx_target.service_id", _("%(value)r is not a port number") % {"value": service_id})
    try:
        validate_port(service_id)
    except ValidationError as exc:
        raise DeploymentSettingsError("fx_target.service_id", " ".join(exc.messages)) from None
    nqn = _nqn(_required(data, "nqn", "fx_target."), "fx_target.nqn")
    host_nqn = data.get("host_nqn")
    if host_nqn is not None:
        host_nqn = _nqn(host_nqn, "fx_target.host_nqn")
    fstype = data.get("fstype", "xfs")
    if fstype not in _FSTYPES:
        raise DeploymentSettingsError("fx_target.fstype", _("%(value)r is not one of %(known)s") % {"value": fstype,
                                                                                                  "known": ", ".join(_FSTYPES)})
    return FxTarget(address=address, nqn=nqn, service_id=service_id, host_nqn=host_nqn, fstype=fstype)


def _nqn(value: Any, name: str) -> str:
    # The NQN grammar allows any printable character after the colon; the shell-safe subset is all a target needs.
    if not isinstance(value, str) or not re.match(r"^[A-Za-z0-9.:_-]+$", value):
        raise DeploymentSettingsError(name, _("%(value)r is not an NVMe qualified name of letters, digits and . : _ -")
                                      % {"value": value})
    try:
        return validate_nqn(value)
    except ValidationError as exc:
        raise DeploymentSettingsError(name, " ".join(exc.messages)) from None


def _flags(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise DeploymentSettingsError("extra_vllm_flags", _("must be a list of strings"))
    previous_was_flag = False
    for index, item in enumerate(value):
        name = f"extra_vllm_flags[{index}]"
        if not isinstance(item, str):
            raise DeploymentSettingsError(name, _("%(value)r is not a string") % {"value": item})
        if item.startswith("--"):
            if not _FLAG.match(item):
                raise DeploymentSettingsError(name, _("%(value)r is not an allowed flag (--name or --name=value of letters, "
                                                      "digits and . _ : / , + @ %% -)") % {"value": item})
            if item.split("=", 1)[0] in _RESERVED_FLAGS:
                raise DeploymentSettingsError(name, _("%(value)s is set by the deploy step itself") % {"value": item})
            try:
                validate_vllm_flag(item)
            except ValidationError as exc:
                raise DeploymentSettingsError(name, " ".join(exc.messages)) from None
            previous_was_flag = "=" not in item
        elif previous_was_flag and _FLAG_VALUE.match(item):
            previous_was_flag = False
        else:
            raise DeploymentSettingsError(name, _("%(value)r is neither a --flag nor a plain value following one")
                                          % {"value": item})
    return tuple(value)
