#!/usr/bin/env bash
# fxpilot G1 probe: run the node's own tools and keep each raw output in one file of --out.
# Needs only bash and the tools a ROCm GPU node has; parsing happens in fxpilot (runners/inventory.py).
# Writes index.tsv (name, exit code, seconds) and SHA256SUMS, so every file can be re-hashed later, and packs
# the directory into probe-out.tar next to it.
#
# usage: probe.sh --out DIR --fx-mount DIR --local-path DIR [--fio-size 4G] [--fio-runtime 30] [--python python3]
set -u

out="" fx_mount="" local_path="" fio_size="4G" fio_runtime="30" py="${FXPILOT_PROBE_PYTHON:-python3}" py_given=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --fx-mount) fx_mount=$2; shift 2 ;;
    --local-path) local_path=$2; shift 2 ;;
    --fio-size) fio_size=$2; shift 2 ;;
    --fio-runtime) fio_runtime=$2; shift 2 ;;
    --python) py=$2; py_given=1; shift 2 ;;
    *) echo "probe.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$out" ] || [ -z "$fx_mount" ] || [ -z "$local_path" ]; then
  echo "probe.sh: --out, --fx-mount and --local-path are required" >&2; exit 2
fi
sysfs="${FXPILOT_SYSFS:-/sys}"
mkdir -p "$out"
: > "$out/index.tsv"

# capture NAME COMMAND...: stdout to NAME, stderr to NAME.err, one index line; never stops the probe.
capture() {
  local name=$1; shift
  local start end rc
  start=$(date +%s.%N)
  "$@" > "$out/$name" 2> "$out/$name.err" < /dev/null
  rc=$?
  end=$(date +%s.%N)
  [ -s "$out/$name.err" ] || rm -f "$out/$name.err"
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.3f", b-a}')" >> "$out/index.tsv"
  echo "probe: $name (exit $rc)"
}

rocm_version() { cat /opt/rocm/.info/version; }

# --python names the interpreter vLLM is launched with (a venv's, a conda environment's): ask it first.
vllm_version() {
  if [ -z "$py_given" ] && command -v vllm > /dev/null; then vllm --version
  else "$py" -c 'import vllm; print(vllm.__version__)'; fi
}

# LMCache's version, commit and GPU runtime without importing it: lmcache_inspect.py, shipped beside this script
# (deploy.sh runs the same file).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
lmcache_info() { "$py" -c "$(cat "$here/lmcache_inspect.py")"; }

ethtool_all() {
  local dev
  for dev in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1); do
    [ "$dev" = "lo" ] && continue
    ethtool "$dev"
  done
}

nvme_pcie() {
  local c
  for c in "$sysfs"/class/nvme/nvme*; do
    [ -e "$c" ] || continue
    printf '%s transport=%s speed=%s width=%s\n' "$(basename "$c")" "$(cat "$c/transport" 2>/dev/null)" \
      "$(cat "$c/device/current_link_speed" 2>/dev/null | tr ' ' '_')" "$(cat "$c/device/current_link_width" 2>/dev/null)"
  done
}

is_mounted() { mount | awk -v p="$1" '$2 == "on" && $3 == p {found=1} END {exit !found}'; }

fx_write() {
  local probe_file="$fx_mount/.fxpilot-probe-write.$$"
  if ! is_mounted "$fx_mount"; then echo "mounted=no writable=no path=$fx_mount"; return 3; fi
  if printf 'fxpilot probe %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" > "$probe_file" && grep -q fxpilot "$probe_file"; then
    rm -f "$probe_file"; echo "mounted=yes writable=yes path=$fx_mount"
  else
    rm -f "$probe_file"; echo "mounted=yes writable=no path=$fx_mount"; return 1
  fi
}

fio_read() {
  local dir=$1 name=$2
  mkdir -p "$dir" || return 1
  fio --name="$name" --filename="$dir/.fxpilot-probe.fio" --rw=read --bs=1M --direct=1 --ioengine=libaio --iodepth=32 \
    --numjobs=4 --size="$fio_size" --runtime="$fio_runtime" --time_based --group_reporting --output-format=json
  local rc=$?
  rm -f "$dir/.fxpilot-probe.fio"
  return $rc
}

fio_fx() {
  if ! is_mounted "$fx_mount"; then echo "probe: FX is not mounted at $fx_mount; fio skipped" >&2; return 3; fi
  fio_read "$fx_mount" fx-seqread
}

capture uname.txt uname -a
capture amd-smi-version.txt amd-smi version
capture amd-smi-static.json amd-smi static --json
capture amd-smi-list.json amd-smi list --json
capture rocm-smi.json rocm-smi --showproductname --showmeminfo vram --showdriverversion --json
capture rocm-version.txt rocm_version
capture vllm-version.txt vllm_version
capture lmcache.json lmcache_info
capture ip-link.json ip -j link show
capture ethtool.txt ethtool_all
capture ibv_devinfo.txt ibv_devinfo
capture rdma-link.json rdma -j link show
capture nvme-list.json nvme list -o json
capture nvme-list-subsys.json nvme list-subsys -o json
capture nvme-pcie.txt nvme_pcie
capture mounts.txt mount
capture fx-write.txt fx_write
capture fio-fx.json fio_fx
capture fio-local.json fio_read "$local_path" local-seqread
capture nproc.txt nproc
capture free.txt free -b
capture df.txt df -P -B1 / "$local_path" "$fx_mount"
cd "$out" && sha256sum -- * > SHA256SUMS.part && mv SHA256SUMS.part SHA256SUMS
# one archive to fetch instead of a file at a time; every file is checked against SHA256SUMS on arrival
tar -cf ../probe-out.tar.part -- * && mv ../probe-out.tar.part ../probe-out.tar
echo "probe: done"
