#!/usr/bin/env bash
# Deploy one arm of a gate run on this node: preflight checks, the vLLM (+ LMCache) launch, health.
#
#   deploy.sh preflight ARM_DIR          check port, model, cache paths; write ARM_DIR/manifest.json
#   deploy.sh serve ARM_DIR              exec vllm serve (run detached by the runner)
#   deploy.sh health ARM_DIR SECONDS [EXIT_FILE]
#                                        wait up to SECONDS for /health: exit 0 up, 3 not yet, 4 EXIT_FILE appeared,
#                                        5 up but the server log shows LMCache failing to initialise or degraded
#   deploy.sh cleanup ARM_DIR            remove this arm's KV cache files
#
# ARM_DIR/params.env is written by runners/deploy.py with every value validated and shell-quoted:
# RUN_ID ARM NODE SIMULATED MODEL TP PORT CACHE_DIR KV_CONFIG_PATH KV_CONNECTOR USE_ODIRECT DROP_PAGE_CACHE
# PAGE_CACHE_METHOD MAX_LOCAL_DISK_SIZE SHARED_DIR EXTRA_VLLM_FLAGS (array) SIM_TIME_SCALE, and how vLLM is
# launched: LAUNCH_KIND ("" PATH, venv, conda, prefix) LAUNCH_VENV LAUNCH_CONDA LAUNCH_PREFIX (array)
# LAUNCH_ENV (array of NAME=value).
set -euo pipefail

fail() { echo "fxpilot: error: $*" >&2; exit 1; }
say() { echo "fxpilot: $*"; }

action=${1:-}
arm_dir=${2:-}
[[ -n "$action" && -f "$arm_dir/params.env" ]] || fail "usage: deploy.sh preflight|serve|health|cleanup ARM_DIR"
EXTRA_VLLM_FLAGS=()
LAUNCH_KIND="" LAUNCH_VENV="" LAUNCH_CONDA="" KV_CONNECTOR=""
LAUNCH_PREFIX=()
LAUNCH_ENV=()
# shellcheck source=/dev/null
source "$arm_dir/params.env"
[[ -n "$KV_CONNECTOR" || -z "$KV_CONFIG_PATH" ]] || KV_CONNECTOR=LMCacheConnectorV1
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

# The words that run a command where vLLM lives (deployment.launcher): a venv's bin first on PATH, inside a
# conda environment, or behind a prefix such as `docker run … IMAGE`.
launch_words() {
    launch=()
    case "$LAUNCH_KIND" in
        venv) launch=(env "PATH=$LAUNCH_VENV/bin:$PATH" "VIRTUAL_ENV=$LAUNCH_VENV") ;;
        conda)
            if [[ "$LAUNCH_CONDA" == /* ]]; then launch=(conda run --no-capture-output -p "$LAUNCH_CONDA")
            else launch=(conda run --no-capture-output -n "$LAUNCH_CONDA"); fi ;;
        prefix) launch=("${LAUNCH_PREFIX[@]}") ;;
    esac
}

in_engine() { launch_words; "${launch[@]}" "$@"; }

launch_what() {
    case "$LAUNCH_KIND" in
        venv) echo "the venv $LAUNCH_VENV" ;;
        conda) echo "the conda environment $LAUNCH_CONDA" ;;
        prefix) echo "the launch prefix ${LAUNCH_PREFIX[*]}" ;;
        *) echo "PATH" ;;
    esac
}

# Where vLLM lives, was it found: a clear error naming deployment.launcher, before anything is started.
check_engine() {
    case "$LAUNCH_KIND" in
        venv) [[ -x "$LAUNCH_VENV/bin/vllm" ]] || fail "$LAUNCH_VENV/bin/vllm does not exist on $(hostname) (deployment.launcher.venv)" ;;
        conda) command -v conda >/dev/null || fail "conda is not on PATH for $(id -un) on $(hostname) (deployment.launcher.conda)" ;;
        prefix) command -v "${LAUNCH_PREFIX[0]}" >/dev/null || fail "${LAUNCH_PREFIX[0]} is not on PATH for $(id -un) on $(hostname) (deployment.launcher.prefix)" ;;
        *) command -v vllm >/dev/null || fail "vllm is not on PATH for $(id -un) on $(hostname); name its venv, conda environment or container in deployment.launcher" ;;
    esac
}

# The python that runs vLLM: where the launcher puts it, or (vLLM on PATH) the interpreter the vllm command's
# first line names, so a vllm installed in a venv and linked onto PATH is still looked at in its own venv.
in_engine_python() {
    if [[ -z "$LAUNCH_KIND" ]]; then
        local vllm_path first=""
        vllm_path=$(command -v vllm 2>/dev/null || true)
        [[ -n "$vllm_path" && -r "$vllm_path" ]] && IFS= read -r first < "$vllm_path" || true
        if [[ "$first" =~ ^\#\!(/[^[:space:]]*/python[0-9.]*)$ && -x "${BASH_REMATCH[1]}" ]]; then
            "${BASH_REMATCH[1]}" "$@"
            return
        fi
    fi
    in_engine python3 "$@"
}

# vLLM's version from its distribution's metadata (importing vLLM, as `vllm --version` does, takes 10-30 s of
# CPU); `vllm --version` only when there is no such metadata. LMCache's from its files (LMCACHE_INSPECT).
versions_json() {
    local vllm_version rocm_version
    vllm_version=$(in_engine_python -c 'from importlib import metadata; print(metadata.version("vllm"))' 2>/dev/null | tail -n 1 || true)
    [[ -n "$vllm_version" ]] || vllm_version=$(in_engine vllm --version 2>/dev/null | tail -n 1 || true)
    [[ -n "$vllm_version" ]] || fail "vllm did not run from $(launch_what) on $(hostname): \`vllm --version\` printed nothing (deployment.launcher)"
    rocm_version=$(cat /opt/rocm/.info/version 2>/dev/null || true)
    [[ -n "$rocm_version" ]] || rocm_version=$(amd-smi version 2>/dev/null | sed -n 's/.*ROCm version: *\([0-9][0-9.]*\).*/\1/p' | head -n 1 || true)
    local lmcache
    lmcache=$(in_engine_python -c "$LMCACHE_INSPECT" 2>/dev/null | tail -n 1 || true)
    [[ "$lmcache" == "{"* ]] || lmcache='{"version": null, "commit": null, "hip": null, "error": "python3 did not run where vLLM lives"}'
    VLLM_VERSION="$vllm_version" ROCM_VERSION="$rocm_version" LMCACHE_JSON="$lmcache" python3 -c '
import json, os, platform
found = json.loads(os.environ["LMCACHE_JSON"])
lmcache = {key: found.get(key) for key in ("version", "commit", "hip")}
if found.get("error"):
    lmcache["error"] = found["error"]
print(json.dumps({"vllm": os.environ["VLLM_VERSION"] or None, "rocm": os.environ["ROCM_VERSION"] or None,
                  "lmcache": lmcache, "python": platform.python_version()}))'
}

# LMCache's version, commit and GPU runtime, read where vLLM lives without importing LMCache (its import pulls
# in torch) -- the same lookup as probe.sh's, kept identical (tests/deploy/test_lmcache_lookup.py):
# - version: the distribution's metadata, else lmcache/_version.py (setuptools-scm), else lmcache/__init__.py;
# - commit: a git install's direct_url.json (vcs_info.commit_id), else _version.py's __commit_id__ ("g3e11e108";
#   written by 0.3.9 and later, 0.5.x included; 0.3.1-0.3.3 release wheels record no commit at all), else a
#   +g<hash> local version, else an __init__.py __commit__;
# - GPU runtime: the library its native modules link (c_ops in 0.3.x; cuda_ops, lmcache_native in 0.5.x; 0.5.x
#   has no c_ops), read from the files: libamdhip64 is a HIP build, libcudart a CUDA one.
# LMCACHE_INSPECT begin
LMCACHE_INSPECT='
import ast, json, os, re, sys
try:
    from importlib import metadata
except ImportError:
    metadata = None
from importlib import util

def literals(path):
    """NAME = "value" assignments of a file, read without running it."""
    found = {}
    try:
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError, ValueError):
        return found
    for node in tree.body:
        if isinstance(node, ast.Assign):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                continue
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = value
    return found

lm = {"installed": False, "version": None, "commit": None, "commit_from": None, "hip": None, "native": None}
try:
    spec = util.find_spec("lmcache")
except (ImportError, ValueError) as exc:
    spec, lm["error"] = None, type(exc).__name__ + ": " + str(exc)
if spec is None:
    lm.setdefault("error", "no module named lmcache for " + sys.executable)
else:
    lm["installed"] = True
    folders = list(spec.submodule_search_locations or [])
    where = folders[0] if folders else os.path.dirname(spec.origin or "")
    lm["path"] = where
    ver = literals(os.path.join(where, "_version.py"))
    init = literals(os.path.join(where, "__init__.py"))
    dist = None
    if metadata is not None:
        try:
            dist = metadata.distribution("lmcache")
        except metadata.PackageNotFoundError:
            dist = None
    lm["version"] = (dist.version if dist is not None else None) or ver.get("__version__") or init.get("__version__")
    candidates = []
    if dist is not None:
        try:
            vcs = json.loads(dist.read_text("direct_url.json") or "{}").get("vcs_info") or {}
        except ValueError:
            vcs = {}
        candidates.append(("direct_url.json", vcs.get("commit_id")))
    candidates.append(("_version.py", ver.get("__commit_id__")))
    local = re.search(r"\+g?([0-9a-f]{7,40})(?:\.|$)", lm["version"] or "")
    candidates.append(("version", local.group(1) if local else None))
    candidates.append(("__init__.py", init.get("__commit__")))
    for source, value in candidates:
        if isinstance(value, str) and re.match(r"^g?[0-9a-f]{7,40}$", value):
            lm["commit"], lm["commit_from"] = re.sub(r"^g", "", value), source
            break
    # The GPU runtime the native modules link (c_ops in 0.3.x; cuda_ops, lmcache_native in 0.5.x), read from the
    # files themselves without loading them: libamdhip64 is a HIP build, libcudart a CUDA one.
    try:
        names = sorted(os.listdir(where))
    except OSError:
        names = []
    for name in names:
        if not re.match(r"^(c_ops|\w+_ops|lmcache_native)\b.*\.(so|py)$", name):
            continue
        runtime = None
        try:
            with open(os.path.join(where, name), "rb") as handle:
                tail = b""
                for block in iter(lambda: handle.read(1 << 20), b""):
                    chunk = tail + block
                    if b"amdhip64" in chunk:
                        runtime = True
                        break
                    if b"libcudart" in chunk:
                        runtime = False
                    tail = chunk[-16:]
        except OSError:
            continue
        if runtime is not None:
            lm["hip"], lm["native"] = runtime, name
            if runtime:
                break
print(json.dumps(lm))

'
# LMCACHE_INSPECT end

preflight() {
    local port="$PORT"
    if [[ "$MODEL" == /* ]] && [[ ! -e "$MODEL" ]]; then
        fail "the model path $MODEL does not exist on $(hostname) (deployment.model)"
    fi
    check_engine
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
    TP="$TP" KV_CONFIG_PATH="$KV_CONFIG_PATH" KV_CONNECTOR="$KV_CONNECTOR" LAUNCHER="$(launch_what)" CACHE_DIR="$CACHE_DIR" SHARED_DIR="${SHARED_DIR:-}" USE_ODIRECT="$USE_ODIRECT" \
    DROP_PAGE_CACHE="$DROP_PAGE_CACHE" PAGE_CACHE_METHOD="$PAGE_CACHE_METHOD" CACHE_DEVICE="${CACHE_DEVICE:-}" \
    CACHE_MOUNT="${CACHE_MOUNT:-}" python3 - "$arm_dir/manifest.json" <<'PY'
import json, os, sys, time
env = os.environ
manifest = {
    "schema": "fxpilot.manifest/1", "run_id": env["RUN_ID"], "arm": env["ARM"], "node": env["NODE"],
    "simulated": env["SIMULATED"] == "1", "hostname": os.uname().nodename, "model": env["MODEL"],
    "tensor_parallel_size": int(env["TP"]), "port": int(env["SERVE_PORT"]),
    "kv_connector": env["KV_CONNECTOR"] or None, "launcher": env["LAUNCHER"],
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
    if [[ "$KV_CONNECTOR" == ExampleConnector ]]; then
        # vLLM's reference connector: whole prompts' KV as files in the arm's cache directory.
        argv+=(--kv-transfer-config "$(CACHE_DIR="$CACHE_DIR" python3 -c 'import json, os; print(json.dumps({"kv_connector": "ExampleConnector", "kv_role": "kv_both", "kv_connector_extra_config": {"shared_storage_path": os.environ["CACHE_DIR"]}}))')")
    elif [[ -n "$KV_CONFIG_PATH" ]]; then
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
    local pair
    for pair in "${LAUNCH_ENV[@]}"; do export "${pair?}"; done
}

serve() {
    [[ -f "$port_file" ]] || fail "no port chosen yet; run preflight first"
    build_argv "$(cat "$port_file")"
    export_environment
    launch_words
    say "starting: ${launch[*]}${launch[*]:+ }${argv[*]}"
    exec "${launch[@]}" "${argv[@]}"
}

health() {
    local seconds=${3:-30} ended=${4:-} port deadline
    port=$(cat "$port_file")
    deadline=$(( $(date +%s) + seconds ))
    while :; do
        [[ -n "$ended" && -e "$ended" ]] && { say "the server has exited"; exit 4; }
        if command -v curl >/dev/null; then
            curl -fsS -m 5 -o /dev/null "http://$url_host:$port/health" 2>/dev/null && healthy "$port"
        elif python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' \
                "http://$url_host:$port/health" 2>/dev/null; then
            healthy "$port"
        fi
        [[ $(date +%s) -lt $deadline ]] || exit 3
        sleep 1
    done
}

# LMCache that fails to initialise does not stop vLLM: the server answers /health, every request waits
# for a lookup timeout and nothing is cached. Its log says so; an LMCache arm is not healthy then. The same
# expression is runners/deploy.py's LMCACHE_TROUBLE, which the runner reads during the run.
LMCACHE_FAILED='System will operate in degraded mode|entering degraded mode|No supported [A-Za-z]+ connector found|Failed to initiali[sz]e LMCache|Failed during post_init|LMCacheConnectorV1.*(Error|Exception):|LMCache (ERROR|WARNING):.*([Cc]onnection (refused|reset|lost|error|closed|timed out)|[Ff]ailed to connect|Ping (error|timeout))'

healthy() {
    local line
    if [[ "$KV_CONNECTOR" == LMCacheConnectorV1 ]]; then
        line=$(cat "$arm_dir"/server/stdout "$arm_dir"/server/stderr 2>/dev/null | sed 's/\x1b\[[0-9;]*m//g' \
            | grep -E -m 1 "$LMCACHE_FAILED" || true)
        if [[ -n "$line" ]]; then
            echo "fxpilot: error: LMCache failed to initialise (the server log says: ${line:0:300})" >&2
            exit 5
        fi
    fi
    say "healthy on port $1"
    exit 0
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
