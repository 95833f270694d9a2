"""LMCache as the deploy step sees it: the YAML each cache arm runs with (the two cache arms differ only in where
the files live; one stated chunk hash), and the server log lines that show LMCache failing, read at /health by
deploy.sh (params.env's LMCACHE_FAILED) and during the run by the runner.
"""
from __future__ import annotations

import json
import shlex

import yaml

from gates.plan import SAFE_LOADER
from gates.sizing import DTYPE_BYTES, MODEL_CONFIGS, kv_dtype_from_flags
from runners import ssh
from runners.config import ARMS, DeploymentSettings
from runners.deployment import DeployError, Deployment, server_log_paths
from runners.models import Node, Step

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
                          simulated: bool = False, capacity_tokens: int | None = None) -> str:
    """The LMCache YAML of an arm: the same backend type and sizes for both cache arms, only the disk path differs.
    With `capacity_tokens` (G4's capacity check, fx only) the disk tier is capped to hold that many tokens, in a
    directory of its own, with no shared pool."""
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
    capped = capacity_tokens is not None and arm == "fx"
    disk_dir, pool_dir = cache_dirs(settings, arm, run_id, capped=capped)
    share_pool = share_pool and not capped
    sizes = settings.sizes
    disk_size = disk_size_for(capacity_tokens, settings, simulated) if capped else sizes.max_local_disk_size
    if capped:
        header.append(f"# capacity check: the disk tier capped at {int(capacity_tokens)} tokens "
                      f"({int(capacity_tokens) // sizes.chunk_size} chunks of {sizes.chunk_size})")
    lines = header + [
        "# LMCache's DRAM tier holds no cache (its CPU memory only stages transfers): every hit is read from the",
        "# arm's own disk tier, so each retrieval's bandwidth is that tier's (gates.judge: read_bw).",
        f"chunk_size: {sizes.chunk_size}",
        "local_cpu: false",
        f"max_local_cpu_size: {sizes.max_local_cpu_size}",
        f"local_disk: {json.dumps('file://' + disk_dir + '/')}",
        f"max_local_disk_size: {disk_size}",
        "# One deterministic chunk hash in every process and on every node (deploy.sh also exports PYTHONHASHSEED).",
        f"pre_caching_hash_algorithm: {CHUNK_HASH_ALGORITHM}",
    ]
    if share_pool and pool_dir:
        lines += ["# Cross-instance sharing: every instance reads and writes the same pool on the FX mount.",
                  f"remote_url: {json.dumps('fs://localhost:0' + pool_dir)}",
                  'remote_serde: "naive"']
    odirect = "true" if settings.use_odirect else "false"
    # The local-disk backend reads use_odirect; the fs connector of the shared pool reads its own key.
    lines += ["extra_config:", f"  use_odirect: {odirect}"]
    if share_pool and pool_dir:
        lines.append(f"  fs_connector_use_odirect: {odirect}")
    return "\n".join(lines + [""])


def retrieval_tier(arm: str, config_text: str | None) -> str | None:
    """The tier that served every LMCache retrieval of an arm, from the configuration it ran with, or None.

    LMCache (0.3.1–0.5.6) names no tier in its `Retrieved …` lines, and one retrieval may sum chunks of several
    tiers. Its CPU backend answers lookups only with `local_cpu: true`; with `local_cpu: false` it only stages
    transfers. So a retrieval is the arm's own tier's (the FX mount for `fx`, the local NVMe for `local_nvme`;
    both the local_disk directory and a shared pool live there, runners.lmcache.cache_dirs) exactly when the
    configuration names no `local_cpu: true` and no other remote backend; otherwise nothing attributes it."""
    if arm not in ("fx", "local_nvme") or not config_text:
        return None
    try:
        config = yaml.load(config_text, Loader=SAFE_LOADER) or {}
    except yaml.YAMLError:
        return None
    if not isinstance(config, dict) or config.get("local_cpu", True) is not False:
        return None  # LMCache's default is local_cpu: true
    remote = str(config.get("remote_url") or "")
    if remote and (arm != "fx" or not remote.startswith("fs://")):
        return None  # a remote backend off the arm's storage (the shared pool is an fs:// path on the FX mount)
    if not (config.get("local_disk") or remote):
        return None
    return arm


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
