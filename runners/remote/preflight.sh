#!/usr/bin/env bash
# fxpilot G1 preflight: check, before anything is deployed, everything a gate needs from this node, and report
# every finding (not only the first) as one line of --out DIR/preflight.tsv: CHECK<TAB>SUBJECT<TAB>STATUS<TAB>DETAIL.
# Needs only bash and coreutils; runners/preflight.py turns the lines into the list of blockers.
#
# usage: preflight.sh --out DIR --model MODEL --fx-mount DIR --local-path DIR --run-root DIR
#                     [--port N]... [--fx-transport rdma|tcp --fx-address A --fx-port N --fx-nqn NQN]
#                     [--vllm WORD]... (the words that launch vLLM; default: vllm) [--drop-page-cache]
#                     [--lmcache-dram-bytes N] (LMCache's DRAM tier over all TP ranks: checked against MemAvailable)
set -u

out="" model="" fx_mount="" local_path="" run_root="" fx_transport="" fx_address="" fx_port="4420" fx_nqn=""
ports=() vllm=() drop_page_cache=0 lmcache_dram_bytes=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --fx-mount) fx_mount=$2; shift 2 ;;
    --local-path) local_path=$2; shift 2 ;;
    --run-root) run_root=$2; shift 2 ;;
    --port) ports+=("$2"); shift 2 ;;
    --fx-transport) fx_transport=$2; shift 2 ;;
    --fx-address) fx_address=$2; shift 2 ;;
    --fx-port) fx_port=$2; shift 2 ;;
    --fx-nqn) fx_nqn=$2; shift 2 ;;
    --vllm) vllm+=("$2"); shift 2 ;;
    --drop-page-cache) drop_page_cache=1; shift ;;
    --lmcache-dram-bytes) lmcache_dram_bytes=$2; shift 2 ;;
    *) echo "preflight.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$out" ] || [ -z "$model" ] || [ -z "$fx_mount" ] || [ -z "$local_path" ] || [ -z "$run_root" ]; then
  echo "preflight.sh: --out, --model, --fx-mount, --local-path and --run-root are required" >&2; exit 2
fi
[ ${#vllm[@]} -gt 0 ] || vllm=(vllm)
mkdir -p "$out" || exit 2
report="$out/preflight.tsv"
: > "$report"

# one finding; tabs and line breaks in the detail become spaces
finding() {
  local detail=${4:-}
  detail=${detail//$'\t'/ }; detail=${detail//$'\n'/ }; detail=${detail//$'\r'/ }
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${detail:0:400}" >> "$report"
  echo "preflight: $1 $2: $3${detail:+ ($detail)}"
}

simulated=${FXPILOT_SIMULATED:-0}
sudo_cmd=()
# G4's FX path cut runs `sudo -n ip link set` (root too: sudo never asks root for a password), so sudo must be
# there and password-less. A simulated node's user is never root: its simulated sudo is checked like a real one.
if [ "$(id -u)" -eq 0 ] && [ "$simulated" != 1 ]; then
  finding sudo root ok "running as root"
  command -v sudo > /dev/null 2>&1 || finding tool sudo missing "the FX path cut runs ip link set through sudo -n"
elif ! command -v sudo > /dev/null 2>&1; then
  finding tool sudo missing
  finding sudo nopasswd missing "sudo is not installed"
elif sudo -n true 2> /dev/null; then
  finding sudo nopasswd ok
  sudo_cmd=(sudo -n)
else
  finding sudo nopasswd denied "$(sudo -n true 2>&1 | tail -n 1)"
fi

# deployment.drop_page_cache: the workload client drops the page cache before each cold read as the SSH user,
# without sudo (runners/remote/workload.py), so that user must be able to write drop_caches itself.
if [ "$drop_page_cache" = 1 ]; then
  drop_caches=${FXPILOT_DROP_CACHES:-/proc/sys/vm/drop_caches}
  if [ -w "$drop_caches" ]; then finding pagecache drop ok "$drop_caches"
  else finding pagecache drop denied "$(id -un) cannot write $drop_caches"; fi
fi

# --- LMCache's DRAM tier: every TP rank allocates max_local_cpu_size of host memory --------------------------------
# (a simulated node allocates none: its simulated server only counts chunks)
if [ -n "$lmcache_dram_bytes" ]; then
  meminfo=${FXPILOT_MEMINFO:-/proc/meminfo}
  available_kib=$(awk '$1 == "MemAvailable:" { print $2 }' "$meminfo" 2> /dev/null)
  if [ "$simulated" = 1 ] && [ -z "${FXPILOT_MEMINFO:-}" ]; then
    finding memory lmcache skipped "simulated node"
  elif ! [[ "$available_kib" =~ ^[0-9]+$ ]]; then
    finding memory lmcache unknown "no MemAvailable in $meminfo"
  elif [ "$lmcache_dram_bytes" -gt $(( available_kib * 1024 )) ]; then
    finding memory lmcache short "$lmcache_dram_bytes $(( available_kib * 1024 ))"
  else
    finding memory lmcache ok "$lmcache_dram_bytes $(( available_kib * 1024 ))"
  fi
fi

# --- the tools the probe and the deploy run ---------------------------------------------------------------------
for tool in amd-smi rocm-smi nvme fio ethtool ibv_devinfo rdma ip python3 mount tar sha256sum; do
  if path=$(command -v "$tool" 2> /dev/null); then finding tool "$tool" ok "$path"; else finding tool "$tool" missing; fi
done

# --- vLLM, as the deployment launches it ------------------------------------------------------------------------
if command -v "${vllm[0]}" > /dev/null 2>&1; then
  if version=$(timeout 300 "${vllm[@]}" --version 2>&1 < /dev/null); then
    finding vllm version ok "$(printf '%s\n' "$version" | tail -n 1)"
  else
    finding vllm version failed "$(printf '%s\n' "$version" | tail -n 1)"
  fi
else
  finding vllm command missing "${vllm[0]}"
fi

# --- the model, already on the node (a gate never downloads it) -------------------------------------------------
case "$model" in
  /*)
    if [ -f "$model/config.json" ]; then finding model path ok "$model"; else finding model path missing "$model"; fi ;;
  *)
    hub=${HF_HUB_CACHE:-${HUGGINGFACE_HUB_CACHE:-${HF_HOME:-$HOME/.cache/huggingface}/hub}}
    folder="$hub/models--${model//\//--}"
    found=""
    for snapshot in "$folder"/snapshots/*/; do
      [ -f "$snapshot/config.json" ] && { found=$snapshot; break; }
    done
    if [ -n "$found" ]; then finding model cache ok "$found"; else finding model cache missing "$folder"; fi ;;
esac

# --- ports the servers will listen on ---------------------------------------------------------------------------
listening() {  # is anything listening on TCP port $1 (IPv4 or IPv6)?
  local hex
  hex=$(printf '%04X' "$1")
  awk -v p=":$hex" 'FNR > 1 && $4 == "0A" && substr($2, length($2) - 4) == p {found = 1} END {exit !found}' \
    /proc/net/tcp /proc/net/tcp6 2> /dev/null
}
for port in ${ports[@]+"${ports[@]}"}; do
  if listening "$port"; then finding port "$port" busy; else finding port "$port" ok; fi
done

# --- the FX target --------------------------------------------------------------------------------------------
if [ -n "$fx_address" ]; then
  target="$fx_address:$fx_port"
  if command -v nvme > /dev/null 2>&1; then
    if [ -n "$fx_nqn" ] && nvme list-subsys -o json 2> /dev/null | grep -qF "\"$fx_nqn\""; then
      finding fx target connected "$target"
    elif discovered=$(timeout 60 ${sudo_cmd[@]+"${sudo_cmd[@]}"} nvme discover -t "${fx_transport:-rdma}" -a "$fx_address" \
                        -s "$fx_port" 2>&1); then
      if [ -z "$fx_nqn" ] || printf '%s\n' "$discovered" | awk -v n="$fx_nqn" '$1 == "subnqn:" && $2 == n {f = 1} END {exit !f}'; then
        finding fx target ok "$target"
      else
        finding fx target not-offered "$target"
      fi
    else
      finding fx target unreachable "$target: $(printf '%s\n' "$discovered" | tail -n 1)"
    fi
  elif [ "${fx_transport:-rdma}" = tcp ]; then
    if timeout 5 bash -c "exec 3<>/dev/tcp/$fx_address/$fx_port" 2> /dev/null; then
      finding fx target ok "$target (TCP)"
    else
      finding fx target unreachable "$target: no TCP connection within 5 s"
    fi
  elif [ -z "$(ls -A "${FXPILOT_SYSFS:-/sys}/class/infiniband" 2> /dev/null)" ]; then
    finding fx target unreachable "$target: no RDMA device on this node (${FXPILOT_SYSFS:-/sys}/class/infiniband is empty)"
  elif command -v ping > /dev/null 2>&1 && ! ping -c 1 -W 2 "$fx_address" > /dev/null 2>&1; then
    finding fx target unreachable "$target: no answer to ping"
  else
    finding fx target unknown "$target: nvme-cli is needed to ask the target"
  fi
fi

# --- mount points and folders -----------------------------------------------------------------------------------
folder_check() {  # NAME PATH: a folder that exists, or that its nearest existing parent lets us (or sudo) create
  local name=$1 path=$2 parent
  if [ -e "$path" ] && [ ! -d "$path" ]; then finding mount "$name" notdir "$path"; return; fi
  if [ -d "$path" ]; then
    if [ -w "$path" ] || [ ${#sudo_cmd[@]} -gt 0 ]; then finding mount "$name" ok "$path"; else finding mount "$name" readonly "$path"; fi
    return
  fi
  parent=$path
  while [ ! -e "$parent" ] && [ "$parent" != / ]; do parent=$(dirname "$parent"); done
  if [ -d "$parent" ] && { [ -w "$parent" ] || [ ${#sudo_cmd[@]} -gt 0 ]; }; then
    finding mount "$name" absent "$path"
  else
    finding mount "$name" blocked "$path (cannot be created under $parent)"
  fi
}
folder_check fx_mount "$fx_mount"
folder_check local_nvme_path "$local_path"
folder_check run_root "$run_root"

echo "preflight: done"
