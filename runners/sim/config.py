"""The simulated server's configuration, read the way vLLM and LMCache read theirs.

LMCache: ``LMCACHE_CONFIG_FILE`` (YAML) and ``LMCACHE_<KEY>`` environment variables (these win),
keys as in LMCache's ``lmcache/v1/config.py``. vLLM: the ``vllm serve`` command line. The node:
``$FXPILOT_SIM_ROOT/state.json`` (docs/contracts.md §5) for the time scale, where FX is mounted and
the faults. Every error says what was wrong and where.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from runners.simnode import state as node_state

# libyaml's safe loader where PyYAML has it: the same documents, ten times as fast (gates.plan)
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class ConfigError(Exception):
    """A configuration the server refuses to start with; the message names the key and the source."""


# LMCache keys (lmcache/v1/config.py _CONFIG_DEFINITIONS of 0.5.6, and a few of older versions) with their
# defaults; the simulator acts on chunk_size, local_cpu, max_local_cpu_size, local_disk, max_local_disk_size,
# remote_url, remote_storage_plugins, save_unfull_chunk, pre_caching_hash_algorithm, the internal_api_server_* keys
# and extra_config, and accepts the others unchanged.
LMCACHE_DEFAULTS: dict = {
    "chunk_size": 256, "local_cpu": True, "max_local_cpu_size": 5.0, "local_disk": None,
    "max_local_disk_size": 0.0, "local_disk_path_sharding": "by_gpu", "remote_url": None,
    "remote_serde": "naive", "remote_storage_plugins": None, "save_unfull_chunk": False,
    "blocking_timeout_secs": 10, "cache_policy": "LRU", "enable_async_loading": False,
    "min_retrieve_tokens": 0, "lookup_timeout_ms": 3000, "use_layerwise": False, "gds_path": None,
    "use_gds": True, "gds_backend": "cufile", "extra_config": None, "internal_api_server_enabled": False,
    "internal_api_server_port_start": 6999, "save_decode_cache": False, "pre_caching_hash_algorithm": "builtin",
    "enable_controller": False, "lmcache_instance_id": "lmcache_default_instance", "controller_url": None,
    "lmcache_worker_port": None, "enable_p2p": False, "lookup_url": None, "distributed_url": None,
    "error_handling": False, "enable_pd": False, "pd_role": None, "cufile_buffer_size": None,
    "priority_limit": None, "numa_mode": None, "enable_blending": False, "log_level": "INFO",
    "py_enable_gc": True, "cache_ttl_secs": None, "external_lookup_client": None,
    # the rest of LMCache 0.5.6's keys (lmcache/v1/config.py), accepted unchanged
    "local_cpu_use_hugepages": False, "reserve_local_cpu_size": 0.0, "blend_recompute_ratios": None,
    "blend_thresholds": None, "blend_check_layers": None, "blend_min_tokens": 256, "blend_special_str": " # # ",
    "retrieve_locations": None, "store_location": None, "p2p_host": None, "p2p_init_ports": None,
    "p2p_lookup_ports": None, "mp_host": None, "mp_port": 5555, "controller_pull_url": None,
    "controller_reply_url": None, "lmcache_worker_ports": None, "lmcache_worker_ids": None,
    "lmcache_worker_heartbeat_delay_time": 10, "lmcache_worker_heartbeat_time": None, "pd_buffer_size": None,
    "pd_buffer_device": None, "pd_peer_host": None, "pd_peer_init_port": None, "pd_peer_alloc_port": None,
    "pd_peer_query_port": None, "pd_proxy_host": None, "pd_proxy_port": None, "pd_allocation_timeout_sec": None,
    "pd_shutdown_timeout_sec": 5.0, "pd_condition_poll_interval_sec": 0.005, "pd_max_prefill_len": 0,
    "pd_backend_mode": "async", "pd_skip_proxy_notification": False, "pd_bidirectional": False,
    "transfer_channel": None, "nixl_backends": None, "nixl_buffer_size": None, "nixl_buffer_device": None,
    "gds_path_sharding": "by_gpu", "gds_buffer_size": None, "maru_path": None, "maru_pool_size": 4.0,
    "audit_actual_remote_url": None, "internal_api_server_host": "127.0.0.1",
    "internal_api_server_include_index_list": None, "internal_api_server_socket_path_prefix": None,
    "runtime_plugin_locations": None, "storage_plugins": None, "hit_miss_ratio": None,
    "lookup_server_worker_ids": None, "enable_scheduler_bypass_lookup": False, "script_allowed_imports": None,
    "run_script_api_enabled": False, "enable_lazy_memory_allocator": False, "lazy_memory_initial_ratio": 0.2,
    "lazy_memory_expand_trigger_ratio": 0.5, "lazy_memory_step_ratio": 0.1, "lazy_memory_safe_size": 0.0,
    "enable_chunk_statistics": False, "chunk_statistics_auto_start_statistics": False,
    "chunk_statistics_auto_exit_timeout_hours": 0.0, "chunk_statistics_auto_exit_target_unique_chunks": 0,
    "chunk_statistics_strategy": "memory_bloom_filter", "enable_kv_events": False, "use_gpu_connector_v3": False,
    "pin_timeout_sec": 300, "pin_check_interval_sec": 30, "remote_config_url": None, "app_id": None,
    "enable_hidden_state_cache": False, "max_hidden_state_cpu_size": 2.0, "hidden_state_layers": None,
    "hidden_states_retrieve_mode": "prefix_strict",
}
ENV_NOT_KEYS = {"CONFIG_FILE", "LOG_LEVEL", "TRACK_USAGE", "USE_EXPERIMENTAL"}
BOOL_KEYS = {"local_cpu", "save_unfull_chunk", "enable_async_loading", "use_layerwise", "use_gds",
             "internal_api_server_enabled", "save_decode_cache", "enable_controller", "enable_p2p",
             "error_handling", "enable_pd", "enable_blending", "py_enable_gc"}
FLOAT_KEYS = {"max_local_cpu_size", "max_local_disk_size", "blocking_timeout_secs"}
INT_KEYS = {"chunk_size", "min_retrieve_tokens", "lookup_timeout_ms", "internal_api_server_port_start"}
CONNECTORS = {"LMCacheConnectorV1", "LMCacheConnectorV1Dynamic", "LMCacheMPConnector"}
ROLES = {"kv_both", "kv_producer", "kv_consumer"}


@dataclass
class LMCacheSettings:
    chunk_size: int = 256
    local_cpu: bool = True
    max_local_cpu_size: float = 5.0       # GiB per TP rank (each rank runs its own LMCache engine)
    local_disk: Path | None = None
    max_local_disk_size: float = 0.0      # GiB per TP rank
    fs_pool: Path | None = None
    save_unfull_chunk: bool = False
    use_odirect: bool = False
    parallel_read: bool = True            # the vendor's parallel-read patch (per-GPU cold read 5.23 vs 0.98)
    use_layerwise: bool = False           # LMCache's layerwise retrieval: its lines carry no size or throughput
    fs_use_odirect: bool = False          # extra_config.fs_connector_use_odirect (the fs pool's own key)
    disk_io_threads: int = 4              # extra_config.disk_io_threads (LMCache 0.5.6's default 4; recorded only)
    hash_algorithm: str = "builtin"       # pre_caching_hash_algorithm
    api_enabled: bool = False             # internal_api_server_enabled
    api_host: str = "127.0.0.1"           # internal_api_server_host
    api_port_start: int = 6999            # internal_api_server_port_start: the scheduler's port; worker i's is +1+i
    api_include: list[int] | None = None  # internal_api_server_include_index_list (0 = scheduler, 1+i = worker i)
    api_socket_prefix: str | None = None  # internal_api_server_socket_path_prefix: Unix sockets <prefix>_<port>
    source: str = "defaults"
    raw: dict = field(default_factory=dict)


def _as_bool(value, key: str, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in {"1", "true", "yes", "on"}:
        return True
    if text in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{where}: {key}={value!r} is not a boolean (true/false)")


def _as_number(value, key: str, where: str, kind: type):
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {key}={value!r} is not {'an integer' if kind is int else 'a number'}") from None
    if number < 0:
        raise ConfigError(f"{where}: {key}={value!r} must not be negative")
    return number


def _unknown(key: str, where: str) -> ConfigError:
    known = ", ".join(sorted(LMCACHE_DEFAULTS))
    return ConfigError(f"{where}: unknown LMCache configuration key {key!r}. Known keys: {known}")


def read_lmcache(environ: dict | None = None) -> LMCacheSettings:
    """LMCache settings from LMCACHE_CONFIG_FILE and LMCACHE_* variables; raises ConfigError."""
    environ = os.environ if environ is None else environ
    merged = dict(LMCACHE_DEFAULTS)
    origin = {key: "default" for key in merged}
    sources = []
    path = environ.get("LMCACHE_CONFIG_FILE")
    if path:
        file = Path(os.path.expanduser(path))
        try:
            loaded = yaml.load(file.read_text(), Loader=SAFE_LOADER) or {}
        except OSError as error:
            raise ConfigError(f"LMCACHE_CONFIG_FILE={path}: cannot read it ({error.strerror})") from None
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            line = f", line {mark.line + 1}" if mark else ""
            raise ConfigError(f"LMCACHE_CONFIG_FILE={path}{line}: not valid YAML ({error})") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"LMCACHE_CONFIG_FILE={path}: expected a mapping of keys, found {type(loaded).__name__}")
        for key, value in loaded.items():
            if key not in LMCACHE_DEFAULTS:
                raise _unknown(str(key), f"LMCACHE_CONFIG_FILE={path}")
            merged[key], origin[key] = value, f"LMCACHE_CONFIG_FILE={path}"
        sources.append(str(file))
    for name, value in sorted(environ.items()):
        if not name.startswith("LMCACHE_") or name[8:] in ENV_NOT_KEYS:
            continue
        key = name[8:].lower()
        if key not in LMCACHE_DEFAULTS:
            raise _unknown(key, f"environment variable {name}")
        if key == "extra_config" or key == "remote_storage_plugins":
            try:
                value = json.loads(value)
            except ValueError as error:
                raise ConfigError(f"environment variable {name}: not valid JSON ({error})") from None
        merged[key], origin[key] = value, f"environment variable {name}"
        sources.append(name)
    for key in BOOL_KEYS:
        merged[key] = _as_bool(merged[key], key, origin[key])
    for key in FLOAT_KEYS:
        merged[key] = _as_number(merged[key], key, origin[key], float)
    for key in INT_KEYS:
        merged[key] = _as_number(merged[key], key, origin[key], int)
    if merged["chunk_size"] <= 0:
        raise ConfigError(f"{origin['chunk_size']}: chunk_size must be a positive number of tokens")
    extra = merged["extra_config"] or {}
    if not isinstance(extra, dict):
        raise ConfigError(f"{origin['extra_config']}: extra_config must be a mapping, found {extra!r}")
    settings = LMCacheSettings(
        chunk_size=merged["chunk_size"], local_cpu=merged["local_cpu"],
        max_local_cpu_size=merged["max_local_cpu_size"], max_local_disk_size=merged["max_local_disk_size"],
        save_unfull_chunk=merged["save_unfull_chunk"], use_layerwise=merged["use_layerwise"],
        use_odirect=_as_bool(extra.get("use_odirect", False), "extra_config.use_odirect", origin["extra_config"]),
        parallel_read=_as_bool(extra.get("parallel_read", True), "extra_config.parallel_read", origin["extra_config"]),
        fs_use_odirect=_as_bool(extra.get("fs_connector_use_odirect", False), "extra_config.fs_connector_use_odirect",
                                origin["extra_config"]),
        disk_io_threads=_as_number(extra.get("disk_io_threads", 4), "extra_config.disk_io_threads",
                                   origin["extra_config"], int),
        hash_algorithm=str(merged["pre_caching_hash_algorithm"] or "builtin"),
        api_enabled=merged["internal_api_server_enabled"], api_host=str(merged["internal_api_server_host"]),
        api_port_start=merged["internal_api_server_port_start"],
        api_include=_int_list(merged["internal_api_server_include_index_list"],
                              "internal_api_server_include_index_list",
                              origin["internal_api_server_include_index_list"]),
        api_socket_prefix=merged["internal_api_server_socket_path_prefix"] or None,
        source=", ".join(sources) or "defaults", raw=merged)
    if settings.api_enabled and not settings.api_socket_prefix and not 0 < settings.api_port_start < 65536:
        raise ConfigError(f"{origin['internal_api_server_port_start']}: internal_api_server_port_start="
                          f"{settings.api_port_start} is not a TCP port")
    if merged["local_disk"]:
        settings.local_disk = _file_url(merged["local_disk"], "local_disk", origin["local_disk"])
        if settings.max_local_disk_size <= 0:
            raise ConfigError(f"{origin['local_disk']}: local_disk is set but max_local_disk_size is "
                              f"{settings.max_local_disk_size:g} GB; give the disk tier a size")
    plugins = merged["remote_storage_plugins"] or []
    if merged["remote_url"]:
        settings.fs_pool = _fs_url(str(merged["remote_url"]), origin["remote_url"])
    elif plugins:
        if plugins != ["fs"] and plugins != "fs":
            raise ConfigError(f"{origin['remote_storage_plugins']}: the simulator knows only the 'fs' plugin, "
                              f"not {plugins!r}")
        base = extra.get("remote_storage_plugin.fs.base_path")
        if not base:
            raise ConfigError(f"{origin['remote_storage_plugins']}: the fs plugin needs "
                              f"extra_config['remote_storage_plugin.fs.base_path']")
        settings.fs_pool = Path(os.path.expanduser(str(base).split(",")[0]))
    return settings


def _int_list(value, key: str, where: str) -> list[int] | None:
    """LMCache's _to_int_list: a list, or a comma-separated string of integers."""
    if value is None or value == "":
        return None
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise ConfigError(f"{where}: {key}={value!r} is not a list of integers")
    try:
        return [int(str(item).strip()) for item in items]
    except ValueError:
        raise ConfigError(f"{where}: {key}={value!r} is not a list of integers") from None


def _file_url(value, key: str, where: str) -> Path:
    text = str(value)
    if text.startswith("file://"):
        text = text[len("file://"):]
    elif "://" in text:
        raise ConfigError(f"{where}: {key}={value!r} must be a file:// URL or a path")
    return Path(os.path.expanduser(text))


def _fs_url(value: str, where: str) -> Path:
    parts = urlsplit(value)
    if parts.scheme != "fs":
        raise ConfigError(f"{where}: remote_url={value!r}: the simulator implements the fs:// backend "
                          f"(e.g. fs://localhost:0/mnt/fx/lmcache), not {parts.scheme or 'a bare path'}://")
    path = parts.path
    if path.startswith("/~"):
        path = path[1:]
    if not path or path == "/":
        raise ConfigError(f"{where}: remote_url={value!r} names no directory")
    return Path(os.path.expanduser(path))


# --- the node --------------------------------------------------------------------------------------

class Node:
    """The simulated node's state file, re-read when it changes (faults switch while the server runs)."""

    def __init__(self, root: str | None, fx_paths: list[str] | None = None):
        self.root = Path(os.path.expanduser(root)) if root else None
        self.fx_paths = [os.path.realpath(os.path.expanduser(p)) for p in (fx_paths or [])]
        self._state: dict | None = None
        self._mtime = None

    @property
    def state(self) -> dict | None:
        if self.root is None:
            return None
        path = node_state.state_path(self.root)
        try:
            mtime = path.stat().st_mtime_ns
        except OSError:
            return self._state
        if mtime != self._mtime:
            try:
                state = node_state.load_state(self.root)
            except (OSError, ValueError):
                return self._state    # half-written by a tool that does not write atomically: keep the last good one
            if isinstance(state, dict):
                for section in ("fx", "local_nvme"):
                    if not isinstance(state.get(section), dict):
                        state[section] = {}
                self._state, self._mtime = state, mtime
        return self._state

    def faults(self) -> dict:
        state = self.state
        return dict(state.get("faults", {})) if state else {}

    def storage_kind(self, path: Path) -> str:
        target = os.path.realpath(path)
        for fx in self.fx_paths:
            if target == fx or target.startswith(fx.rstrip("/") + "/"):
                return "fx"
        state = self.state
        if state is None:
            return "local_nvme"
        kind = node_state.storage_kind(path, state)
        if kind == "other" and self._under_fx_mount_point(target, state):
            return "fx"
        return kind

    def fx_up(self) -> bool:
        state = self.state
        if state is None:
            return True
        return not state["faults"].get("fx_down") and node_state.fx_mount(state) is not None

    def time_scale(self) -> float | None:
        state = self.state
        return float(state["time_scale"]) if state and state.get("time_scale") else None

    def check_path(self, path: Path, key: str) -> None:
        """A tier path must be on this node: its parent directory exists, and FX is mounted for FX paths."""
        target = Path(os.path.realpath(path))
        state = self.state
        if state is not None and self._under_fx_mount_point(str(target), state) and node_state.fx_mount(state) is None:
            raise ConfigError(f"{key}: {path} is on the FX mount point, but FX is not mounted on node "
                              f"{state.get('node', '?')} (attach it first)")
        if not target.exists() and not target.parent.is_dir():
            raise ConfigError(f"{key}: {path} is not on this node: {target.parent} does not exist")

    @staticmethod
    def _under_fx_mount_point(target: str, state: dict) -> bool:
        mount = (state.get("fx") or {}).get("mounted_at")
        if not mount:
            return False
        mount = os.path.realpath(mount)
        return target == mount or target.startswith(mount.rstrip("/") + "/")


# --- vllm serve --------------------------------------------------------------------------------------

# vLLM flags a deployment may pass that do not change the simulation (accepted, recorded, ignored).
IGNORED_VALUE_FLAGS = ["--dtype", "--quantization", "--block-size", "--max-num-seqs", "--swap-space",
                       "--distributed-executor-backend", "--compilation-config", "--seed", "--uvicorn-log-level",
                       "--tokenizer", "--download-dir", "--load-format", "--pipeline-parallel-size",
                       "--data-parallel-size", "--max-log-len", "--generation-config", "--chat-template",
                       "--tool-call-parser", "--reasoning-parser", "--allowed-origins", "--api-key",
                       "--disable-log-stats-interval", "--kv-cache-memory", "--cpu-offload-gb"]
IGNORED_SWITCHES = ["--trust-remote-code", "--disable-log-requests", "--disable-log-stats", "--enforce-eager",
                    "--enable-expert-parallel", "--enable-auto-tool-choice", "--enable-log-requests",
                    "--enable-chunked-prefill", "--no-enable-chunked-prefill", "--async-scheduling"]
# The vLLM versions whose outward behaviour the simulator imitates (FXPILOT_SIM_VLLM_VERSION), checked against
# the real servers (docs/simulator.md): 0.20.1, the seed's version, is the default.
VLLM_VERSIONS = ("0.20.1", "0.32.0")
DEFAULT_VLLM_VERSION = "0.20.1"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise ConfigError(f"vllm serve: {message}")


def serve_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="vllm serve", description="Simulated vLLM OpenAI-compatible server (simulated: true)")
    p.add_argument("model")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", nargs="+")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--kv-transfer-config")
    p.add_argument("--enable-prefix-caching", dest="prefix_caching", action="store_true", default=True)
    p.add_argument("--no-enable-prefix-caching", dest="prefix_caching", action="store_false")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--max-model-len", type=int, default=262144)
    p.add_argument("--enable-prompt-tokens-details", dest="prompt_tokens_details", action="store_true", default=False)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--kv-cache-dtype", default="fp8", choices=["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"])
    p.add_argument("--sim-time-scale", type=float, help="model seconds x scale = wall seconds (simulator only)")
    p.add_argument("--sim-root", help="the simulated node's sandbox (default $FXPILOT_SIM_ROOT)")
    p.add_argument("--sim-fx-path", action="append", default=[],
                   help="treat paths under this directory as the FX mount when there is no state file")
    for flag in IGNORED_VALUE_FLAGS:
        p.add_argument(flag, dest="ignored_" + flag.strip("-").replace("-", "_"))
    for flag in IGNORED_SWITCHES:
        p.add_argument(flag, action="store_true", dest="ignored_" + flag.strip("-").replace("-", "_"))
    return p


@dataclass
class ServeConfig:
    model: str
    served_names: list[str]
    host: str
    port: int
    tensor_parallel: int
    lmcache: LMCacheSettings | None
    prefix_caching: bool
    max_batched_tokens: int
    max_model_len: int
    gpu_memory_utilization: float
    kv_cache_bytes: float
    time_scale: float
    node: Node
    dev_mode: bool
    prompt_tokens_details: bool = False
    vllm_version: str = DEFAULT_VLLM_VERSION
    # VLLM_CACHE_ROOT when it names a directory: empty → a cold start is modelled (and the cache is filled);
    # holding files → warm. Unset → the server starts at once, as before (the warm start is not modelled).
    compile_cache: Path | None = None

    @property
    def cold_start(self) -> bool:
        cache = self.compile_cache
        return cache is not None and (not cache.is_dir() or not any(cache.iterdir()))


def parse_serve(argv: list[str], environ: dict | None = None) -> ServeConfig:
    environ = os.environ if environ is None else environ
    args = serve_parser().parse_args(argv)
    model = args.model
    if model.startswith(("/", "./", "../", "~")) and not Path(os.path.expanduser(model)).exists():
        raise ConfigError(f"vllm serve: model path {model} does not exist on this node")
    if args.tensor_parallel_size < 1:
        raise ConfigError("vllm serve: --tensor-parallel-size must be at least 1")
    if not 0 < args.gpu_memory_utilization <= 1:
        raise ConfigError("vllm serve: --gpu-memory-utilization must be in (0, 1]")
    if args.max_num_batched_tokens < 1:
        raise ConfigError("vllm serve: --max-num-batched-tokens must be at least 1")
    lmcache = None
    if args.kv_transfer_config:
        try:
            transfer = json.loads(args.kv_transfer_config)
        except ValueError as error:
            raise ConfigError(f"vllm serve: --kv-transfer-config is not valid JSON ({error})") from None
        if not isinstance(transfer, dict):
            raise ConfigError("vllm serve: --kv-transfer-config must be a JSON object")
        connector = transfer.get("kv_connector")
        if connector not in CONNECTORS:
            raise ConfigError(f"vllm serve: --kv-transfer-config kv_connector={connector!r}; the simulator "
                              f"implements {', '.join(sorted(CONNECTORS))}")
        if transfer.get("kv_role") not in ROLES:
            raise ConfigError(f"vllm serve: --kv-transfer-config kv_role={transfer.get('kv_role')!r}; expected one "
                              f"of {', '.join(sorted(ROLES))}")
        lmcache = read_lmcache(environ)
    root = args.sim_root or environ.get("FXPILOT_SIM_ROOT")
    fx_paths = args.sim_fx_path or [p for p in environ.get("FXPILOT_SIM_FX_PATHS", "").split(":") if p]
    node = Node(root, fx_paths)
    if root and node.state is None:
        print(f"WARNING: FXPILOT_SIM_ROOT={root} has no readable state.json; every path counts as local NVMe "
              f"unless under --sim-fx-path, and no fault applies", file=sys.stderr, flush=True)
    if lmcache is not None:
        for key, path in (("local_disk", lmcache.local_disk), ("remote_url (fs pool)", lmcache.fs_pool)):
            if path is not None:
                node.check_path(path, f"LMCache {key}")
    scale = args.sim_time_scale
    if scale is None and environ.get("FXPILOT_SIM_TIME_SCALE"):
        try:
            scale = float(environ["FXPILOT_SIM_TIME_SCALE"])
        except ValueError:
            raise ConfigError(f"FXPILOT_SIM_TIME_SCALE={environ['FXPILOT_SIM_TIME_SCALE']!r} is not a number") \
                from None
    if scale is None:
        scale = node.time_scale() or 1.0
    if scale <= 0:
        raise ConfigError(f"the time scale must be positive, not {scale:g}")
    dev = environ.get("VLLM_SERVER_DEV_MODE", "0").strip().lower() in {"1", "true"}
    version = environ.get("FXPILOT_SIM_VLLM_VERSION") or DEFAULT_VLLM_VERSION
    if version not in VLLM_VERSIONS:
        raise ConfigError(f"FXPILOT_SIM_VLLM_VERSION={version!r}: the simulator imitates vLLM "
                          f"{' and '.join(VLLM_VERSIONS)}")
    return ServeConfig(model=model, served_names=args.served_model_name or [model], host=args.host, port=args.port,
                       tensor_parallel=args.tensor_parallel_size, lmcache=lmcache, prefix_caching=args.prefix_caching,
                       max_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
                       gpu_memory_utilization=args.gpu_memory_utilization,
                       kv_cache_bytes=2.0 if args.kv_cache_dtype in ("auto", "bfloat16") else 1.0,
                       time_scale=scale, node=node, dev_mode=dev, prompt_tokens_details=args.prompt_tokens_details,
                       vllm_version=version,
                       compile_cache=Path(environ["VLLM_CACHE_ROOT"]) if environ.get("VLLM_CACHE_ROOT") else None)
