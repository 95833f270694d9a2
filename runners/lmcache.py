"""LMCache as the deploy step sees it: the YAML each cache arm runs with (the two cache arms differ only in where
the files live; one stated chunk hash), and the server log lines that show LMCache failing, read at /health by
deploy.sh (params.env's LMCACHE_FAILED) and during the run by the runner.
"""
from __future__ import annotations

import importlib.util
import json
import shlex

import yaml

from gates.plan import SAFE_LOADER
from gates.sizing import DTYPE_BYTES, MODEL_CONFIGS, kv_dtype_from_flags
from runners import ssh
from runners.config import ARM_PORT_OFFSETS, ARMS, DeploymentSettings
from runners.deployment import DeployError, Deployment, server_log_paths
from runners.models import Node, Step
from runners.sim import nonehash
from runners.tracereplay import max_model_len

GIB = 1024 ** 3  # LMCache's max_local_cpu_size and max_local_disk_size are GiB per rank


def cache_dirs(settings: DeploymentSettings, arm: str, run_id: str | None, *,
               capped: bool = False) -> tuple[str | None, str | None]:
    """(LMCache local_disk directory, shared fs pool directory) of an arm; the cache arms differ only in the root.
    G4's capped fx server (`capped`) has a directory of its own: a disk tier rebuilds its index from the files it
    finds, so it must not start with, or evict, what the full-size server wrote."""
    suffix = f"/{run_id}" if run_id else ""
    if capped and arm == "fx":
        return f"{settings.paths.fx_mount}/fxpilot/kv{suffix}-capped", None
    if arm == "local_nvme":
        return f"{settings.paths.local_nvme_path}/kv{suffix}", None
    if arm == "fx":
        return f"{settings.paths.fx_mount}/fxpilot/kv{suffix}", f"{settings.paths.shared_pool}{suffix}"
    return None, None


def kv_bytes_per_token(settings: DeploymentSettings, simulated: bool) -> int:
    """The KV bytes one token takes on the deployed model (gates.sizing's model configurations): the dtype of
    `--kv-cache-dtype` among the extra vLLM flags, else the simulator's default fp8 on a simulated node and the
    model's activation dtype (vLLM's `auto`) on a real one."""
    config = MODEL_CONFIGS.get(settings.model)
    if not config:
        raise ValueError(f"the KV bytes per token of {settings.model} are not known (gates.sizing.MODEL_CONFIGS): "
                         "the capacity check cannot cap its tier")
    dtype = kv_dtype_from_flags(settings.extra_vllm_flags) or ("fp8" if simulated else config["activation_dtype"])
    if dtype == "auto":
        dtype = config["activation_dtype"]
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"--kv-cache-dtype {dtype}: its bytes per value are not known")
    return 2 * config["layers"] * config["kv_heads"] * config["head_dim"] * DTYPE_BYTES[dtype]


def disk_size_for(tokens: int, settings: DeploymentSettings, simulated: bool) -> float:
    """LMCache's `max_local_disk_size` (GiB = 2³⁰ bytes per TP rank, each rank keeping its share of every chunk: 0.5.6's
    LocalDiskBackend caps itself at max_local_disk_size × 1024³) that holds exactly ⌊tokens ÷ chunk_size⌋ chunks:
    half a rank-chunk above that many, so the whole-chunk count LMCache (and the simulator) derive from it is it."""
    chunk = settings.sizes.chunk_size
    rank_chunk = int(chunk * kv_bytes_per_token(settings, simulated) / settings.tensor_parallel_size)
    chunks = max(int(tokens) // chunk, 1)
    return round((chunks * rank_chunk + rank_chunk / 2) / GIB, 9)


# One chunk hash on every node and in every process of a run. LMCache 0.3.9–0.5.6 default to
# `pre_caching_hash_algorithm: builtin`, a name vLLM 0.20.1 does not have: LMCache then falls back to Python's
# hash(), salted per process, so the scheduler's lookup and the workers' stores (separate processes), and two
# instances sharing one pool, make different keys for the same tokens and a pilot records about 0 % hits. The
# rendered configuration names one of vLLM's hash functions (vllm.utils.hashing.get_hash_fn_by_name: sha256,
# sha256_cbor, xxhash, xxhash_cbor; the xxhash ones need a package a node may lack), and deploy.sh exports a
# fixed PYTHONHASHSEED: vLLM seeds the first block's hash (init_none_hash) from it, and draws it at random per
# process without it, whatever the algorithm. Both are in the manifest (chunk_hash) and the phase summaries.
CHUNK_HASH_ALGORITHM = "sha256_cbor"
PYTHONHASHSEED = "0"
CHUNK_HASH_ALGORITHMS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")


def chunk_hash() -> dict[str, str]:
    """The chunk hash every LMCache arm runs with, as the manifest records it."""
    return {"algorithm": CHUNK_HASH_ALGORITHM, "pythonhashseed": PYTHONHASHSEED}


def render_lmcache_config(settings: DeploymentSettings, arm: str, *, run_id: str | None = None, share_pool: bool = False,
                          simulated: bool = False, capacity_tokens: int | None = None,
                          api_port_start: int | None = None) -> str:
    """The LMCache YAML of an arm, as the customer runs LMCache: its DRAM tier on (`local_cpu: true`, the settings'
    `sizes.max_local_cpu_size` GiB per rank) in every LMCache arm; `local_nvme` and `fx` add the same disk tier in
    different places, `dram` has none. Every LMCache arm enables LMCache's internal API server on 127.0.0.1 from
    `api_port_start` (default: the settings' port for the arm; the workload client empties the DRAM tier through it
    before a cold window, runners.lmcache.api_urls). With `capacity_tokens` (G4's capacity check, fx only) the disk
    tier is capped to hold that many tokens, in a directory of its own, with no shared pool."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; arms are {', '.join(ARMS)}")
    header = [f"# LMCache configuration rendered by fxpilot for arm {arm}" + (f", run {run_id}" if run_id else "")]
    if simulated:
        header.append("# simulated: true")
    if arm == "recompute":
        return "\n".join(header + ["# recompute: vLLM runs without a KV connector; LMCache is not loaded.", ""])
    for path in (settings.paths.fx_mount, settings.paths.local_nvme_path):
        if path.startswith("~/"):
            raise ValueError(f"{path}: resolve ~/ paths with DeploymentSettings.with_home before rendering")
    if not api_port_start:
        # the deploy passes the ports it chose; without them (ports.base 0), the fixed scheme of runners.config
        api_port_start = settings.ports.lmcache_api + ARM_PORT_OFFSETS[arm] * (1 + settings.tensor_parallel_size)
    if not 1024 <= int(api_port_start) <= 65535 - settings.tensor_parallel_size:
        raise ValueError(f"LMCache's internal API port start {api_port_start} leaves no room for its "
                         f"{settings.tensor_parallel_size} worker ports (1024–65535)")
    capped = capacity_tokens is not None and arm == "fx"
    disk_dir, pool_dir = cache_dirs(settings, arm, run_id, capped=capped)
    share_pool = share_pool and not capped and arm == "fx"
    sizes = settings.sizes
    lines = header
    if capped:
        lines.append(f"# capacity check: the disk tier capped at {int(capacity_tokens)} tokens "
                     f"({int(capacity_tokens) // sizes.chunk_size} chunks of {sizes.chunk_size})")
    lines += [
        "# LMCache's DRAM tier on, as production runs it: a retrieval reads DRAM first, then the disk tier. Cold",
        "# windows empty it through the internal API server (DELETE /cache/clear?locations=LocalCPUBackend); which",
        "# tier served a window is measured from the disk device's read counters, not assumed from this file.",
        f"chunk_size: {sizes.chunk_size}",
        "local_cpu: true",
        f"max_local_cpu_size: {sizes.max_local_cpu_size}",
    ]
    if disk_dir:
        disk_size = disk_size_for(capacity_tokens, settings, simulated) if capped else sizes.max_local_disk_size
        lines += [f"local_disk: {json.dumps('file://' + disk_dir + '/')}", f"max_local_disk_size: {disk_size}"]
    else:
        lines.append("# dram: LMCache's DRAM tier only (no disk tier, no remote backend): the customer's stack without FX.")
    lines += [
        "# One deterministic chunk hash in every process and on every node (deploy.sh also exports PYTHONHASHSEED).",
        f"pre_caching_hash_algorithm: {CHUNK_HASH_ALGORITHM}",
        "# LMCache's internal API server, loopback only: port_start for its scheduler, port_start + 1 + w for worker w.",
        "internal_api_server_enabled: true",
        f"internal_api_server_host: {json.dumps(API_HOST)}",
        f"internal_api_server_port_start: {int(api_port_start)}",
    ]
    if share_pool and pool_dir:
        lines += ["# Cross-instance sharing: every instance reads and writes the same pool on the FX mount.",
                  f"remote_url: {json.dumps('fs://localhost:0' + pool_dir)}",
                  'remote_serde: "naive"']
    extra = []
    if disk_dir:
        odirect = "true" if settings.use_odirect else "false"
        # The local-disk backend reads use_odirect; the fs connector of the shared pool reads its own key.
        extra.append(f"  use_odirect: {odirect}")
        if share_pool and pool_dir:
            extra.append(f"  fs_connector_use_odirect: {odirect}")
        if settings.lmcache.disk_io_threads:
            extra.append(f"  disk_io_threads: {int(settings.lmcache.disk_io_threads)}")
    if extra:
        lines += ["extra_config:", *extra]
    return "\n".join(lines + [""])


API_HOST = "127.0.0.1"
# What empties LMCache's DRAM tier (LMCache 0.5.6 internal_api_server/vllm/cache_api.py `DELETE /cache/clear`; the
# route came with LMCache PR #1711, merged 2025-09-28: releases before it have no such route, and deploy.sh refuses
# them at preflight, reading the installed files: lmcache_inspect.py's `clear_api`).
API_CLEAR_PATH = "/cache/clear?locations=LocalCPUBackend"


def api_urls(api_port_start: int, tensor_parallel_size: int) -> list[str]:
    """The internal API servers of the LMCache processes that own a cache: one per TP worker (port_start + 1 + w).
    The scheduler's server (port_start) has no engine and answers a clear with an error, so it is not listed."""
    return [f"http://{API_HOST}:{int(api_port_start) + 1 + worker}" for worker in range(int(tensor_parallel_size))]


def retrieval_tier(arm: str, config_text: str | None) -> str | None:
    """The tier that served every LMCache retrieval of an arm, from the configuration it ran with, or None.

    LMCache (0.3.1–0.5.6) names no tier in its `Retrieved …` lines, and one retrieval may sum chunks of several
    tiers. Its CPU backend answers lookups only with `local_cpu: true`; with `local_cpu: false` it only stages
    transfers, so such a configuration (with no other remote backend) attributes every retrieval to the arm's own
    disk tier. The arms fxpilot renders now run LMCache's DRAM tier (`local_cpu: true`): a retrieval may be DRAM's,
    the disk tier's or both, and the configuration attributes nothing — which tier served a window is measured from
    the disk device's read counters (the deployment's `disk_device`, the phase summaries' `tier_bytes`)."""
    if arm not in ("fx", "local_nvme") or not config_text:
        return None
    try:
        config = yaml.load(config_text, Loader=SAFE_LOADER) or {}
    except yaml.YAMLError:
        return None
    if not isinstance(config, dict) or config.get("local_cpu", True) is not False:
        return None  # DRAM on (LMCache's default is local_cpu: true): the device counters attribute, not this file
    remote = str(config.get("remote_url") or "")
    if remote and (arm != "fx" or not remote.startswith("fs://")):
        return None  # a remote backend off the arm's storage (the shared pool is an fs:// path on the FX mount)
    if not (config.get("local_disk") or remote):
        return None
    return arm


# ── sizing: a DRAM pool that holds the largest retrieval ─────────────────────────────────────────────────
# LMCache 0.5.6 allocates the DRAM buffers of every chunk of a retrieval before it reads any
# (LocalDiskBackend.batched_get_blocking), and LocalCPUBackend.allocate busy-loops while nothing can be evicted:
# a pool below one retrieval stalls the first cold recovery. The deploy refuses a pool below the largest planned
# retrieval per rank × (1 + SIZING_MARGIN); the margin is an assumption (room for the stores that run beside a
# retrieval), not a measurement.
SIZING_MARGIN = 0.25


def model_kv_config(settings: DeploymentSettings, config_json: dict | None = None) -> dict:
    """{layers, kv_heads, head_dim, activation_dtype} of the deployed model: gates.sizing's table for a known id,
    else the model's own config.json (a model path on the node: `config_json`, read there by the deploy)."""
    known = MODEL_CONFIGS.get(settings.model)
    if known:
        return known
    if not isinstance(config_json, dict):
        raise ValueError(f"the KV bytes per token of {settings.model} are not known (gates.sizing.MODEL_CONFIGS, or "
                         "the model's config.json)")
    text = config_json.get("text_config") if isinstance(config_json.get("text_config"), dict) else config_json
    try:
        layers = int(text["num_hidden_layers"])
        heads = int(text.get("num_attention_heads") or 0)
        kv_heads = int(text.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or (int(text["hidden_size"]) // heads))
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        raise ValueError(f"{settings.model}/config.json names no num_hidden_layers, num_key_value_heads and head_dim: "
                         "the KV bytes per token are not known") from None
    dtype = str(text.get("torch_dtype") or text.get("dtype") or config_json.get("torch_dtype") or "bfloat16")
    activation = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, dtype)
    return {"layers": layers, "kv_heads": kv_heads, "head_dim": head_dim, "activation_dtype": activation}


def kv_dtype_of(settings: DeploymentSettings, simulated: bool, config: dict | None = None) -> str:
    config = config or MODEL_CONFIGS.get(settings.model) or {}
    dtype = kv_dtype_from_flags(settings.extra_vllm_flags) or ("fp8" if simulated else config.get("activation_dtype"))
    if dtype == "auto":
        dtype = config.get("activation_dtype")
    return str(dtype)


def largest_prompt_tokens(plan_document: dict | None, settings: DeploymentSettings) -> tuple[int | None, str]:
    """The longest prompt a deploy must be able to retrieve, and where it comes from: the plan's workloads (the
    longest prompt_tokens + turn_tokens), at most vLLM's --max-model-len when the flags name one; the
    --max-model-len alone without a plan; (None, reason) when neither says."""
    longest, source = None, ""
    for name, workload in ((plan_document or {}).get("workloads") or {}).items():
        if not isinstance(workload, dict):
            continue
        tokens = workload.get("prompt_tokens")
        if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0:
            total = tokens + max(int(workload.get("turn_tokens") or 0), 0)
            if longest is None or total > longest:
                longest, source = total, f"the plan's {name} workload ({tokens} + {total - tokens} tokens)"
    max_len = max_model_len(settings.extra_vllm_flags)
    if max_len and (longest is None or max_len < longest):
        longest, source = max_len, f"vLLM's --max-model-len={max_len}"
    return longest, source or "neither the plan nor --max-model-len names a prompt length"


def sizing(settings: DeploymentSettings, arm: str, *, simulated: bool, plan_document: dict | None = None,
           model_config_json: dict | None = None) -> dict:
    """The sizing preflight of an LMCache arm: {tokens, source, kv_dtype, kv_bytes_per_token, retrieval_bytes (per
    rank), required_bytes, pool_bytes, ok, message}. `message` (when not ok) names both sizes with units."""
    pool = int(settings.sizes.max_local_cpu_size * GIB)
    out = {"arm": arm, "pool_bytes": pool, "pool_gib": settings.sizes.max_local_cpu_size, "ok": True, "message": None,
           "margin": SIZING_MARGIN}
    if arm not in ("dram", "local_nvme", "fx"):
        return {**out, "applicable": False}
    config = model_kv_config(settings, model_config_json)
    dtype = kv_dtype_of(settings, simulated, config)
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"--kv-cache-dtype {dtype}: its bytes per value are not known")
    per_token = 2 * config["layers"] * config["kv_heads"] * config["head_dim"] * DTYPE_BYTES[dtype]
    tokens, source = largest_prompt_tokens(plan_document, settings)
    out.update(applicable=True, kv_dtype=dtype, kv_bytes_per_token=per_token, tokens=tokens, source=source)
    if tokens is None:
        return {**out, "retrieval_bytes": None, "required_bytes": None}
    # LMCache stores whole chunks: a retrieval is at most the prompt's chunks, each rank holding its 1/TP share
    chunks = -(-tokens // settings.sizes.chunk_size)
    retrieval = int(chunks * settings.sizes.chunk_size * per_token / settings.tensor_parallel_size)
    required = int(retrieval * (1 + SIZING_MARGIN))
    out.update(retrieval_bytes=retrieval, required_bytes=required)
    if pool < required:
        out.update(ok=False, message=(
            f"deployment.sizes.max_local_cpu_size is {_size(pool)} per rank, below the largest retrieval per rank: "
            f"{_size(retrieval)} ({tokens} tokens from {source}, {chunks} chunks of {settings.sizes.chunk_size} × "
            f"{per_token} B/token of {dtype} KV ÷ TP {settings.tensor_parallel_size}) + {int(SIZING_MARGIN * 100)} % = "
            f"{_size(required)}; LMCache 0.5.6 allocates a retrieval's DRAM before reading it and would stall: "
            f"raise max_local_cpu_size to at least {required / GIB:.3f} GiB"))
    return out


def _size(nbytes: int) -> str:
    if nbytes >= GIB / 10:
        return f"{nbytes / GIB:.3f} GiB ({nbytes} B)"
    return f"{nbytes / 2**20:.3f} MiB ({nbytes} B)"


# ── the first block's hash, as vLLM 0.20.1 and LMCache 0.5.6 make it ────────────────────────────────────
def expected_none_hash(algorithm: str, seed: str) -> str:
    """The NONE_HASH every LMCache process logs (`Initialized NONE_HASH=<value> from vLLM (>= PR#20511)`,
    lmcache/v1/token_database.py 0.5.6) for vLLM 0.20.1's hash function `algorithm` and PYTHONHASHSEED `seed`:
    vLLM's init_none_hash sets NONE_HASH = hash_fn(seed) (the seed as a str; os.urandom(32) without one), and
    LMCache folds a digest to the int of its first eight bytes, big-endian, and logs it in decimal. The digest is
    the simulator's own (runners.sim.nonehash, standard library only), so the simulated processes and the deploy's
    expectation are one computation; the real tier holds it to what real LMCache logs (tests/real)."""
    if algorithm not in CHUNK_HASH_ALGORITHMS:
        raise ValueError(f"{algorithm!r} is not one of vLLM 0.20.1's hash functions ({', '.join(CHUNK_HASH_ALGORITHMS)})")
    if algorithm.startswith("xxhash") and importlib.util.find_spec("xxhash") is None:
        raise ValueError(f"{algorithm}: the xxhash package is needed to compute the expected NONE_HASH")
    return str(int.from_bytes(nonehash.digest(algorithm, str(seed))[:8], "big"))


# LMCache's lines that the deploy reads at /health (deploy.sh prints them as FXPILOT_LMCACHE_OBSERVED): each
# process's first block hash, and whether its disk tier reads with O_DIRECT (LocalDiskBackend, 0.5.6).
NONE_HASH_LINE = r"Initialized NONE_HASH=(-?[0-9]+)"
ODIRECT_LINE = r"Using O_DIRECT for disk I/O: (True|False)"


# LMCache that fails does not stop vLLM: the server stays healthy and every request recomputes (after waiting
# for a lookup timeout). These are the lines LMCache 0.5.x writes then (lmcache/v1/manager.py,
# health_monitor/base.py, health_monitor/checks/remote_backend_check.py, gpu_connector/__init__.py). deploy.sh
# reads this same extended regular expression at /health (params.env's LMCACHE_FAILED); the runner during the run.
# Also a chunk hash that is not the one stated (CHUNK_HASH_ALGORITHM with PYTHONHASHSEED): LMCache's fallback to
# Python's salted hash() (lmcache/v1/token_database.py) and vLLM's warning that its first block hash is drawn at
# random (vllm/v1/core/kv_cache_utils.py init_none_hash, e.g. a container launcher that did not pass the seed on).
LMCACHE_TROUBLE = (
    r"System will operate in degraded mode|entering degraded mode|No supported [A-Za-z]+ connector found"
    r"|Failed to initiali[sz]e LMCache|Failed during post_init|LMCacheConnectorV1.*(Error|Exception):"
    r"|LMCache (ERROR|WARNING):.*([Cc]onnection (refused|reset|lost|error|closed|timed out)|[Ff]ailed to connect"
    r"|Ping (error|timeout))"
    r"|Using builtin hash without PYTHONHASHSEED set|Could not load '[^']*' from vLLM\. Using builtin hash"
    r"|PYTHONHASHSEED is not set\. This will lead to non-reproducible block-hashes"
    # A DRAM pool too small for what it is asked to hold (local_cpu_backend.py, cache_engine.py 0.5.6): a retrieval
    # or store waits in a busy loop, or a store is cut short; the sizing preflight should have refused the deploy.
    r"|No eviction candidates found|[Mm]emory (is )?under pressure"
)
# Run with the node's python3: the complete lines of each log from where the last look stopped, colour codes
# removed, searched for the first match. A line still being written is left for the next look, so no line is
# read in halves and none twice (a fault step's lines, passed over, are never read again).
_SCAN_LOG = r"""
import json, os, re, sys
pattern, ansi = re.compile(sys.argv[1]), re.compile(r"\x1b\[[0-9;]*m")
out = {"checked": {}, "line": None}
for path, start in json.loads(sys.argv[2]).items():
    try:
        handle = open(os.path.expanduser(path), "rb")
    except OSError:
        continue
    with handle:
        size = handle.seek(0, 2)
        start = start if 0 <= start <= size else 0
        handle.seek(start)
        done, rest = start, b""
        while done + len(rest) < size:
            block = handle.read(min(8 << 20, size - done - len(rest)))
            if not block:
                break
            lines = (rest + block).split(b"\n")
            rest = lines.pop()
            for raw in lines:
                done += len(raw) + 1
                if out["line"] is None:
                    text = ansi.sub("", raw.decode("utf-8", "replace"))
                    if pattern.search(text):
                        out["line"] = text.strip()[:600]
    out["checked"][path] = done
print(json.dumps(out))
"""


def lmcache_trouble(conn: ssh.NodeConnection, deployment: Deployment) -> str | None:
    """The first server log line, since what an earlier look read (deployment.log_checked), that shows LMCache
    failing to initialise, running degraded or losing a connection; None when there is none or the arm runs
    without LMCache. Advances deployment.log_checked (store it with save_log_checked)."""
    if not deployment.config_path:
        return None
    paths = server_log_paths(deployment)
    if not paths:
        return None
    starts = {path: int(deployment.log_checked.get(path, 0)) for path in paths}
    result = conn.run(f"python3 -c {shlex.quote(_SCAN_LOG)} {shlex.quote(LMCACHE_TROUBLE)} "
                      f"{shlex.quote(json.dumps(starts))}", echo=False, timeout=120)
    try:
        found = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise DeployError(f"node {deployment.node}: reading the {deployment.arm} server log gave "
                          f"{result.stdout[-200:]!r}", deployment=deployment) from None
    checked = {path: int(value) for path, value in (found.get("checked") or {}).items() if path in starts}
    deployment.log_checked = {**deployment.log_checked, **checked}
    return found.get("line") or None


def save_log_checked(step: Step | None, deployment: Deployment) -> None:
    """Keep how far the server log was looked at in the deploy step's stored deployment (that key only)."""
    if step is None:
        return
    step.refresh_from_db(fields=["result"])
    result = dict(step.result or {})
    stored = dict(result.get("deployment") or {})
    if not stored:
        return
    stored["log_checked"] = dict(deployment.log_checked)
    result["deployment"] = stored
    step.result = result
    step.save(update_fields=["result"])


def lmcache_trouble_message(node: Node, deployment: Deployment, line: str, kept: str = "the records already collected") -> str:
    return (f"node {node.name}: {deployment.arm}: LMCache stopped working during the run — the server log says: "
            f"{line[:300]} (infrastructure trouble: {kept} are kept but not judged)")
