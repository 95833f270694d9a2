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
# PAGE_CACHE_METHOD MAX_LOCAL_DISK_SIZE SHARED_DIR EXTRA_VLLM_FLAGS (array) SIM_TIME_SCALE PREFIX_CACHING, LMCache's DRAM tier
# (DRAM_GIB: max_local_cpu_size, GiB per TP rank; checked against the node's MemAvailable × TP ranks), its internal
# API server (LMCACHE_API_START: the scheduler's port, worker w on + 1 + w; each must be free), DISK_IO_THREADS
# (configured, or empty), EXPECTED_NONE_HASH (runners.lmcache.expected_none_hash), KV_BYTES_PER_TOKEN and
# KV_CACHE_DTYPE (the sizing preflight's, into the manifest's versions), the chunk hash
# (CHUNK_HASH: the algorithm the LMCache YAML names, HASH_SEED: the PYTHONHASHSEED exported to vLLM), the lines
# that show LMCache failing (LMCACHE_FAILED, runners.lmcache.LMCACHE_TROUBLE), and how vLLM is
# launched: LAUNCH_KIND ("" PATH, venv, conda, prefix) LAUNCH_VENV LAUNCH_CONDA LAUNCH_PREFIX (array)
# LAUNCH_ENV (array of NAME=value); COLD_START=1 for G1's measured cold start: vLLM's, TorchInductor's and Triton's
# compile caches are fresh empty directories under ARM_DIR/compile-cache, `serve` notes when it launched and the
# first healthy `health` writes the seconds from launch to /health into manifest.json (`cold_start`) and prints
# them as FXPILOT_COLD_START=<json>.
set -euo pipefail

fail() { echo "fxpilot: error: $*" >&2; exit 1; }
say() { echo "fxpilot: $*"; }

action=${1:-}
arm_dir=${2:-}
[[ -n "$action" && -f "$arm_dir/params.env" ]] || fail "usage: deploy.sh preflight|serve|health|cleanup ARM_DIR"
EXTRA_VLLM_FLAGS=()
LAUNCH_KIND="" LAUNCH_VENV="" LAUNCH_CONDA="" KV_CONNECTOR="" CHUNK_HASH="" HASH_SEED="" LMCACHE_FAILED="" COLD_START=0
DRAM_GIB="" LMCACHE_API_START="" DISK_IO_THREADS="" EXPECTED_NONE_HASH="" KV_BYTES_PER_TOKEN="" KV_CACHE_DTYPE=""
LAUNCH_PREFIX=()
LAUNCH_ENV=()
# shellcheck source=/dev/null
source "$arm_dir/params.env"
[[ -n "$KV_CONNECTOR" || -z "$KV_CONFIG_PATH" ]] || KV_CONNECTOR=LMCacheConnectorV1
# Without a fixed seed every process hashes chunks its own way; without the failure lines every log would pass.
[[ "$HASH_SEED" =~ ^[0-9]+$ ]] || fail "params.env sets no numeric HASH_SEED (the PYTHONHASHSEED of every arm)"
[[ -n "$LMCACHE_FAILED" ]] || fail "params.env sets no LMCACHE_FAILED (the lines that show LMCache failing)"
port_file="$arm_dir/port"
# G1's cold start: the compile caches it starts with (empty), when it was launched, its measurement.
compile_cache="$arm_dir/compile-cache"
COMPILE_CACHE_VARS=(VLLM_CACHE_ROOT TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR)
declare -A COMPILE_CACHE_DIRS=([VLLM_CACHE_ROOT]=vllm [TORCHINDUCTOR_CACHE_DIR]=torchinductor [TRITON_CACHE_DIR]=triton)
launched_file="$arm_dir/launched_at"
cold_start_file="$arm_dir/cold-start.json"
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
        prefix) launch=("${LAUNCH_PREFIX[@]}"); container_env ;;
    esac
}

# A container does not inherit the shell's environment: `docker|podman|nerdctl … run` gets `-e PYTHONHASHSEED`
# right after `run` (the value exported here), unless the prefix passes it on already; for G1's cold start also
# `-e` of each compile-cache variable (the container must see the run directory at the same path), and a prefix
# that sets one of those itself is refused: the start would not be cold. Any other prefix inherits them or not; the
# health check refuses a server whose log shows the seed missing (LMCACHE_FAILED).
container_env() {
    local i word name runtime="" passed
    local names=(PYTHONHASHSEED) wanted=()
    [[ "$COLD_START" == 1 ]] && names+=("${COMPILE_CACHE_VARS[@]}")
    for name in "${names[@]}"; do
        passed=0
        for word in "${launch[@]}"; do
            if [[ "$word" == "$name" ]]; then
                passed=1
            elif [[ "$word" == "$name"=* || "$word" == -e"$name"=* || "$word" == --env="$name"=* ]]; then
                [[ "$name" == PYTHONHASHSEED ]] || fail "deployment.launcher.prefix sets $name itself: G1's cold start needs its own empty compile caches"
                passed=1
            elif [[ "$word" == -e"$name" || "$word" == --env="$name" ]]; then
                passed=1
            fi
        done
        [[ "$passed" == 1 ]] || wanted+=(-e "$name")
    done
    [[ ${#wanted[@]} -gt 0 ]] || return 0
    for i in "${!launch[@]}"; do
        word=${launch[$i]##*/}
        if [[ -z "$runtime" ]]; then
            case "$word" in docker|podman|nerdctl) runtime=$word ;; esac
        elif [[ "${launch[$i]}" == run ]]; then
            launch=("${launch[@]:0:$((i + 1))}" "${wanted[@]}" "${launch[@]:$((i + 1))}")
            return 0
        fi
    done
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
    lmcache=$(in_engine_python -c "$LMCACHE_INSPECT" "${DISK_IO_THREADS:-}" 2>/dev/null | tail -n 1 || true)
    [[ "$lmcache" == "{"* ]] || lmcache='{"version": null, "commit": null, "hip": null, "error": "python3 did not run where vLLM lives"}'
    VLLM_VERSION="$vllm_version" ROCM_VERSION="$rocm_version" LMCACHE_JSON="$lmcache" python3 -c '
import json, os, platform
found = json.loads(os.environ["LMCACHE_JSON"])
lmcache = {key: found.get(key) for key in ("version", "commit", "hip")}
if found.get("error"):
    lmcache["error"] = found["error"]
print(json.dumps({"vllm": os.environ["VLLM_VERSION"] or None, "rocm": os.environ["ROCM_VERSION"] or None,
                  "lmcache": lmcache, "python": platform.python_version(),
                  "lmcache_fingerprint": found.get("fingerprint"), "lmcache_clear_api": found.get("clear_api")}))'
}

# The block device that holds DIR, by the name /proc/diskstats (FXPILOT_DISKSTATS) gives it: findmnt's SOURCE (df's
# when findmnt does not answer), symlinks resolved (/dev/mapper/x -> dm-0). Prints NAME, or nothing.
disk_device_of() {
    local source name stats=${FXPILOT_DISKSTATS:-/proc/diskstats}
    source=$(findmnt -no SOURCE --target "$1" 2>/dev/null | head -n 1 || true)
    [[ "$source" == /dev/* ]] || source=$(df -P "$1" 2>/dev/null | awk 'NR == 2 { print $1 }' || true)
    [[ "$source" == /dev/* ]] || return 0
    source=${source%%\[*}
    name=$(basename "$(readlink -f -- "$source" 2>/dev/null || echo "$source")")
    if [[ -r "$stats" ]] && ! awk -v n="$name" '$3 == n { f = 1 } END { exit !f }' "$stats"; then
        say "warning: $name (the device of $1) is not in $stats"
    fi
    echo "$name"
}

# LMCache's DRAM tier: every TP rank allocates max_local_cpu_size GiB of host memory; refused above MemAvailable.
check_memory() {
    [[ -n "$DRAM_GIB" ]] || return 0
    local meminfo=${FXPILOT_MEMINFO:-/proc/meminfo} available_kib need_bytes
    available_kib=$(awk '$1 == "MemAvailable:" { print $2 }' "$meminfo" 2>/dev/null || true)
    [[ "$available_kib" =~ ^[0-9]+$ ]] || fail "cannot read MemAvailable from $meminfo on $(hostname): LMCache's DRAM tier cannot be checked against the node's memory"
    need_bytes=$(python3 -c "print(int(float('$DRAM_GIB') * 1024 ** 3 * int('$TP')))")
    MEMORY_JSON=$(python3 -c "import json; print(json.dumps({'available_bytes': $available_kib * 1024, 'lmcache_dram_bytes': $need_bytes, 'meminfo': '$meminfo'}))")
    if (( need_bytes > available_kib * 1024 )); then
        fail "deployment.sizes.max_local_cpu_size is $DRAM_GIB GiB per rank: $TP ranks need $(python3 -c "print(f'{$need_bytes / 1024 ** 3:.2f} GiB ($need_bytes B)')") of LMCache DRAM, above the $(python3 -c "print(f'{$available_kib / 1024 ** 2:.2f} GiB ($(( available_kib * 1024 )) B)')") MemAvailable on $(hostname) ($meminfo)"
    fi
}

# LMCache's internal API server: the installed LMCache must serve DELETE /cache/clear (how a cold window empties the
# DRAM tier), and its ports (the scheduler's and one per TP worker) must be free.
check_lmcache_api() {
    [[ -n "$LMCACHE_API_START" && "$LMCACHE_API_START" != 0 ]] || return 0
    local clear port last clear_api clear_version
    clear=$(VERSIONS="$1" python3 -c 'import json, os; found = json.loads(os.environ["VERSIONS"]); print(found.get("lmcache_clear_api"), (found.get("lmcache") or {}).get("version"))')
    read -r clear_api clear_version <<< "$clear"
    # A simulated node's LMCache is a stand-in without the files; its simulated server serves the route itself.
    if [[ "$clear_api" != True && "$SIMULATED" != 1 ]]; then
        fail "LMCache ${clear_version:-(not found)} from $(launch_what) on $(hostname) serves no DELETE /cache/clear on its internal API server (LMCache PR #1711, merged 2025-09-28; 0.5.6 serves it): a cold window could not empty LMCache's DRAM tier; install a release that has it"
    fi
    last=$(( LMCACHE_API_START + TP ))
    for (( port = LMCACHE_API_START; port <= last; port++ )); do
        if port_in_use "$port"; then
            fail "port $port (LMCache's internal API server, ports $LMCACHE_API_START-$last) is already in use on $(hostname); stop what holds it or change deployment.ports.lmcache_api"
        fi
    done
}

# LMCache's version, commit and GPU runtime, read where vLLM lives without importing LMCache: lmcache_inspect.py,
# shipped beside this script (probe.sh runs the same file), given as text so a container launcher needs no mount.
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[[ -r "$HERE/lmcache_inspect.py" ]] || fail "lmcache_inspect.py is missing beside deploy.sh in $HERE"
LMCACHE_INSPECT=$(cat "$HERE/lmcache_inspect.py")

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
        # LMCache 0.5.6 writes its chunks from a disk worker whose failures nobody reads: a directory it cannot
        # write to (or, with O_DIRECT, a filesystem that refuses O_DIRECT) stores nothing and says nothing. So one
        # block is written here as LMCache would write it, and the deploy fails with what the write said.
        local test_file="$CACHE_DIR/.fxpilot-write-test" said
        local direct=()
        [[ "$USE_ODIRECT" == 1 ]] && direct=(oflag=direct)
        if ! said=$(dd if=/dev/zero of="$test_file" bs=4096 count=1 "${direct[@]}" 2>&1); then
            rm -f -- "$test_file" 2>/dev/null || true
            fail "LMCache cannot write its KV files to $CACHE_DIR${direct[*]:+ with O_DIRECT}: $(printf %s "$said" | grep -m 1 -v records || true)"
        fi
        rm -f -- "$test_file"
        local free_gb need_gb
        # Which device and mount hold the KV files: evidence that each cache arm used the disk it names.
        CACHE_DEVICE=$(df -P "$CACHE_DIR" 2>/dev/null | awk 'NR == 2 { print $1 }' || true)
        CACHE_MOUNT=$(df -P "$CACHE_DIR" 2>/dev/null | awk 'NR == 2 { print $NF }' || true)
        free_gb=$(df -Pk "$CACHE_DIR" 2>/dev/null | awk 'NR == 2 { printf "%d", $4 / 1048576 }' || true)
        need_gb=$(python3 -c "print(int($MAX_LOCAL_DISK_SIZE * $TP))")
        if [[ -n "$free_gb" && "$free_gb" -lt "$need_gb" ]]; then
            say "warning: $CACHE_DIR has ${free_gb} GiB free; $TP workers may fill up to ${need_gb} GiB (max_local_disk_size is GiB per worker)"
        fi
    fi
    if [[ -n "${SHARED_DIR:-}" ]]; then
        mkdir -p "$SHARED_DIR" || fail "cannot create the shared pool directory $SHARED_DIR on the FX mount"
    fi
    # The workload client drops the page cache itself, as the SSH user and without sudo (runners/remote/workload.py):
    # a user who could only sudo would get "page cache NOT dropped" before every cold read, and every run invalid.
    # (FXPILOT_DROP_CACHES names another file: the tests' stand-in, as FXPILOT_SYSFS does for probe.sh)
    local drop_caches=${FXPILOT_DROP_CACHES:-/proc/sys/vm/drop_caches}
    if [[ "$DROP_PAGE_CACHE" == 1 ]] && [[ ! -w "$drop_caches" ]]; then
        fail "drop_page_cache is set but $(id -un) cannot write $drop_caches, and the workload client drops the page cache as $(id -un) without sudo: connect as root or set use_odirect instead"
    fi
    rm -rf "$arm_dir/prometheus"
    mkdir -p "$arm_dir/prometheus"
    rm -f -- "$launched_file" "$cold_start_file"
    if [[ "$COLD_START" == 1 ]]; then
        local name
        rm -rf -- "$compile_cache"
        for name in "${COMPILE_CACHE_VARS[@]}"; do
            mkdir -p "$compile_cache/${COMPILE_CACHE_DIRS[$name]}" || fail "cannot create the empty compile cache $compile_cache/${COMPILE_CACHE_DIRS[$name]}"
        done
    fi

    local versions
    versions=$(versions_json)
    if [[ -n "$KV_CONFIG_PATH" ]]; then
        check_memory
        check_lmcache_api "$versions"
    fi
    DISK_DEVICE=""
    [[ -n "$CACHE_DIR" ]] && DISK_DEVICE=$(disk_device_of "$CACHE_DIR" | tail -n 1)
    build_argv "$port"
    ARGV_JSON=$(python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "${argv[@]}") \
    VERSIONS="$versions" SERVE_PORT="$port" RUN_ID="$RUN_ID" ARM="$ARM" NODE="$NODE" SIMULATED="$SIMULATED" MODEL="$MODEL" \
    TP="$TP" KV_CONFIG_PATH="$KV_CONFIG_PATH" KV_CONNECTOR="$KV_CONNECTOR" CHUNK_HASH="$CHUNK_HASH" LAUNCHER="$(launch_what)" CACHE_DIR="$CACHE_DIR" SHARED_DIR="${SHARED_DIR:-}" USE_ODIRECT="$USE_ODIRECT" \
    DROP_PAGE_CACHE="$DROP_PAGE_CACHE" PAGE_CACHE_METHOD="$PAGE_CACHE_METHOD" CACHE_DEVICE="${CACHE_DEVICE:-}" \
    CACHE_MOUNT="${CACHE_MOUNT:-}" SIM_TIME_SCALE="${SIM_TIME_SCALE:-}" DISK_DEVICE="${DISK_DEVICE:-}" \
    MEMORY_JSON="${MEMORY_JSON:-}" DRAM_GIB="$DRAM_GIB" LMCACHE_API_START="$LMCACHE_API_START" \
    EXPECTED_NONE_HASH="$EXPECTED_NONE_HASH" KV_BYTES_PER_TOKEN="$KV_BYTES_PER_TOKEN" KV_CACHE_DTYPE="$KV_CACHE_DTYPE" \
    python3 - "$arm_dir/manifest.json" <<'PY'
import json, os, sys, time
env = os.environ
manifest = {
    "schema": "fxpilot.manifest/1", "run_id": env["RUN_ID"], "arm": env["ARM"], "node": env["NODE"],
    "simulated": env["SIMULATED"] == "1", "hostname": os.uname().nodename, "model": env["MODEL"],
    "tensor_parallel_size": int(env["TP"]), "port": int(env["SERVE_PORT"]),
    "kv_connector": env["KV_CONNECTOR"] or None, "launcher": env["LAUNCHER"],
    "lmcache_config": env["KV_CONFIG_PATH"] or None, "cache_dir": env["CACHE_DIR"] or None,
    "chunk_hash": {"algorithm": env["CHUNK_HASH"] or None, "pythonhashseed": env.get("PYTHONHASHSEED")},
    "shared_pool": env.get("SHARED_DIR") or None,
    "cache_device": env.get("CACHE_DEVICE") or None, "cache_mount": env.get("CACHE_MOUNT") or None,
    "page_cache": {"use_odirect": env["USE_ODIRECT"] == "1", "drop_page_cache": env["DROP_PAGE_CACHE"] == "1",
                   "method": env["PAGE_CACHE_METHOD"]},
    "command": json.loads(env["ARGV_JSON"]),
    "environment": {k: env[k] for k in ("VLLM_SERVER_DEV_MODE", "PROMETHEUS_MULTIPROC_DIR", "LMCACHE_CONFIG_FILE", "PYTHONHASHSEED", "FXPILOT_SIM_TIME_SCALE", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR") if env.get(k)},
    "versions": json.loads(env["VERSIONS"]), "prepared_at": time.time(),
    "disk_device": env.get("DISK_DEVICE") or None,
    "lmcache_dram": {"max_local_cpu_size_gib": float(env["DRAM_GIB"]) if env.get("DRAM_GIB") else None,
                     "memory": json.loads(env["MEMORY_JSON"]) if env.get("MEMORY_JSON") else None},
    "lmcache_api_port_start": int(env["LMCACHE_API_START"]) if env.get("LMCACHE_API_START") else None,
}
if env.get("EXPECTED_NONE_HASH"):
    manifest["versions"]["none_hash"] = {"expected": env["EXPECTED_NONE_HASH"], "observed": []}
if env.get("KV_BYTES_PER_TOKEN"):
    manifest["versions"]["kv_bytes_per_token"] = int(env["KV_BYTES_PER_TOKEN"])
    manifest["versions"]["kv_cache_dtype"] = env.get("KV_CACHE_DTYPE") or None
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
        # Full recompute: no KV connector, and no GPU prefix cache either (no prompt token is ever reused) unless
        # PREFIX_CACHING=1: G4's recompute arm is vLLM as a customer runs it without a KV tier, prefix cache on.
        [[ "${PREFIX_CACHING:-}" == 1 ]] || argv+=(--no-enable-prefix-caching)
    fi
    argv+=("${EXTRA_VLLM_FLAGS[@]}")
}

# Only what the launch needs reaches vLLM; inherited LMCACHE_* variables would override the rendered file.
export_environment() {
    local name
    for name in $(compgen -e | grep '^LMCACHE_' || true); do unset "$name"; done
    export VLLM_SERVER_DEV_MODE=1
    # The chunk hash's seed (CHUNK_HASH's comment above): one value in every process of every arm on every node.
    export PYTHONHASHSEED="$HASH_SEED"
    export PROMETHEUS_MULTIPROC_DIR="$arm_dir/prometheus"
    if [[ -n "$KV_CONFIG_PATH" ]]; then
        export LMCACHE_CONFIG_FILE="$KV_CONFIG_PATH"
    fi
    if [[ -n "${SIM_TIME_SCALE:-}" ]]; then
        export FXPILOT_SIM_TIME_SCALE="$SIM_TIME_SCALE"
    fi
    local pair name
    for pair in "${LAUNCH_ENV[@]}"; do export "${pair?}"; done
    # after launcher.env: a cold start's caches are its own empty ones, whatever the settings name
    if [[ "$COLD_START" == 1 ]]; then
        for name in "${COMPILE_CACHE_VARS[@]}"; do export "$name=$compile_cache/${COMPILE_CACHE_DIRS[$name]}"; done
    fi
}

serve() {
    [[ -f "$port_file" ]] || fail "no port chosen yet; run preflight first"
    build_argv "$(cat "$port_file")"
    export_environment
    launch_words
    if [[ "$COLD_START" == 1 ]]; then
        local name dir
        for name in "${COMPILE_CACHE_VARS[@]}"; do
            dir="$compile_cache/${COMPILE_CACHE_DIRS[$name]}"
            [[ -d "$dir" && -z "$(ls -A -- "$dir")" ]] || fail "the compile cache $dir is not empty: this start would not be cold"
        done
        say "cold start: empty compile caches under $compile_cache"
    fi
    say "starting: ${launch[*]}${launch[*]:+ }${argv[*]}"
    date +%s.%N > "$launched_file"
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
# for a lookup timeout and nothing is cached. Its log says so; an LMCache arm is not healthy then. So is one
# whose chunk hash is not the stated one (Python's salted hash(), a random first block hash): it would store
# and never hit. The lines are params.env's LMCACHE_FAILED, the runner's LMCACHE_TROUBLE, read during the run too.

healthy() {
    local line
    if [[ "$KV_CONNECTOR" == LMCacheConnectorV1 ]]; then
        line=$(cat "$arm_dir"/server/stdout "$arm_dir"/server/stderr 2>/dev/null | sed 's/\x1b\[[0-9;]*m//g' \
            | grep -E -m 1 "$LMCACHE_FAILED" || true)
        if [[ -n "$line" ]]; then
            echo "fxpilot: error: LMCache failed to initialise (the server log says: ${line:0:300})" >&2
            exit 5
        fi
        lmcache_observed
    fi
    [[ "$COLD_START" == 1 ]] && cold_start_measured
    say "healthy on port $1"
    exit 0
}

# What LMCache's processes say at /health: each one's first block hash (`Initialized NONE_HASH=…`) and whether its
# disk tier reads with O_DIRECT (`Using O_DIRECT for disk I/O: True|False`), with the process that said it (vLLM's
# `(EngineCore_DP0 pid=…)` / `(Worker… pid=…)` prefix, else the log file and line). Into manifest.json
# (versions.none_hash.observed, versions.odirect_observed) and printed as FXPILOT_LMCACHE_OBSERVED=<json>.
lmcache_observed() {
    python3 - "$arm_dir/manifest.json" "$arm_dir"/server/stdout "$arm_dir"/server/stderr <<'PY'
import json, os, re, sys
ansi = re.compile(r"\x1b\[[0-9;]*m")
hashes, odirect = [], []
for path in sys.argv[2:]:
    try:
        handle = open(path, encoding="utf-8", errors="replace")
    except OSError:
        continue
    with handle:
        for number, line in enumerate(handle, 1):
            line = ansi.sub("", line)
            if "NONE_HASH=" not in line and "O_DIRECT for disk I/O" not in line:
                continue
            prefix = re.match(r"^\s*\(([^)]*pid=\d+)\)", line)
            process = prefix.group(1) if prefix else f"{os.path.basename(path)}:{number}"
            found = re.search(r"Initialized NONE_HASH=(-?[0-9]+)", line)
            if found:
                hashes.append({"process": process, "value": found.group(1)})
            found = re.search(r"Using O_DIRECT for disk I/O: (True|False)", line)
            if found:
                odirect.append({"process": process, "value": found.group(1) == "True"})
try:
    with open(sys.argv[1]) as handle:
        manifest = json.load(handle)
except (OSError, ValueError):
    manifest = None
none_hash = dict(((manifest or {}).get("versions") or {}).get("none_hash") or {})
none_hash["observed"] = hashes
if manifest is not None:
    versions = manifest.setdefault("versions", {})
    versions["none_hash"] = none_hash
    versions["odirect_observed"] = odirect
    with open(sys.argv[1] + ".tmp", "w") as handle:
        json.dump(manifest, handle, indent=1, sort_keys=True)
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
print("FXPILOT_LMCACHE_OBSERVED=" + json.dumps({"none_hash": none_hash, "odirect": odirect}, sort_keys=True))
PY
}

# The first healthy look of a cold start: the seconds from serve's launch to this answer, measured here on the node
# (the looks are a second apart; the runner's own polling adds nothing), into manifest.json and cold-start.json.
cold_start_measured() {
    local healthy_at
    healthy_at=$(date +%s.%N)
    if [[ ! -s "$cold_start_file" ]]; then
        [[ -s "$launched_file" ]] || fail "the server answers but serve noted no launch time ($launched_file)"
        LAUNCHED_AT=$(cat "$launched_file") HEALTHY_AT="$healthy_at" COMPILE_CACHE="$compile_cache" \
        python3 - "$arm_dir/manifest.json" "$cold_start_file" <<'PY'
import json, os, sys, time
launched, healthy = float(os.environ["LAUNCHED_AT"]), float(os.environ["HEALTHY_AT"])
with open(sys.argv[1]) as handle:
    manifest = json.load(handle)
root = os.environ["COMPILE_CACHE"]
record = {"seconds": round(healthy - launched, 3), "caches": "empty", "launched_at": launched, "healthy_at": healthy,
          "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(healthy)),
          "compile_caches": {name: f"{root}/{sub}" for name, sub in (("VLLM_CACHE_ROOT", "vllm"),
                             ("TORCHINDUCTOR_CACHE_DIR", "torchinductor"), ("TRITON_CACHE_DIR", "triton"))},
          "model": manifest["model"], "tensor_parallel_size": manifest["tensor_parallel_size"],
          "simulated": manifest["simulated"], "time_scale": manifest.get("time_scale")}
manifest["cold_start"] = record
for path, data in ((sys.argv[2], record), (sys.argv[1], manifest)):
    with open(path + ".tmp", "w") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)
PY
    fi
    echo "FXPILOT_COLD_START=$(python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1])), sort_keys=True))' "$cold_start_file")"
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
