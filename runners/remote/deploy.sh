#!/usr/bin/env bash
# Deploy one arm of a gate run on this node: preflight checks, the vLLM (+ LMCache) launch, health.
#
#   deploy.sh preflight ARM_DIR          check port, model, cache paths; write ARM_DIR/manifest.json
#   deploy.sh serve ARM_DIR              exec vllm serve (run detached by the runner)
#   deploy.sh health ARM_DIR SECONDS [EXIT_FILE]
#                                        wait up to SECONDS for /health: exit 0 up, 3 not yet, 4 EXIT_FILE appeared
#   deploy.sh cleanup ARM_DIR            remove this arm's KV cache files
#
# ARM_DIR/params.env is written by runners/deploy.py with every value validated and shell-quoted:
# RUN_ID ARM NODE SIMULATED MODEL TP PORT CACHE_DIR KV_CONFIG_PATH USE_ODIRECT DROP_PAGE_CACHE
# PAGE_CACHE_METHOD MAX_LOCAL_DISK_SIZE SHARED_DIR EXTRA_VLLM_FLAGS (array) SIM_TIME_SCALE.
set -euo pipefail

fail() { echo "fxpilot: error: $*" >&2; exit 1; }
say() { echo "fxpilot: $*"; }

action=${1:-}
arm_dir=${2:-}
[[ -n "$action" && -f "$arm_dir/params.env" ]] || fail "usage: deploy.sh preflight|serve|health|cleanup ARM_DIR"
EXTRA_VLLM_FLAGS=()
# shellcheck source=/dev/null
source "$arm_dir/params.env"
port_file="$arm_dir/port"
# Where the server listens: the node's loopback, or its fabric address so the other node's client reaches it.
BIND_HOST=${BIND_HOST:-127.0.0.1}
if [[ "$BIND_HOST" == *:* ]]; then url_host="[$BIND_HOST]"; else url_host="$BIND_HOST"; fi

port_in_use() {
    python3 - "$1" "$BIND_HOST" <<'PY'
import socket, sys
port, bind = int(sys.argv[1]), sys.argv[2]
six = ":" in bind
for family, host in ((socket.AF_INET6 if six else socket.AF_INET, bind), (socket.AF_INET, "0.0.0.0")):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
    except OSError:
        sys.exit(0)
    finally:
        s.close()
sys.exit(1)
PY
}

free_port() {
    python3 -c 'import socket, sys; h = sys.argv[1]; s = socket.socket(socket.AF_INET6 if ":" in h else socket.AF_INET); s.bind((h, 0)); print(s.getsockname()[1]); s.close()' "$BIND_HOST"
}

versions_json() {
    local vllm_version rocm_version
    vllm_version=$(vllm --version 2>/dev/null | tail -n 1 || true)
    [[ -n "$vllm_version" ]] || vllm_version=$(python3 -c 'import vllm; print(vllm.__version__)' 2>/dev/null || true)
    rocm_version=$(cat /opt/rocm/.info/version 2>/dev/null || true)
    [[ -n "$rocm_version" ]] || rocm_version=$(amd-smi version 2>/dev/null | sed -n 's/.*ROCm version: *\([0-9][0-9.]*\).*/\1/p' | head -n 1 || true)
    VLLM_VERSION="$vllm_version" ROCM_VERSION="$rocm_version" python3 - <<'PY'
import importlib, json, os, re
from importlib import metadata

lm = {"version": None, "commit": None, "hip": None}
try:
    dist = metadata.distribution("lmcache")
    lm["version"] = dist.version
    # A git install records its commit in direct_url.json; a setuptools-scm version carries +g<hash>.
    vcs = json.loads(dist.read_text("direct_url.json") or "{}").get("vcs_info", {})
    match = re.search(r"\+g?([0-9a-f]{7,40})", dist.version)
    module = importlib.import_module("lmcache")
    lm["commit"] = vcs.get("commit_id") or getattr(module, "__commit__", None) or (match.group(1) if match else None)
    # The native ops name the GPU runtime they link against: amdhip64 for a ROCm build, cudart for CUDA.
    ops = importlib.import_module("lmcache.c_ops")
    blob = open(ops.__file__, "rb").read()
    lm["hip"] = True if b"amdhip64" in blob else False if b"cudart" in blob else None
except Exception as exc:  # an LMCache that cannot be inspected is reported, not guessed
    lm["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps({"vllm": os.environ["VLLM_VERSION"] or None, "rocm": os.environ["ROCM_VERSION"] or None,
                  "lmcache": lm, "python": __import__("platform").python_version()}))
PY
}

preflight() {
    local port="$PORT"
    if [[ "$MODEL" == /* ]] && [[ ! -e "$MODEL" ]]; then
        fail "the model path $MODEL does not exist on $(hostname) (deployment.model)"
    fi
    command -v vllm >/dev/null || fail "vllm is not on PATH for $(id -un) on $(hostname)"
    if [[ "$port" == 0 ]]; then
        port=$(free_port)
    elif port_in_use "$port"; then
        local holder
        holder=$(ss -ltnpH "sport = :$port" 2>/dev/null | head -n 1 || true)
        fail "port $port is already in use on $(hostname)${holder:+ ($holder)}; stop what holds it or change deployment.ports"
    fi
    echo "$port" > "$port_file"

    if [[ -n "$CACHE_DIR" ]]; then
        local root
        root=$(dirname "$CACHE_DIR")
        while [[ ! -d "$root" && "$root" != / ]]; do root=$(dirname "$root"); done
        [[ -w "$root" ]] || fail "cannot create the KV cache directory $CACHE_DIR: $root is not writable by $(id -un)"
        mkdir -p "$CACHE_DIR" || fail "cannot create the KV cache directory $CACHE_DIR"
        local free_gb need_gb
        # Which device and mount hold the KV files: evidence that each cache arm used the disk it names.
        CACHE_DEVICE=$(df -P "$CACHE_DIR" 2>/dev/null | awk 'NR == 2 { print $1 }' || true)
        CACHE_MOUNT=$(df -P "$CACHE_DIR" 2>/dev/null | awk 'NR == 2 { print $NF }' || true)
        free_gb=$(df -Pk "$CACHE_DIR" 2>/dev/null | awk 'NR == 2 { printf "%d", $4 / 1048576 }' || true)
        need_gb=$(python3 -c "print(int($MAX_LOCAL_DISK_SIZE * $TP))")
        if [[ -n "$free_gb" && "$free_gb" -lt "$need_gb" ]]; then
            say "warning: $CACHE_DIR has ${free_gb} GB free; $TP workers may fill up to ${need_gb} GB (max_local_disk_size is per worker)"
        fi
    fi
    if [[ -n "${SHARED_DIR:-}" ]]; then
        mkdir -p "$SHARED_DIR" || fail "cannot create the shared pool directory $SHARED_DIR on the FX mount"
    fi
    if [[ "$DROP_PAGE_CACHE" == 1 ]] && [[ ! -w /proc/sys/vm/drop_caches ]] && ! sudo -n true 2>/dev/null; then
        fail "drop_page_cache is set but $(id -un) can neither write /proc/sys/vm/drop_caches nor sudo without a password"
    fi
    rm -rf "$arm_dir/prometheus"
    mkdir -p "$arm_dir/prometheus"

    local versions
    versions=$(versions_json)
    build_argv "$port"
    ARGV_JSON=$(python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "${argv[@]}") \
    VERSIONS="$versions" SERVE_PORT="$port" RUN_ID="$RUN_ID" ARM="$ARM" NODE="$NODE" SIMULATED="$SIMULATED" MODEL="$MODEL" \
    TP="$TP" KV_CONFIG_PATH="$KV_CONFIG_PATH" CACHE_DIR="$CACHE_DIR" SHARED_DIR="${SHARED_DIR:-}" USE_ODIRECT="$USE_ODIRECT" \
    DROP_PAGE_CACHE="$DROP_PAGE_CACHE" PAGE_CACHE_METHOD="$PAGE_CACHE_METHOD" CACHE_DEVICE="${CACHE_DEVICE:-}" \
    CACHE_MOUNT="${CACHE_MOUNT:-}" python3 - "$arm_dir/manifest.json" <<'PY'
import json, os, sys, time
env = os.environ
manifest = {
    "schema": "fxpilot.manifest/1", "run_id": env["RUN_ID"], "arm": env["ARM"], "node": env["NODE"],
    "simulated": env["SIMULATED"] == "1", "hostname": os.uname().nodename, "model": env["MODEL"],
    "tensor_parallel_size": int(env["TP"]), "port": int(env["SERVE_PORT"]),
    "kv_connector": "LMCacheConnectorV1" if env["KV_CONFIG_PATH"] else None,
    "lmcache_config": env["KV_CONFIG_PATH"] or None, "cache_dir": env["CACHE_DIR"] or None,
    "shared_pool": env.get("SHARED_DIR") or None,
    "cache_device": env.get("CACHE_DEVICE") or None, "cache_mount": env.get("CACHE_MOUNT") or None,
    "page_cache": {"use_odirect": env["USE_ODIRECT"] == "1", "drop_page_cache": env["DROP_PAGE_CACHE"] == "1",
                   "method": env["PAGE_CACHE_METHOD"]},
    "command": json.loads(env["ARGV_JSON"]),
    "environment": {k: env[k] for k in ("VLLM_SERVER_DEV_MODE", "PROMETHEUS_MULTIPROC_DIR", "LMCACHE_CONFIG_FILE", "FXPILOT_SIM_TIME_SCALE") if env.get(k)},
    "versions": json.loads(env["VERSIONS"]), "prepared_at": time.time(),
}
if env.get("SIM_TIME_SCALE"):
    manifest["time_scale"] = float(env["SIM_TIME_SCALE"])
with open(sys.argv[1] + ".tmp", "w") as handle:
    json.dump(manifest, handle, indent=1, sort_keys=True)
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
PY
    say "preflight ok: $ARM on port $port"
    echo "FXPILOT_PORT=$port"
}

build_argv() {
    # --enable-prompt-tokens-details: without it vLLM reports no cached_tokens in usage, and the records lose the hits.
    argv=(vllm serve "$MODEL" --tensor-parallel-size "$TP" --host "$BIND_HOST" --port "$1" --enable-prompt-tokens-details)
    if [[ -n "$KV_CONFIG_PATH" ]]; then
        argv+=(--kv-transfer-config '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}')
    else
        # Full recompute: no KV connector and no GPU prefix cache either, so no prompt token is ever reused.
        argv+=(--no-enable-prefix-caching)
    fi
    argv+=("${EXTRA_VLLM_FLAGS[@]}")
}

# Only what the launch needs reaches vLLM; inherited LMCACHE_* variables would override the rendered file.
export_environment() {
    local name
    for name in $(compgen -e | grep '^LMCACHE_' || true); do unset "$name"; done
    export VLLM_SERVER_DEV_MODE=1
    export PROMETHEUS_MULTIPROC_DIR="$arm_dir/prometheus"
    if [[ -n "$KV_CONFIG_PATH" ]]; then
        export LMCACHE_CONFIG_FILE="$KV_CONFIG_PATH"
    fi
    if [[ -n "${SIM_TIME_SCALE:-}" ]]; then
        export FXPILOT_SIM_TIME_SCALE="$SIM_TIME_SCALE"
    fi
}

serve() {
    [[ -f "$port_file" ]] || fail "no port chosen yet; run preflight first"
    build_argv "$(cat "$port_file")"
    export_environment
    say "starting: ${argv[*]}"
    exec "${argv[@]}"
}

health() {
    local seconds=${3:-30} ended=${4:-} port deadline
    port=$(cat "$port_file")
    deadline=$(( $(date +%s) + seconds ))
    while :; do
        [[ -n "$ended" && -e "$ended" ]] && { say "the server has exited"; exit 4; }
        if command -v curl >/dev/null; then
            curl -fsS -m 5 -o /dev/null "http://$url_host:$port/health" 2>/dev/null && { say "healthy on port $port"; exit 0; }
        elif python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' \
                "http://$url_host:$port/health" 2>/dev/null; then
            say "healthy on port $port"
            exit 0
        fi
        [[ $(date +%s) -lt $deadline ]] || exit 3
        sleep 1
    done
}

cleanup() {
    if [[ -n "$CACHE_DIR" && -d "$CACHE_DIR" && "$CACHE_DIR" == */"$RUN_ID"* ]]; then
        rm -rf -- "$CACHE_DIR"
        say "removed $CACHE_DIR"
    fi
}

case "$action" in
    preflight) export_environment; preflight ;;
    serve) serve ;;
    health) health "$@" ;;
    cleanup) cleanup ;;
    *) fail "unknown action $action" ;;
esac
