#!/usr/bin/env bash
# Attach the FX array over NVMe-oF RDMA and mount it; detach on teardown only what this run attached.
#
#   attach_fx.sh attach PARAMS_ENV USER_TAG   connect + check rdma + mount + write test
#   attach_fx.sh detach PARAMS_ENV USER_TAG   undo what attach did, once the last user has left
#
# PARAMS_ENV is written by runners/deploy.py with every value validated and shell-quoted: FX_ADDRESS,
# FX_SERVICE_ID, FX_NQN, FX_HOST_NQN, FX_FSTYPE, FX_MOUNT, MKFS_IF_EMPTY, RUN_DIR.
# What this run did is kept in $RUN_DIR/fx-attach.json, so a retried or resumed teardown knows.
set -euo pipefail

fail() { echo "fxpilot: error: $*" >&2; exit 1; }
say() { echo "fxpilot: $*"; }

action=${1:-}
params=${2:-}
user_tag=${3:-default}
[[ -n "$action" && -f "$params" ]] || fail "usage: attach_fx.sh attach|detach PARAMS_ENV [USER_TAG]"
# shellcheck source=/dev/null
source "$params"
record="$RUN_DIR/fx-attach.json"
mkdir -p "$RUN_DIR"

# Attaching needs root: use password-less sudo when the SSH user is not root (a simulated node needs neither).
SUDO=()
if [[ $EUID -ne 0 && "${FXPILOT_SIMULATED:-0}" != 1 ]] && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
fi

host_nqn_args=()
[[ -n "${FX_HOST_NQN:-}" ]] && host_nqn_args=(--hostnqn "$FX_HOST_NQN")

# The record: {"nqn", "mount", "namespace", "mount_id", "connected_by_run", "mounted_by_run", "users": [...],
# "detached"}.
record_get() {
    python3 - "$record" "$1" <<'PY'
import json, sys
try:
    data = json.load(open(sys.argv[1]))
except FileNotFoundError:
    data = {}
value = data.get(sys.argv[2])
print("" if value is None else (json.dumps(value) if isinstance(value, (list, dict)) else str(value).lower() if isinstance(value, bool) else value))
PY
}

record_set() {
    python3 - "$record" "$@" <<'PY'
import json, os, sys
path, pairs = sys.argv[1], sys.argv[2:]
try:
    data = json.load(open(path))
except FileNotFoundError:
    data = {"users": []}
for pair in pairs:
    key, _, value = pair.partition("=")
    if key == "+user":
        data["users"] = sorted(set(data.get("users", [])) | {value})
    elif key == "-user":
        data["users"] = sorted(set(data.get("users", [])) - {value})
    else:
        data[key] = {"true": True, "false": False}.get(value, value)
tmp = path + ".tmp"
with open(tmp, "w") as handle:
    json.dump(data, handle, indent=1, sort_keys=True)
os.replace(tmp, path)
print(len(data.get("users", [])))
PY
}

# Where FX_MOUNT is mounted now: prints "DEVICE FSTYPE" or nothing (util-linux `mount` output).
mounted_device() {
    mount | python3 -c '
import sys
target = sys.argv[1]
for line in sys.stdin:
    parts = line.split()
    if len(parts) >= 5 and parts[1] == "on" and parts[2] == target and parts[3] == "type":
        print(parts[0], parts[4])
' "$FX_MOUNT"
}

# The subsystem of FX_NQN in `nvme list-subsys -o json` (nvme-cli 1.x and 2.x layouts):
# prints "TRANSPORTS CANDIDATE_DEVICES" (comma lists) or nothing when not connected.
subsystem_info() {
    nvme list-subsys -o json 2>/dev/null | python3 -c '
import json, re, sys
nqn = sys.argv[1]
try:
    data = json.load(sys.stdin)
except ValueError:
    sys.exit(0)
roots = data if isinstance(data, list) else [data]
subsystems = []
for root in roots:
    entries = root.get("Subsystems", []) if isinstance(root, dict) else []
    current = None
    for entry in entries:
        if "NQN" in entry:
            current = dict(entry)
            subsystems.append(current)
        if "Paths" in entry and current is not None and "NQN" not in entry:
            current["Paths"] = entry["Paths"]   # nvme-cli 1.x: paths follow their subsystem as a separate entry
for sub in subsystems:
    if sub.get("NQN") != nqn:
        continue
    paths = sub.get("Paths") or []
    transports = sorted({str(p.get("Transport", "?")).lower() for p in paths}) or ["none"]
    devices = []
    for ns in sub.get("Namespaces") or []:
        if ns.get("NameSpace"):
            devices.append("/dev/" + ns["NameSpace"])
    index = re.search(r"(\d+)$", sub.get("Name", ""))
    if index:
        devices.append("/dev/nvme%sn1" % index.group(1))
    for p in paths:
        if re.fullmatch(r"nvme\d+", p.get("Name", "")):
            devices.append("/dev/%sn1" % p["Name"])
    print(",".join(transports), ",".join(dict.fromkeys(devices)))
    break
' "$FX_NQN"
}

# The first candidate that `nvme list -o json` shows as a namespace device.
pick_namespace() {
    nvme list -o json 2>/dev/null | python3 -c '
import json, sys
candidates = sys.argv[1].split(",")
try:
    data = json.load(sys.stdin)
except ValueError:
    data = {}
listed = set()
for device in data.get("Devices", []) if isinstance(data, dict) else []:
    if device.get("DevicePath"):
        listed.add(device["DevicePath"])
    for sub in device.get("Subsystems", []):
        for ctrl in sub.get("Controllers", []):
            for ns in ctrl.get("Namespaces", []):
                listed.add("/dev/" + ns.get("NameSpace", ""))
        for ns in sub.get("Namespaces", []):
            listed.add("/dev/" + ns.get("NameSpace", ""))
for candidate in candidates:
    if candidate in listed:
        print(candidate)
        break
' "$1"
}

# Whether DEVICE (or a partition of it) is one of the comma-separated candidate namespaces.
is_fx_device() {
    local candidate
    for candidate in ${2//,/ }; do
        [[ "$1" == "$candidate" || "$1" == "${candidate}p"[0-9]* ]] && return 0
    done
    return 1
}

check_writable() {
    local probe="$FX_MOUNT/.fxpilot-write-test.$$"
    if ! { printf 'fxpilot write test\n' > "$probe" && sync "$probe" 2>/dev/null; rm -f "$probe"; }; then
        rm -f "$probe" 2>/dev/null || true
        fail "the FX mount $FX_MOUNT is not writable by $(id -un); give that user a writable directory there"
    fi
}

attach() {
    local info transports devices namespace found fstype
    record_set "+user=$user_tag" "nqn=$FX_NQN" "mount=$FX_MOUNT" "detached=false" >/dev/null

    if [[ ! -d "$FX_MOUNT" ]]; then
        fail "the mount point $FX_MOUNT does not exist on $(hostname); create it (mkdir -p) or correct deployment.paths.fx_mount"
    fi

    info=$(subsystem_info)
    if [[ -z "$info" ]]; then
        say "connecting to $FX_NQN at $FX_ADDRESS:$FX_SERVICE_ID over rdma"
        "${SUDO[@]}" modprobe nvme-rdma 2>/dev/null || true
        local discovery
        if ! discovery=$("${SUDO[@]}" nvme discover -t rdma -a "$FX_ADDRESS" -s "$FX_SERVICE_ID" "${host_nqn_args[@]}" 2>&1); then
            fail "the FX target $FX_ADDRESS:$FX_SERVICE_ID is unreachable over rdma (nvme discover: $(echo "$discovery" | tail -n 3 | tr '\n' ' '))"
        fi
        if ! grep -qF "$FX_NQN" <<<"$discovery"; then
            fail "the FX target $FX_ADDRESS:$FX_SERVICE_ID does not offer subsystem $FX_NQN (check deployment.fx_target.nqn)"
        fi
        local output
        if ! output=$("${SUDO[@]}" nvme connect -t rdma -n "$FX_NQN" -a "$FX_ADDRESS" -s "$FX_SERVICE_ID" "${host_nqn_args[@]}" 2>&1); then
            fail "nvme connect to $FX_NQN at $FX_ADDRESS:$FX_SERVICE_ID failed: $(echo "$output" | tail -n 3 | tr '\n' ' ')"
        fi
        record_set "connected_by_run=true" >/dev/null
        for _ in 1 2 3 4 5 6 7 8 9 10; do
            info=$(subsystem_info)
            [[ -n "$info" ]] && break
            sleep 1
        done
        [[ -n "$info" ]] || fail "nvme connect returned but $FX_NQN does not appear in nvme list-subsys"
    else
        say "$FX_NQN is already connected (left connected on teardown)"
    fi

    transports=${info%% *}
    devices=${info#* }
    if [[ "$transports" != "rdma" ]]; then
        fail "the FX namespace of $FX_NQN is reached over transport '$transports', not rdma; the pilot measures NVMe-oF over RoCEv2"
    fi

    found=$(mounted_device)
    if [[ -n "$found" ]]; then
        namespace=${found%% *}
        if ! is_fx_device "$namespace" "$devices"; then
            fail "$FX_MOUNT holds $namespace, which is not a namespace of $FX_NQN ($devices); a run there would not measure FX"
        fi
        say "$FX_MOUNT is already mounted ($namespace, ${found#* }; left mounted on teardown)"
    else
        namespace=""
        for _ in 1 2 3 4 5 6 7 8 9 10; do
            namespace=$(pick_namespace "$devices")
            [[ -n "$namespace" ]] && break
            sleep 1
        done
        [[ -n "$namespace" ]] || fail "no namespace of $FX_NQN is listed by nvme list (looked for $devices)"
        fstype=$(blkid -o value -s TYPE "$namespace" 2>/dev/null || true)
        if [[ -z "$fstype" ]]; then
            if [[ "${MKFS_IF_EMPTY:-0}" != "1" ]]; then
                fail "the FX namespace $namespace holds no filesystem; set deployment.mkfs_if_empty to true to create $FX_FSTYPE on it"
            fi
            say "creating $FX_FSTYPE on $namespace (mkfs_if_empty is set and blkid finds no filesystem)"
            "${SUDO[@]}" "mkfs.$FX_FSTYPE" "$namespace" || fail "mkfs.$FX_FSTYPE $namespace failed"
            record_set "mkfs_by_run=true" >/dev/null
        elif [[ "$fstype" != "$FX_FSTYPE" ]]; then
            fail "the FX namespace $namespace holds $fstype, not $FX_FSTYPE (deployment.fx_target.fstype); nothing was changed"
        fi
        "${SUDO[@]}" mount -t "$FX_FSTYPE" -o noatime "$namespace" "$FX_MOUNT" || fail "mount -t $FX_FSTYPE $namespace $FX_MOUNT failed"
        record_set "mounted_by_run=true" >/dev/null
        say "mounted $namespace at $FX_MOUNT"
    fi
    # The kernel's ID of this mount: a path unmounted and mounted again meanwhile (by anyone) has a new one.
    local mount_id
    mount_id=$(findmnt -rn -o ID --mountpoint "$FX_MOUNT" 2>/dev/null | head -n 1 || true)
    record_set "namespace=$namespace" "transport=$transports" "mount_id=$mount_id" >/dev/null
    check_writable
    say "FX attached: $FX_NQN over $transports, $namespace at $FX_MOUNT, writable"
}

detach() {
    local left
    [[ -f "$record" ]] || { say "nothing to detach (this run attached nothing)"; return 0; }
    left=$(record_set "-user=$user_tag")
    if [[ "$left" != "0" ]]; then
        say "FX stays attached: $left other user(s) of this run still need it"
        return 0
    fi
    if [[ "$(record_get detached)" == "true" ]]; then
        say "FX already detached"
        return 0
    fi
    local status=0
    if [[ "$(record_get mounted_by_run)" == "true" ]]; then
        if [[ -n "$(mounted_device)" ]]; then
            "${SUDO[@]}" umount "$FX_MOUNT" || { echo "fxpilot: error: umount $FX_MOUNT failed" >&2; status=1; }
        fi
        [[ $status == 0 ]] && say "unmounted $FX_MOUNT"
    fi
    if [[ $status == 0 && "$(record_get connected_by_run)" == "true" ]]; then
        if [[ -n "$(subsystem_info)" ]]; then
            "${SUDO[@]}" nvme disconnect -n "$FX_NQN" || { echo "fxpilot: error: nvme disconnect -n $FX_NQN failed" >&2; status=1; }
        fi
        [[ $status == 0 ]] && say "disconnected $FX_NQN"
    fi
    if [[ $status == 0 ]]; then
        record_set "detached=true" >/dev/null
    else
        record_set "+user=$user_tag" >/dev/null
    fi
    return $status
}

case "$action" in
    attach) attach ;;
    detach) detach ;;
    *) fail "unknown action $action (attach or detach)" ;;
esac
