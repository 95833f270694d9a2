"""The simulated node tools (amd-smi, nvme, fio, ...): print what the real ones print, act on state.json.

Run as ``$FXPILOT_PYTHON -m runners.simnode.tools TOOL ARGS...`` by the wrappers in runners/simnode/bin.
Standard library only. Commands that would need root on a real node act on the sandbox state instead.
The node's SSH user is not root: `ip link set` refuses a change, as the real one does, unless it runs through
the simulated `sudo` (password-less, unless the fault `sudo_password` makes it ask, as a real sudoers rule can).
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

from runners.simnode import storage
from runners.simnode.state import (
    fx_mount,
    fx_visible,
    link_shared_fx,
    load_state,
    mounts,
    save_state,
    storage_kind,
    unlink_shared_fx,
)

GPU_COUNT = 8
GPU_MODEL = "AMD Instinct MI308X"
GPU_VRAM_MB = 196592
ROCM_VERSION = "7.2.1"
AMDSMI_VERSION = "26.2.1"
AMDGPU_VERSION = "6.16.6"
VLLM_VERSION = "0.20.1+rocm721"
FX_NIC, FX_RDMA = "ens1f0np0", "mlx5_0"
MGMT_NIC = "eno8303"
FX_ADDRESS_DEFAULT = "192.168.100.10"
FX_NQN_DEFAULT = "nqn.2026-01.com.example.fx:fx100.pool0"
LOCAL_MODEL = "SAMSUNG MZVL22T0HBLB-00B00"
LOCAL_BYTES = 2_048_408_248_320
FX_MODEL = "FX100 NVMe-oF Volume"
FX_BYTES = 30_720_000_000_000
CPU_CORES = 192
MEMORY_BYTES = 2048 * 2**30


class ToolError(Exception):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _root() -> Path:
    return Path(os.environ["FXPILOT_SIM_ROOT"])


def _state() -> dict:
    return load_state(_root())


def _save(state: dict) -> None:
    save_state(_root(), state)


def _scale(state: dict) -> float:
    return float(os.environ.get("FXPILOT_SIM_TIME_SCALE") or state.get("time_scale") or 0.01)


def _node_index(state: dict) -> int:
    digits = re.findall(r"\d+", state.get("node", "1"))
    return int(digits[-1]) if digits else 1


def _print_json(value) -> None:
    print(json.dumps(value, indent=4))


def _expand(path: str) -> str:
    return os.path.realpath(os.path.expanduser(path))


# --- GPUs --------------------------------------------------------------------------------------

def _gpus(state: dict) -> list[dict]:
    n = _node_index(state)
    bdfs = ["0000:0c:00.0", "0000:22:00.0", "0000:38:00.0", "0000:5c:00.0",
            "0000:9f:00.0", "0000:af:00.0", "0000:bf:00.0", "0000:df:00.0"]
    return [{"gpu": i, "bdf": bdfs[i], "uuid": f"{n:02x}ff74a5-0000-1000-80{i:02x}-5d0d1c3a{n:04x}", "kfd_id": 30000 + i,
             "node_id": 2 + i, "partition_id": 0} for i in range(GPU_COUNT)]


def amd_smi(args: list[str]) -> None:
    command = args[0] if args and not args[0].startswith("-") else ""
    as_json = "--json" in args
    state = _state()
    if command == "version" or not command:
        info = {"tool": "AMDSMI Tool", "version": f"{AMDSMI_VERSION}+fc0010cf6a", "amdsmi_library_version": AMDSMI_VERSION,
                "rocm_version": ROCM_VERSION, "amdgpu_version": AMDGPU_VERSION, "amd_hsmp_version": "N/A"}
        if as_json:
            _print_json([info])
        else:
            print(f"AMDSMI Tool: {info['version']} | AMDSMI Library version: {AMDSMI_VERSION} | "
                  f"ROCm version: {ROCM_VERSION} | amdgpu version: {AMDGPU_VERSION} | amd_hsmp version: N/A")
        return
    gpus = _gpus(state)
    if command == "list":
        if as_json:
            _print_json(gpus)
        else:
            for g in gpus:
                print(f"GPU: {g['gpu']}\n    BDF: {g['bdf']}\n    UUID: {g['uuid']}\n    KFD_ID: {g['kfd_id']}\n"
                      f"    NODE_ID: {g['node_id']}\n    PARTITION_ID: 0\n")
        return
    if command == "static":
        rows = [{
            "gpu": g["gpu"],
            "asic": {"market_name": GPU_MODEL, "vendor_id": "0x1002", "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
                     "subvendor_id": "0x1002", "device_id": "0x74a2", "subsystem_id": "0x74a2", "rev_id": "0x00",
                     "asic_serial": f"0x{0x5E1F0A2B3C4D5E00 + g['gpu']:X}", "oam_id": g["gpu"], "num_compute_units": 80,
                     "target_graphics_version": "gfx942"},
            "bus": {"bdf": g["bdf"], "max_pcie_width": 16, "max_pcie_speed": {"value": 32, "unit": "GT/s"},
                    "pcie_interface_version": "Gen 5", "slot_type": "OAM"},
            "vbios": {"name": "AMD MI308X_HW_SRIOV_CVS_1VF", "build_date": "2025/02/11 10:12",
                      "part_number": "113-M3080202-100", "version": "022.040.003.043.000001"},
            "driver": {"name": "amdgpu", "version": AMDGPU_VERSION},
            "board": {"model_number": "102-G30218-0B", "product_serial": f"692423000{g['gpu']}", "fru_id": "N/A",
                      "product_name": "AMD Instinct MI308X OAM", "manufacturer_name": "AMD"},
            "vram": {"type": "HBM3", "vendor": "HYNIX", "size": {"value": GPU_VRAM_MB, "unit": "MB"},
                     "bit_width": 8192, "max_bandwidth": {"value": 5300, "unit": "GB/s"}},
            "partition": {"compute_partition": "SPX", "memory_partition": "NPS1", "partition_id": 0},
            "numa": {"node": 0 if g["gpu"] < 4 else 1, "affinity": 0 if g["gpu"] < 4 else 1},
        } for g in gpus]
        if as_json:
            _print_json({"gpu_data": rows})  # amd-smi 26.x wraps the GPUs; 24.x/25.x printed the bare list
        else:
            for row in rows:
                print(f"GPU: {row['gpu']}\n    ASIC:\n        MARKET_NAME: {GPU_MODEL}\n        TARGET_GRAPHICS_VERSION: gfx942"
                      f"\n    VRAM:\n        TYPE: HBM3\n        SIZE: {GPU_VRAM_MB} MB\n")
        return
    raise ToolError(f"amd-smi: simulated node knows version, list, static; not {command!r}", 2)


def rocm_smi(args: list[str]) -> None:
    state = _state()
    if "--json" not in args:
        print("============================ ROCm System Management Interface ============================")
        for g in _gpus(state):
            print(f"GPU[{g['gpu']}]\t\t: Card Series: \t\t{GPU_MODEL}")
        print("==================================== End of ROCm SMI Log ====================================")
        return
    out = {}
    for g in _gpus(state):
        card = {}
        if "--showproductname" in args or "-a" in args:
            card.update({"Card Series": GPU_MODEL, "Card Model": "0x74a2", "Card Vendor": "Advanced Micro Devices, Inc. [AMD/ATI]",
                         "Card SKU": "M3080202", "Subsystem ID": "0x74a2", "Device Rev": "0x00", "Node ID": str(g["node_id"]),
                         "GUID": str(40000 + g["gpu"]), "GFX Version": "gfx942"})
        if "--showmeminfo" in args or "-a" in args:
            card.update({"VRAM Total Memory (B)": str(GPU_VRAM_MB * 2**20), "VRAM Total Used Memory (B)": "295874560"})
        out[f"card{g['gpu']}"] = card
    if "--showdriverversion" in args or "-a" in args:
        out["system"] = {"Driver version": AMDGPU_VERSION}
    print(json.dumps(out))


# --- NVMe and NVMe-oF ---------------------------------------------------------------------------

def _fx_target(state: dict) -> tuple[str, str]:
    fx = state["fx"]
    return fx.get("address", FX_ADDRESS_DEFAULT), fx.get("nqn", FX_NQN_DEFAULT)


def _opt(args: list[str], *names: str, default: str | None = None) -> str | None:
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                return args[i + 1]
            if name.startswith("--") and arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return default


def nvme(args: list[str]) -> None:
    if not args:
        raise ToolError("usage: nvme <command> [<device>] [<args>]", 1)
    command, rest = args[0], args[1:]
    state = _state()
    address, nqn = _fx_target(state)
    faults = state["faults"]
    host_nqn = f"nqn.2014-08.org.nvmexpress:uuid:5e1f0a2b-0000-4000-8000-{_node_index(state):012d}"
    if command == "discover":
        if faults.get("fx_down"):
            raise ToolError("Failed to write to /dev/nvme-fabrics: Connection timed out")
        if _opt(rest, "-a", "--traddr") not in (None, address):
            raise ToolError("Failed to write to /dev/nvme-fabrics: Connection refused")
        if not fx_visible(state):
            print("\nDiscovery Log Number of Records 0, Generation counter 3")
            return
        print(f"\nDiscovery Log Number of Records 1, Generation counter 3\n=====Discovery Log Entry 0======\n"
              f"trtype:  rdma\nadrfam:  ipv4\nsubtype: nvme subsystem\ntreq:    not specified\nportid:  1\n"
              f"trsvcid: 4420\nsubnqn:  {nqn}\ntraddr:  {address}\neflags:  none\nrdma_prtype: roce-v2\n"
              f"rdma_qptype: connected\nrdma_cms:    rdma-cm\nrdma_pkey: 0x0000")
        return
    if command == "connect":
        wanted = _opt(rest, "-n", "--nqn")
        if faults.get("fx_down"):
            raise ToolError("Failed to write to /dev/nvme-fabrics: Connection timed out")
        if not fx_visible(state) or wanted != nqn or _opt(rest, "-a", "--traddr") not in (None, address):
            raise ToolError("Failed to write to /dev/nvme-fabrics: Input/output error\n"
                            "could not add new controller: failed to write to nvme-fabrics device")
        if state["fx"].get("connected"):
            raise ToolError("already connected", 114)
        state["fx"]["connected"] = True
        _save(state)
        print("connecting to device: nvme1")
        return
    if command == "disconnect":
        wanted = _opt(rest, "-n", "--nqn")
        if wanted == nqn and state["fx"].get("connected"):
            state["fx"]["connected"] = False
            state["fx"]["mounted_at"] = None
            _save(state)
            print(f"NQN:{nqn} disconnected 1 controller(s)")
        else:
            print(f"NQN:{wanted} disconnected 0 controller(s)")
        return
    if command == "list":
        devices = [{"NameSpace": 1, "DevicePath": state["local_nvme"]["namespace"], "GenericPath": "/dev/ng0n1",
                    "Firmware": "GXA7802Q", "Index": 0, "ModelNumber": LOCAL_MODEL,
                    "SerialNumber": f"S7DPNU0X{_node_index(state):06d}", "UsedBytes": 412316860416,
                    "MaximumLBA": LOCAL_BYTES // 512, "PhysicalSize": LOCAL_BYTES, "SectorSize": 512}]
        if fx_visible(state) and state["fx"].get("connected"):
            devices.append({"NameSpace": 1, "DevicePath": state["fx"]["namespace"], "GenericPath": "/dev/ng1n1",
                            "Firmware": "3.2.0", "Index": 1, "ModelNumber": FX_MODEL, "SerialNumber": "FX100A0001",
                            "UsedBytes": 1099511627776, "MaximumLBA": FX_BYTES // 4096, "PhysicalSize": FX_BYTES,
                            "SectorSize": 4096})
        if _opt(rest, "-o", "--output-format") == "json":
            _print_json(_nvme_list_2_11(state, devices, host_nqn, nqn, address))
        else:
            print(f"{'Node':<21} {'Generic':<21} {'SN':<20} {'Model':<40} {'Namespace':<9} {'Usage':<26} Format           FW Rev")
            for d in devices:
                print(f"{d['DevicePath']:<21} {d['GenericPath']:<21} {d['SerialNumber']:<20} {d['ModelNumber']:<40} "
                      f"0x1       {d['UsedBytes'] / 1e12:.2f} TB / {d['PhysicalSize'] / 1e12:.2f} TB  "
                      f"{d['SectorSize']}   B +  0 B   {d['Firmware']}")
        return
    if command == "list-subsys":
        subsystems = [{"Name": "nvme-subsys0", "NQN": f"nqn.1994-11.com.samsung:nvme:PM9A1:M.2:S7DPNU0X{_node_index(state):06d}",
                       "IOPolicy": "numa",
                       "Paths": [{"Name": "nvme0", "Transport": "pcie", "Address": "0000:c1:00.0", "State": "live"}]}]
        if fx_visible(state) and state["fx"].get("connected"):
            path_state = "connecting" if faults.get("fx_down") else "live"
            subsystems.append({"Name": "nvme-subsys1", "NQN": nqn, "IOPolicy": "numa",
                               "Paths": [{"Name": "nvme1", "Transport": "rdma",
                                          "Address": f"traddr={address},trsvcid=4420,src_addr=192.168.100.{20 + _node_index(state)}",
                                          "State": path_state}]})
        if _opt(rest, "-o", "--output-format") == "json":
            _print_json([{"HostNQN": host_nqn, "HostID": host_nqn.rsplit(":", 1)[1], "Subsystems": subsystems}])
        else:
            for s in subsystems:
                print(f"{s['Name']} - NQN={s['NQN']}\n\\")
                for p in s["Paths"]:
                    print(f" +- {p['Name']} {p['Transport']} {p['Address']} {p['State']}")
        return
    raise ToolError(f"nvme: simulated node knows discover, connect, disconnect, list, list-subsys; not {command!r}", 1)


def _nvme_list_2_11(state: dict, devices: list[dict], host_nqn: str, nqn: str, address: str) -> dict:
    """``nvme list -o json`` as nvme-cli 2.11 prints it: subsystems → controllers; a multipathed (fabric) subsystem
    holds its namespaces itself, a PCIe controller holds its own."""
    def namespace(d: dict) -> dict:
        name = d["DevicePath"].removeprefix("/dev/")
        return {"NameSpace": name, "Generic": d["GenericPath"].removeprefix("/dev/"), "NSID": d["NameSpace"],
                "UsedBytes": d["UsedBytes"], "MaximumLBA": d["MaximumLBA"], "PhysicalSize": d["PhysicalSize"],
                "SectorSize": d["SectorSize"]}

    local, *fabric = devices
    n = _node_index(state)
    subsystems = [{"Subsystem": "nvme-subsys0", "SubsystemNQN": f"nqn.1994-11.com.samsung:nvme:PM9A1:M.2:S7DPNU0X{n:06d}",
                   "Controllers": [{"Controller": "nvme0", "Cntlid": "6", "SerialNumber": local["SerialNumber"],
                                    "ModelNumber": local["ModelNumber"], "Firmware": local["Firmware"], "Transport": "pcie",
                                    "Address": "0000:c1:00.0", "Slot": "", "Namespaces": [namespace(local)], "Paths": []}],
                   "Namespaces": []}]
    for d in fabric:
        subsystems.append({"Subsystem": "nvme-subsys1", "SubsystemNQN": nqn,
                           "Controllers": [{"Controller": "nvme1", "Cntlid": "1", "SerialNumber": d["SerialNumber"],
                                            "ModelNumber": d["ModelNumber"], "Firmware": d["Firmware"], "Transport": "rdma",
                                            "Address": f"traddr={address},trsvcid=4420,src_addr=192.168.100.{20 + n}",
                                            "Slot": "", "Namespaces": [],
                                            "Paths": [{"Path": "nvme1c1n1", "ANAState": "optimized"}]}],
                           "Namespaces": [namespace(d)]})
    return {"Devices": [{"HostNQN": host_nqn, "HostID": host_nqn.rsplit(":", 1)[1], "Subsystems": subsystems}]}


def mount(args: list[str]) -> None:
    state = _state()
    positional = [a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] not in ("-t", "-o"))]
    if not positional:
        for row in mounts(state):
            print(f"{row['device']} on {row['path']} type {row['fstype']} ({row['options']})")
        return
    if len(positional) != 2:
        raise ToolError("mount: simulated node: use `mount DEVICE DIRECTORY`", 1)
    # Not resolved: the mount point may be a link to the shared FX array, and `mount` shows the mount point.
    device, target = positional[0], os.path.abspath(os.path.expanduser(positional[1]))
    if device != state["fx"]["namespace"] or not fx_visible(state) or not state["fx"].get("connected"):
        raise ToolError(f"mount: {target}: special device {device} does not exist.", 32)
    root = str(_root().resolve())
    if not (target == root or target.startswith(root + "/")):
        raise ToolError(f"mount: {target}: permission denied (the simulated node mounts inside its sandbox only).", 32)
    if fx_mount(state):
        raise ToolError(f"mount: {target}: {device} already mounted on {state['fx']['mounted_at']}.", 32)
    if not state["fx"].get("formatted", True):
        raise ToolError(f"mount: {target}: wrong fs type, bad option, bad superblock on {device}.", 32)
    link_shared_fx(target, state)
    state["fx"]["mounted_at"] = target
    state["fx"]["mounts"] = int(state["fx"].get("mounts", 1)) + 1
    _save(state)


FINDMNT_COLUMNS = {"ID": "id", "TARGET": "path", "SOURCE": "device", "FSTYPE": "fstype", "OPTIONS": "options"}


def _short_options(args: list[str], takes_value: str) -> list[str]:
    """Split clustered short options as getopt does: `-no SOURCE` → `-n -o SOURCE`, `-oSOURCE` → `-o SOURCE`."""
    out: list[str] = []
    for arg in args:
        if arg.startswith("-") and not arg.startswith("--") and len(arg) > 2:
            for position, letter in enumerate(arg[1:], start=1):
                out.append("-" + letter)
                if letter in takes_value:
                    if arg[position + 1:]:
                        out.append(arg[position + 1:])
                    break
        elif arg.startswith("--") and "=" in arg:
            out += arg.split("=", 1)
        else:
            out.append(arg)
    return out


def _mount_of(path: str, state: dict) -> dict | None:
    """The mount holding ``path`` (findmnt --target): the longest mount point it lies under, comparing resolved paths
    too (the FX mount point may be a link to the array every simulated node shares)."""
    literal, real = os.path.abspath(os.path.expanduser(path)), _expand(path)
    best, length = None, -1
    for row in mounts(state):
        for mount in {row["path"], os.path.realpath(row["path"])}:
            mount = mount.rstrip("/") or "/"
            for candidate in (literal, real):
                inside = candidate == mount or candidate.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) > length:
                    best, length = row, len(mount)
    return best


def findmnt(args: list[str]) -> None:
    """`findmnt [-n] [-r] [-o COLUMNS] [-M DIR | -T PATH | DIR]`: the simulated node's mounts (ID as the kernel's).
    `--target PATH` answers the mount that holds PATH (which must exist, as with the real findmnt)."""
    columns, target, containing = ["TARGET", "SOURCE", "FSTYPE", "OPTIONS"], None, None
    rest = _short_options(list(args), "oMT")
    while rest:
        arg = rest.pop(0)
        if arg in ("-o", "--output") and rest:
            columns = [c.strip().upper() for c in rest.pop(0).split(",")]
        elif arg in ("-M", "--mountpoint") and rest:
            target = rest.pop(0)
        elif arg in ("-T", "--target") and rest:
            containing = rest.pop(0)
        elif not arg.startswith("-"):
            target = arg
    unknown = [c for c in columns if c not in FINDMNT_COLUMNS]
    if unknown:
        raise ToolError(f"findmnt: unknown column: {unknown[0]}", 1)
    state = _state()
    if containing is not None:
        found = _mount_of(containing, state) if os.path.exists(os.path.expanduser(containing)) else None
        rows = [found] if found else []
    else:
        rows = [row for row in mounts(state)
                if target is None or _expand(target) in (row["path"], os.path.realpath(row["path"]))]
    if not rows:
        raise SystemExit(1)
    for row in rows:
        print(" ".join(str(row[FINDMNT_COLUMNS[c]]) for c in columns))


def _block_devices(state: dict) -> list[dict]:
    """The node's block devices as lsblk lists them: the boot disk and its root partition, the local NVMe, and the FX
    namespace while it is connected."""
    mounted = {row["device"]: row["path"] for row in mounts(state)}
    rows = [{"NAME": "sda", "KNAME": "sda", "PKNAME": "", "TYPE": "disk", "SIZE": "894.3G", "MAJ:MIN": "8:0",
             "MODEL": "SAMSUNG MZ7L3960", "TRAN": "sata"},
            {"NAME": "sda2", "KNAME": "sda2", "PKNAME": "sda", "TYPE": "part", "SIZE": "893.3G", "MAJ:MIN": "8:2",
             "MODEL": "", "TRAN": ""}]
    local = state.get("local_nvme", {}).get("namespace") or "/dev/nvme0n1"
    rows.append({"NAME": os.path.basename(local), "KNAME": os.path.basename(local), "PKNAME": "", "TYPE": "disk",
                 "SIZE": "1.9T", "MAJ:MIN": "259:0", "MODEL": LOCAL_MODEL, "TRAN": "nvme"})
    if fx_visible(state) and state["fx"].get("connected"):
        fx = state["fx"]["namespace"]
        rows.append({"NAME": os.path.basename(fx), "KNAME": os.path.basename(fx), "PKNAME": "", "TYPE": "disk",
                     "SIZE": "27.9T", "MAJ:MIN": "259:1", "MODEL": FX_MODEL, "TRAN": "nvme"})
    for row in rows:
        row["MOUNTPOINT"] = row["MOUNTPOINTS"] = mounted.get("/dev/" + row["KNAME"], "")
        row["FSTYPE"] = "xfs" if row["TYPE"] == "disk" and row["KNAME"].startswith("nvme") else (
            "ext4" if row["KNAME"] == "sda2" else "")
        row["PATH"] = "/dev/" + row["KNAME"]
        row["RM"], row["RO"] = "0", "0"
    return rows


def lsblk(args: list[str]) -> None:
    """`lsblk [-n] [-d] [-p] [-J] [-o COLUMNS] [DEVICE...]`: the simulated node's block devices. A partition's PKNAME
    is its disk's kernel name (sda2 → sda); a whole namespace has none."""
    rest = _short_options(list(args), "o")
    columns = ["NAME", "MAJ:MIN", "RM", "SIZE", "RO", "TYPE", "MOUNTPOINTS"]
    headings, as_json, no_deps, full_path, wanted = True, False, False, False, []
    while rest:
        arg = rest.pop(0)
        if arg in ("-o", "--output") and rest:
            columns = [c.strip().upper() for c in rest.pop(0).split(",")]
        elif arg in ("-n", "--noheadings"):
            headings = False
        elif arg in ("-J", "--json"):
            as_json = True
        elif arg in ("-d", "--nodeps"):
            no_deps = True
        elif arg in ("-p", "--paths"):
            full_path = True
        elif not arg.startswith("-"):
            wanted.append(arg)
    state = _state()
    devices = _block_devices(state)
    known = set(devices[0])
    unknown = [c for c in columns if c not in known]
    if unknown:
        raise ToolError(f"lsblk: unknown column: {unknown[0]}", 1)
    rows = []
    for name in wanted:
        real = os.path.realpath(name) if name.startswith("/dev/") and os.path.islink(name) else name
        match = next((d for d in devices if real in (d["PATH"], d["KNAME"])), None)
        if match is None:
            raise ToolError(f"lsblk: {name}: not a block device", 32)
        rows.append(match)
        if not no_deps and match["TYPE"] == "disk":
            rows += [d for d in devices if d["PKNAME"] == match["KNAME"]]
    if not wanted:
        rows = [d for d in devices if not no_deps or d["TYPE"] == "disk"]

    def value(row: dict, column: str) -> str:
        text = row[column]
        if full_path and column in ("NAME", "KNAME", "PKNAME") and text:
            text = "/dev/" + text
        return text

    if as_json:
        print(json.dumps({"blockdevices": [{c.lower(): (value(r, c) or None) for c in columns} for r in rows]},
                         indent=3))
        return
    widths = [max([len(c)] + [len(value(r, c)) for r in rows]) for c in columns]
    lines = ([columns] if headings else []) + [[value(r, c) for c in columns] for r in rows]
    for line in lines:
        print(" ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip())


def umount(args: list[str]) -> None:
    state = _state()
    targets = [a for a in args if not a.startswith("-")]
    if len(targets) != 1:
        raise ToolError("umount: simulated node: use `umount DIRECTORY`", 1)
    target = targets[0]
    mounted = fx_mount(state)
    if mounted and (target == state["fx"]["namespace"] or _expand(target) in (mounted, os.path.realpath(mounted))):
        unlink_shared_fx(mounted)
        state["fx"]["mounted_at"] = None
        _save(state)
        return
    raise ToolError(f"umount: {target}: not mounted.", 32)


def mkfs_xfs(args: list[str]) -> None:
    state = _state()
    devices = [a for a in args if not a.startswith("-")]
    if len(devices) != 1 or devices[0] != state["fx"]["namespace"] or not state["fx"].get("connected"):
        raise ToolError(f"mkfs.xfs: cannot open {devices[0] if devices else ''}: No such file or directory", 1)
    device = devices[0]
    if fx_mount(state):
        raise ToolError(f"mkfs.xfs: {device} contains a mounted filesystem\nUsage: mkfs.xfs ...", 1)
    data_dir = Path(state["fx"].get("data_dir") or state["fx"].get("shared_dir") or _root() / "mnt" / "fx")
    holds_data = state["fx"].get("formatted", True) and data_dir.exists() and any(data_dir.iterdir())
    if holds_data and "-f" not in args:
        raise ToolError(f"mkfs.xfs: {device} appears to contain an existing filesystem (xfs).\n"
                        "mkfs.xfs: Use the -f option to force overwrite.", 1)
    if data_dir.exists():
        for child in sorted(data_dir.rglob("*"), reverse=True):
            child.rmdir() if child.is_dir() and not child.is_symlink() else child.unlink()
    state["fx"]["formatted"] = True
    _save(state)
    blocks = FX_BYTES // 4096
    print(f"meta-data={device}             isize=512    agcount=32, agsize={blocks // 32} blks\n"
          f"         =                       sectsz=4096  attr=2, projid32bit=1\n"
          f"data     =                       bsize=4096   blocks={blocks}, imaxpct=5\n"
          f"naming   =version 2              bsize=4096   ascii-ci=0, ftype=1\n"
          f"log      =internal log           bsize=4096   blocks=521728, version=2\n"
          f"realtime =none                   extsz=4096   blocks=0, rtextents=0")


# --- network -------------------------------------------------------------------------------------

def _links(state: dict) -> list[dict]:
    n = _node_index(state)
    fx_up = not state["faults"].get("fx_down")
    return [
        {"ifindex": 2, "ifname": MGMT_NIC, "mtu": 1500, "operstate": "UP", "address": f"b4:83:51:00:{n:02x}:01",
         "speed": 1000, "rdma": None},
        {"ifindex": 4, "ifname": FX_NIC, "mtu": 4200, "operstate": "UP" if fx_up else "DOWN",
         "address": f"a0:88:c2:10:{n:02x}:02", "speed": 100000, "rdma": FX_RDMA},
    ]


SUDO_ENV = "FXPILOT_SIM_SUDO"  # set by the simulated sudo for the command it runs: that command is root


def _as_root() -> bool:
    return os.environ.get(SUDO_ENV) == "1"


def sudo(args: list[str]) -> None:
    """`sudo [-n] COMMAND…`: runs COMMAND as the simulated root; with the fault sudo_password it needs a password,
    which `-n` (and a session without a terminal) refuses as the real sudo does."""
    non_interactive = False
    while args and args[0].startswith("-"):
        option = args.pop(0)
        if option in ("-n", "--non-interactive"):
            non_interactive = True
        elif option == "--":
            break
        elif option not in ("-E", "-H"):
            raise ToolError(f"sudo: simulated node knows -n, -E, -H only, not {option}", 1)
    if not args:
        raise ToolError("usage: sudo [-n] command [arg ...]", 1)
    if _state()["faults"].get("sudo_password"):
        raise ToolError("sudo: a password is required" if non_interactive else
                        "sudo: a terminal is required to read the password; either use the -S option to read from "
                        "standard input or configure an askpass helper", 1)
    env = {**os.environ, SUDO_ENV: "1"}
    try:
        os.execvpe(args[0], args, env)
    except OSError:
        raise ToolError(f"sudo: {args[0]}: command not found", 1) from None


def ip(args: list[str]) -> None:
    state = _state()
    as_json = "-j" in args or "-json" in args
    words = [a for a in args if not a.startswith("-")]
    if words[:2] == ["link", "set"]:
        rest = words[2:]
        if rest and rest[0] == "dev":
            rest = rest[1:]
        if len(rest) < 2 or rest[1] not in ("up", "down"):
            raise ToolError("Usage: ip link set dev DEVICE { up | down }", 255)
        names = [link["ifname"] for link in _links(state)]
        if rest[0] not in names:
            raise ToolError(f'Cannot find device "{rest[0]}"', 1)
        if not _as_root():  # the device is looked up first; the change itself needs CAP_NET_ADMIN
            raise ToolError("RTNETLINK answers: Operation not permitted", 2)
        if rest[0] == FX_NIC:
            state["faults"]["fx_down"] = rest[1] == "down"
            _save(state)
        return
    if words[:1] in (["link"], ["l"]) or words[:2] == ["link", "show"]:
        links = _links(state)
        if as_json:
            print(json.dumps([{"ifindex": link["ifindex"], "ifname": link["ifname"],
                               "flags": ["BROADCAST", "MULTICAST", "UP"] + (["LOWER_UP"] if link["operstate"] == "UP" else []),
                               "mtu": link["mtu"], "qdisc": "mq", "operstate": link["operstate"], "linkmode": "DEFAULT",
                               "group": "default", "txqlen": 1000, "link_type": "ether", "address": link["address"],
                               "broadcast": "ff:ff:ff:ff:ff:ff"} for link in links]))
        else:
            print("1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN mode DEFAULT group default qlen 1000\n"
                  "    link/loopback 00:00:00:00:00:00 brd 00:00:00:00:00:00")
            for link in links:
                lower = ",LOWER_UP" if link["operstate"] == "UP" else ""
                print(f"{link['ifindex']}: {link['ifname']}: <BROADCAST,MULTICAST,UP{lower}> mtu {link['mtu']} qdisc mq "
                      f"state {link['operstate']} mode DEFAULT group default qlen 1000\n"
                      f"    link/ether {link['address']} brd ff:ff:ff:ff:ff:ff")
        return
    raise ToolError("ip: simulated node knows `ip [-j] link show` and `ip link set dev X up|down`", 255)


def ethtool(args: list[str]) -> None:
    state = _state()
    names = [a for a in args if not a.startswith("-")]
    link = next((link for link in _links(state) if names and link["ifname"] == names[-1]), None)
    if link is None:
        raise ToolError(f"netlink error: no device matches name ({names[-1] if names else ''})\n"
                        "netlink error: No such device", 75)
    up = link["operstate"] == "UP"
    speed = f"{link['speed']}Mb/s" if up else "Unknown!"
    modes = "100000baseCR4/Full" if link["rdma"] else "1000baseT/Full"
    print(f"Settings for {link['ifname']}:\n\tSupported ports: [ {'FIBRE' if link['rdma'] else 'TP'} ]\n"
          f"\tSupported link modes:   {modes}\n\tSupported pause frame use: Symmetric\n"
          f"\tSupports auto-negotiation: Yes\n\tAdvertised link modes:  {modes}\n"
          f"\tSpeed: {speed}\n\tDuplex: {'Full' if up else 'Unknown! (255)'}\n\tAuto-negotiation: on\n"
          f"\tPort: {'Direct Attach Copper' if link['rdma'] else 'Twisted Pair'}\n\tPHYAD: 0\n"
          f"\tTransceiver: internal\n\tSupports Wake-on: d\n\tWake-on: d\n\tLink detected: {'yes' if up else 'no'}")


def ibv_devinfo(args: list[str]) -> None:
    state = _state()
    link = next(link for link in _links(state) if link["rdma"])
    up = link["operstate"] == "UP"
    n = _node_index(state)
    print(f"hca_id:\t{FX_RDMA}\n\ttransport:\t\t\tInfiniBand (0)\n\tfw_ver:\t\t\t\t22.39.1002\n"
          f"\tnode_guid:\t\t\ta088:c203:0010:{n:04x}\n\tsys_image_guid:\t\t\ta088:c203:0010:{n:04x}\n"
          f"\tvendor_id:\t\t\t0x02c9\n\tvendor_part_id:\t\t\t4125\n\thw_ver:\t\t\t\t0x0\n"
          f"\tboard_id:\t\t\tMT_0000000359\n\tphys_port_cnt:\t\t\t1\n\t\tport:\t1\n"
          f"\t\t\tstate:\t\t\t{'PORT_ACTIVE (4)' if up else 'PORT_DOWN (1)'}\n"
          f"\t\t\tmax_mtu:\t\t4096 (5)\n\t\t\tactive_mtu:\t\t{'4096 (5)' if up else '1024 (3)'}\n"
          f"\t\t\tsm_lid:\t\t\t0\n\t\t\tport_lid:\t\t0\n\t\t\tport_lmc:\t\t0x00\n\t\t\tlink_layer:\t\tEthernet\n")


def rdma(args: list[str]) -> None:
    state = _state()
    words = [a for a in args if not a.startswith("-")]
    if words[:1] != ["link"]:
        raise ToolError("rdma: simulated node knows `rdma [-j] link [show]`", 1)
    link = next(link for link in _links(state) if link["rdma"])
    up = link["operstate"] == "UP"
    row = {"ifindex": 1, "ifname": FX_RDMA, "port": 1, "state": "ACTIVE" if up else "DOWN",
           "physical_state": "LINK_UP" if up else "DISABLED", "netdev": FX_NIC, "netdev_index": link["ifindex"]}
    if "-j" in args or "--json" in args:
        print(json.dumps([row]))
    else:
        print(f"link {FX_RDMA}/1 state {row['state']} physical_state {row['physical_state']} netdev {FX_NIC}")


# --- host ---------------------------------------------------------------------------------------

def nproc(args: list[str]) -> None:
    print(CPU_CORES)


USED_BYTES, CACHE_BYTES, SHARED_BYTES = 61 * 2**30, 1210 * 2**30, 2**27


def meminfo_text() -> str:
    """/proc/meminfo of the simulated node, the same memory `free` shows (kB = KiB, as the kernel prints)."""
    total, free_bytes = MEMORY_BYTES, MEMORY_BYTES - USED_BYTES - CACHE_BYTES
    rows = [("MemTotal", total), ("MemFree", free_bytes), ("MemAvailable", total - USED_BYTES),
            ("Buffers", 2 * 2**30), ("Cached", CACHE_BYTES - 2 * 2**30), ("SwapCached", 0),
            ("Shmem", SHARED_BYTES), ("SwapTotal", 0), ("SwapFree", 0), ("HugePages_Total", None)]
    lines = []
    for name, value in rows:
        lines.append(f"{name + ':':<16}{0:>8}" if value is None else f"{name + ':':<16}{value // 1024:>8} kB")
    return "\n".join(lines) + "\n"


def free(args: list[str]) -> None:
    unit = 1
    for flag, size in (("-k", 1024), ("-m", 2**20), ("-g", 2**30), ("-b", 1)):
        if flag in args:
            unit = size
    if not any(f in args for f in ("-k", "-m", "-g", "-b")):
        unit = 1024
    used, cache = USED_BYTES, CACHE_BYTES
    free_bytes = MEMORY_BYTES - used - cache
    print("               total        used        free      shared  buff/cache   available")
    print(f"Mem:    {MEMORY_BYTES // unit:>12} {used // unit:>11} {free_bytes // unit:>11} {2**27 // unit:>11} "
          f"{cache // unit:>11} {(MEMORY_BYTES - used) // unit:>11}")
    print(f"Swap:   {0:>12} {0:>11} {0:>11}")


def df(args: list[str]) -> None:
    state = _state()
    sizes = {"/": 960_197_124_096, state["local_nvme"]["path"]: LOCAL_BYTES}
    fx_path = fx_mount(state)
    if fx_path:
        sizes[fx_path] = FX_BYTES
    rows = [row for row in mounts(state)]
    targets = [a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] not in ("-B", "-t"))]
    if targets:
        wanted = []
        for target in targets:
            real = _expand(target)
            # Compare resolved paths: the FX mount point may be a link to the shared array.
            best = max((r for r in rows if real == os.path.realpath(r["path"])
                        or real.startswith(os.path.realpath(r["path"]).rstrip("/") + "/")),
                       key=lambda r: len(os.path.realpath(r["path"])) if r["path"] != "/" else 0)
            wanted.append(best)
        rows = wanted
    block = 1 if "-B1" in args or ("-B" in args and "1" in args) else 1024
    print(f"Filesystem     {'1B-blocks' if block == 1 else '1024-blocks'}         Used    Available Capacity Mounted on")
    for r in rows:
        total = sizes.get(r["path"], 10**12)
        used = total // 10
        print(f"{r['device']:<14} {total // block:>12} {used // block:>12} {(total - used) // block:>12}      10% {r['path']}")


# --- fio ----------------------------------------------------------------------------------------

def _size_bytes(text: str) -> int:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgtp]?)(i?b?)", text.strip().lower())
    if not match:
        raise ToolError(f"fio: invalid size {text!r}", 1)
    power = " kmgtp".index(match.group(2) or " ")
    return int(float(match.group(1)) * 1024 ** power)


def _seconds(text: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)?", text.strip().lower())
    if not match:
        raise ToolError(f"fio: invalid time {text!r}", 1)
    return float(match.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[match.group(2)]


def _fio_sections(args: list[str]) -> tuple[dict[str, str], list[dict[str, str]]]:
    """fio's command-line jobs: options before the first --name are global, each --name starts a job."""
    global_opts: dict[str, str] = {}
    jobs: list[dict[str, str]] = []
    for arg in args:
        if not arg.startswith("--"):
            continue
        key, _, value = arg[2:].partition("=")
        if key == "name":
            jobs.append({"name": value})
        elif key in ("output-format", "output"):
            global_opts[key] = value
        else:
            (jobs[-1] if jobs else global_opts)[key] = value
    return global_opts, jobs or [{"name": "fio"}]


def fio(args: list[str]) -> None:
    """Runs each job (fio's command-line form); jobs of one group share the device, a --stonewall job starts the next
    group. numjobs clones of a job are reported one by one, or as one entry with --group_reporting."""
    global_opts, sections = _fio_sections(args)
    if global_opts.get("output-format", "normal").split(",")[0] not in ("json", "json+"):
        raise ToolError("fio: the simulated node prints --output-format=json only", 1)
    state = _state()
    faults = state["faults"]
    plans, group = [], 0
    for index, section in enumerate(sections):
        opts = {k: v for k, v in global_opts.items() if k not in ("output-format", "output")} | section
        if index and ("stonewall" in section or "wait_for_previous" in section):
            group += 1
        target = opts.get("filename") or (opts.get("directory", "") + "/fio.dat")
        if not target or target == "/fio.dat":
            raise ToolError("fio: no --filename or --directory given", 1)
        rw = opts.get("rw", opts.get("readwrite", "read"))
        if rw not in ("read", "write", "randread", "randwrite"):
            raise ToolError(f"fio: the simulated node models rw=read|write|randread|randwrite, not {rw}", 1)
        kind = storage_kind(target, state)
        if kind == "fx" and faults.get("fx_down"):
            time.sleep(min(5.0, 30 * _scale(state)))
            raise ToolError(f"fio: io_u error on file {target}: Input/output error: read offset=0, buflen=1048576\n"
                            f"fio: pid=4242, err=5/file:io_u.c:1889, func=io_u error, error=Input/output error", 1)
        reading = rw.endswith("read")
        gbps = {"fx": storage.fx_read_gbps if reading else storage.fx_write_gbps,
                "local_nvme": storage.local_read_gbps if reading else storage.local_write_gbps}.get(kind)
        rate = gbps(faults) if gbps else 2.0
        if rw.startswith("rand"):
            rate *= 0.85
        plans.append({"opts": opts, "section": section, "group": group, "target": target, "kind": kind,
                      "reading": reading, "rate": rate, "numjobs": int(opts.get("numjobs", "1"))})
    jobs_out, disk = [], {}
    elapsed = 0.0
    for group_id in sorted({plan["group"] for plan in plans}):
        members = [plan for plan in plans if plan["group"] == group_id]
        clones = sum(plan["numjobs"] for plan in members)
        longest = 0.0
        for plan in members:
            opts, rate = plan["opts"], plan["rate"] * plan["numjobs"] / clones  # concurrent jobs share the device
            size, bs = _size_bytes(opts.get("size", "1g")), _size_bytes(opts.get("bs", "4k"))
            if "time_based" in opts and "runtime" in opts:
                runtime = _seconds(opts["runtime"])
            else:
                runtime = size * plan["numjobs"] / (rate * 1e9)
                if "runtime" in opts:
                    runtime = min(runtime, _seconds(opts["runtime"]))
            longest = max(longest, runtime)
            path = Path(os.path.expanduser(plan["target"]))
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "ab") as handle:
                handle.truncate(max(path.stat().st_size, min(size, 1 << 30)))
            reports = 1 if "group_reporting" in opts else plan["numjobs"]
            for _ in range(reports):
                share = rate / reports
                jobs_out.append(_fio_job(opts, plan["section"], group_id, share, runtime, plan["reading"], bs,
                                         plan["numjobs"] // reports))
            device = {"fx": state["fx"]["namespace"], "local_nvme": state["local_nvme"]["namespace"]}.get(plan["kind"],
                                                                                                         "/dev/sda2")
            entry = disk.setdefault(device, {"read": 0, "write": 0, "ticks": 0})
            entry["read" if plan["reading"] else "write"] += max(1, int(rate * 1e9 * runtime) // bs)
            entry["ticks"] += int(runtime * 1000)
        elapsed += longest
    time.sleep(elapsed * _scale(state))
    now = time.time()
    _print_json({"fio version": "fio-3.36", "timestamp": int(now), "timestamp_ms": int(now * 1000),
                 "time": time.strftime("%a %b %d %H:%M:%S %Y", time.gmtime(now)),
                 "global options": {k: v for k, v in global_opts.items() if k not in ("output-format", "output")},
                 "jobs": jobs_out,
                 "disk_util": [{"name": device.rsplit("/", 1)[-1], "read_ios": io["read"], "write_ios": io["write"],
                                "read_merges": 0, "write_merges": 0, "read_ticks": io["ticks"], "write_ticks": 0,
                                "in_queue": io["ticks"], "util": 99.5} for device, io in disk.items()],
                 "simulated": True})


def _fio_job(opts: dict, section: dict, group: int, rate: float, runtime: float, reading: bool, bs: int,
             clones: int) -> dict:
    io_bytes = int(rate * 1e9 * runtime)
    ios = max(1, io_bytes // bs)
    iops = ios / runtime if runtime else 0.0
    clat_mean = bs / (rate * 1e9) * 1e9 * int(opts.get("iodepth", "1")) * clones
    stats = _fio_dir(io_bytes, rate * 1e9, iops, runtime, ios, clat_mean)
    empty = _fio_dir(0, 0, 0, 0, 0, 0)
    return {"jobname": section.get("name", "fio"), "groupid": group, "job_start": int(time.time() * 1000), "error": 0,
            "eta": 0, "elapsed": max(1, round(runtime)), "job options": dict(section),
            "read": stats if reading else empty, "write": empty if reading else stats, "trim": empty,
            "sync": {"total_ios": 0, "lat_ns": {"min": 0, "max": 0, "mean": 0.0, "stddev": 0.0, "N": 0}},
            "job_runtime": int(runtime * 1000 * clones), "usr_cpu": 0.61, "sys_cpu": 7.93, "ctx": ios // 3,
            "majf": 0, "minf": 8 * clones, "iodepth_level": {"1": 0.0, "2": 0.0, "4": 0.0, "8": 0.0, "16": 0.0,
                                                            "32": 100.0, ">=64": 0.0},
            "latency_ns": {"2": 0.0, "4": 0.0, "10": 0.0, "20": 0.0, "50": 0.0, "100": 0.0, "250": 0.0, "500": 0.0,
                           "750": 0.0, "1000": 0.0}}


def _fio_dir(io_bytes: int, bw_bytes: float, iops: float, runtime: float, ios: int, clat_mean: float) -> dict:
    lat = {"min": int(clat_mean * 0.4), "max": int(clat_mean * 6), "mean": clat_mean, "stddev": clat_mean * 0.3, "N": ios}
    pct = {f"{p:.6f}": int(clat_mean * f) for p, f in ((1, 0.5), (50, 0.95), (90, 1.4), (99, 2.2), (99.9, 3.5))}
    return {"io_bytes": io_bytes, "io_kbytes": io_bytes // 1024, "bw_bytes": int(bw_bytes), "bw": int(bw_bytes / 1024),
            "iops": iops, "runtime": int(runtime * 1000), "total_ios": ios, "short_ios": 0, "drop_ios": 0,
            "slat_ns": {"min": 0, "max": 0, "mean": 0.0, "stddev": 0.0, "N": 0},
            "clat_ns": dict(lat, percentile=pct), "lat_ns": lat,
            "bw_min": int(bw_bytes / 1024 * 0.9), "bw_max": int(bw_bytes / 1024 * 1.1), "bw_agg": 100.0 if ios else 0.0,
            "bw_mean": bw_bytes / 1024, "bw_dev": bw_bytes / 1024 * 0.02, "bw_samples": int(runtime * 2),
            "iops_min": int(iops * 0.9), "iops_max": int(iops * 1.1), "iops_mean": iops, "iops_stddev": iops * 0.02,
            "iops_samples": int(runtime * 2)}


TOOLS = {
    "amd-smi": amd_smi, "rocm-smi": rocm_smi, "nvme": nvme, "mount": mount, "umount": umount, "findmnt": findmnt, "mkfs.xfs": mkfs_xfs,
    "ip": ip, "ethtool": ethtool, "ibv_devinfo": ibv_devinfo, "rdma": rdma, "nproc": nproc, "free": free, "df": df,
    "fio": fio, "sudo": sudo, "lsblk": lsblk,
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in TOOLS:
        print(f"simulated tools: {', '.join(sorted(TOOLS))}", file=sys.stderr)
        return 2
    try:
        TOOLS[argv[0]](argv[1:])
    except ToolError as exc:
        print(str(exc), file=sys.stderr)
        return exc.code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
