"""Parsers of the raw G1 probe outputs into one node inventory (schema fxpilot.inventory/1, docs/contracts.md §3).

Pure functions over text: no ORM, no SSH. Each parser accepts the formats of the real tools across
versions (amd-smi 24.x–26.x and legacy rocm-smi JSON; nvme-cli 1.x and 2.x, flat and verbose; fio 3.x).
Anything that cannot be read is named in ``problems`` with the file it came from, and the field stays null.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

SCHEMA = "fxpilot.inventory/1"

# Each tool the probe runs, and what to install when a node lacks it (shared with runners.preflight).
TOOL_HINTS = {
    "amd-smi": "install ROCm's amd-smi", "rocm-smi": "install ROCm's rocm-smi", "nvme": "install nvme-cli",
    "fio": "install fio", "ethtool": "install ethtool", "ibv_devinfo": "install rdma-core's ibverbs-utils",
    "rdma": "install iproute2's rdma tool", "ip": "install iproute2", "mount": "install util-linux",
    "python3": "install Python 3", "tar": "install tar", "sha256sum": "install coreutils",
    "vllm": "install vLLM or set how it is launched (deployment launch setting)", "sudo": "install sudo",
}
# Probe output file → the tool that printed it (an exit code 127 there means the tool is not installed).
CAPTURE_TOOLS = {
    "amd-smi-version.txt": "amd-smi", "amd-smi-static.json": "amd-smi", "amd-smi-list.json": "amd-smi",
    "rocm-smi.json": "rocm-smi", "ip-link.json": "ip", "ethtool.txt": "ethtool", "ibv_devinfo.txt": "ibv_devinfo",
    "rdma-link.json": "rdma", "nvme-list.json": "nvme", "nvme-list-subsys.json": "nvme", "fio-fx.json": "fio",
    "fio-local.json": "fio", "mounts.txt": "mount",
}


def missing_tool(tool: str, node: str) -> str:
    """"`amd-smi` is not installed on node1: install ROCm's amd-smi"."""
    return f"`{tool}` is not installed on {node}: {TOOL_HINTS.get(tool, 'install it')}"


class ProbeParseError(ValueError):
    """A raw output that cannot be read; the message names the file and what was wrong."""

    def __init__(self, source: str, message: str) -> None:
        self.source = source
        super().__init__(f"{source}: {message}")


def _text(raw: bytes | str | None) -> str:
    if raw is None:
        return ""
    return raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw


def _json(raw: bytes | str | None, source: str) -> Any:
    text = _text(raw).strip()
    if not text:
        raise ProbeParseError(source, "empty output")
    # some tools print warnings before the JSON document
    start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=-1)
    if start < 0:
        raise ProbeParseError(source, "no JSON document in the output")
    try:
        # raw_decode: fio --output-format=json,normal prints its text report after the document
        value, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError as exc:
        line = exc.lineno + text[:start].count("\n")
        raise ProbeParseError(source, f"not valid JSON at line {line}, column {exc.colno}: {exc.msg}") from None
    return value


# --- GPUs --------------------------------------------------------------------------------------

# PCI device ids of Instinct GPUs whose market name some tool versions print as a codename only.
_INSTINCT_DEVICE_IDS = {"0x740f": "MI210", "0x7408": "MI250X", "0x74a1": "MI300X", "0x74a2": "MI308X"}
_INSTINCT = re.compile(r"\bMI\s?(\d{3})([A-Z]{0,2})\b")


def normalise_gpu_model(name: Any, device_id: Any = None) -> str | None:
    """The GPU model as plans name it: "MI308X" from "AMD Instinct MI308X", "MI308X", "AMD INSTINCT MI200 (MCM) …"
    (with its device id 0x7408: "MI250X") or "Instinct MI300X VF"; other GPUs keep their market name."""
    text = str(name).strip() if name not in (None, "", "N/A") else ""
    known = _INSTINCT_DEVICE_IDS.get(str(device_id or "").lower())
    match = _INSTINCT.search(text.upper())
    if known and (not match or not known.startswith("MI" + match.group(1)[:2])):
        return known  # the id is exact where the name is a family ("MI200") or a codename
    if match:
        return f"MI{match.group(1)}{match.group(2)}"
    return known or (text or None)


def _amd_smi_gpus(data: Any, source: str) -> list[dict]:
    """GPU entries of ``amd-smi static|list --json``: a bare list (amd-smi < 26), ``{"gpu_data": [...]}`` (26.x)."""
    if isinstance(data, dict) and isinstance(data.get("gpu_data"), list):
        entries = data["gpu_data"]
    elif isinstance(data, list):
        entries = data
    elif isinstance(data, dict) and any(str(k).lower().startswith("gpu") and isinstance(v, dict) for k, v in data.items()):
        entries = [v for k, v in data.items() if str(k).lower().startswith("gpu") and isinstance(v, dict)]
    else:
        keys = ", ".join(sorted(map(str, data))[:8]) if isinstance(data, dict) else type(data).__name__
        raise ProbeParseError(source, f"not a shape amd-smi prints (a list of GPUs or {{\"gpu_data\": [...]}}); found {keys}")
    gpus = [g for g in entries if isinstance(g, dict)]
    if entries and not gpus:
        raise ProbeParseError(source, "the GPU list holds no objects")
    return gpus


def _megabytes(value: Any, unit: str | None = None) -> float | None:
    """A size in MB from amd-smi's shapes: {"value", "unit"}, "196592 MB", or a bare number (MB)."""
    if isinstance(value, dict):
        return _megabytes(value.get("value"), value.get("unit"))
    if isinstance(value, str):
        match = re.match(r"^\s*([\d.]+)\s*([KMGT]i?B|B)?\s*$", value, re.IGNORECASE)
        if not match:
            return None
        return _megabytes(float(match.group(1)), match.group(2) or unit)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        scale = {"B": 2**-20, "KB": 2**-10, "KIB": 2**-10, "MB": 1, "MIB": 1, "GB": 1024, "GIB": 1024, "TB": 2**20}
        return float(value) * scale.get((unit or "MB").upper(), 1)
    return None


def _index(value: Any, position: int) -> int:
    return int(value) if isinstance(value, int) or (isinstance(value, str) and value.isdigit()) else position


def _known(value: Any) -> Any:
    return None if value in (None, "", "N/A") else value


def parse_amd_smi_static(raw: bytes | str) -> dict:
    """``amd-smi static --json`` of amd-smi 24.x–26.x (ROCm 6.x–7.x): the summary and one entry per GPU."""
    source = "amd-smi-static.json"
    gpus = _amd_smi_gpus(_json(raw, source), source)
    if not gpus:
        raise ProbeParseError(source, "no GPU entries")
    if not any(isinstance(g.get("asic"), dict) or isinstance(g.get("board"), dict) for g in gpus):
        raise ProbeParseError(source, f"GPU entries without asic or board sections (keys: {', '.join(sorted(gpus[0]))})")
    devices = []
    for position, gpu in enumerate(gpus):
        asic, board, vram = gpu.get("asic") or {}, gpu.get("board") or {}, gpu.get("vram") or {}
        market = _known(asic.get("market_name")) or _known(board.get("product_name")) or _known(asic.get("product_name"))
        size = next((vram[k] for k in ("size", "vram_size", "vram_size_mb", "size_mb") if k in vram), None)
        memory = _megabytes(size)
        devices.append({"index": _index(gpu.get("gpu"), position),
                        "model": normalise_gpu_model(market, asic.get("device_id")),
                        "market_name": market, "memory_gb": round(memory / 1024) if memory else None,
                        "arch": _known(asic.get("target_graphics_version")) or _known(asic.get("gfx_version")),
                        "device_id": _known(asic.get("device_id")), "bdf": _known((gpu.get("bus") or {}).get("bdf"))})
    return _gpu_summary(devices)


def parse_amd_smi_list(raw: bytes | str) -> list[dict]:
    """``amd-smi list --json`` (or its text form "GPU: 0 / BDF: … / UUID: …"): [{"index", "bdf", "uuid", "kfd_id"}]."""
    source = "amd-smi-list.json"
    text = _text(raw).strip()
    if re.match(r"^GPU:\s*\d+", text):
        rows, current = [], None
        for line in text.splitlines():
            key, _, value = line.strip().partition(":")
            if key == "GPU":
                current = {"index": int(value.strip()), "bdf": None, "uuid": None, "kfd_id": None}
                rows.append(current)
            elif current is not None and key.lower() in ("bdf", "uuid", "kfd_id"):
                current[key.lower()] = value.strip()
        return rows
    gpus = _amd_smi_gpus(_json(raw, source), source)
    if gpus and not any("bdf" in g or "uuid" in g for g in gpus):
        raise ProbeParseError(source, f"GPU entries without bdf or uuid (keys: {', '.join(sorted(gpus[0]))})")
    return [{"index": _index(g.get("gpu"), i), "bdf": _known(g.get("bdf")), "uuid": _known(g.get("uuid")),
             "kfd_id": _known(g.get("kfd_id"))} for i, g in enumerate(gpus)]


def parse_rocm_smi(raw: bytes | str) -> dict:
    """Legacy ``rocm-smi --showproductname --showmeminfo vram --json``: {"card0": {"Card Series"|"Device Name", …}}."""
    source = "rocm-smi.json"
    data = _json(raw, source)
    cards = sorted(((k, v) for k, v in data.items() if re.fullmatch(r"card\d+", str(k).lower()) and isinstance(v, dict)),
                   key=lambda kv: int(kv[0][4:])) if isinstance(data, dict) else []
    if not cards:
        keys = ", ".join(sorted(map(str, data))[:8]) if isinstance(data, dict) else type(data).__name__
        raise ProbeParseError(source, f"no card entries (cardN) in the output; found {keys}")
    devices = []
    for name, card in cards:
        fields = {k.lower(): v for k, v in card.items()}
        market = _known(fields.get("card series")) or _known(fields.get("device name")) or _known(fields.get("card sku"))
        device_id = _known(fields.get("device id")) or _known(fields.get("card model"))
        vram = _known(fields.get("vram total memory (b)"))
        devices.append({"index": int(name[4:]), "model": normalise_gpu_model(market, device_id), "market_name": market,
                        "memory_gb": round(int(vram) / 2**30) if vram and str(vram).isdigit() else None,
                        "arch": _known(fields.get("gfx version")), "device_id": device_id, "bdf": _known(fields.get("pci bus"))})
    return _gpu_summary(devices)


def _gpu_summary(devices: list[dict]) -> dict:
    """The summary keys (count, model, memory_gb, arch) over the per-GPU entries, which are kept as ``devices``."""
    def common(values: list) -> Any:
        known = [v for v in values if v]
        return max(set(known), key=known.count) if known else None

    model = common([d["model"] for d in devices])
    # the summary names the GPU as the tool does ("AMD Instinct MI308X") when that name contains the model
    market = common([d["market_name"] for d in devices if d["model"] == model and d.get("market_name")])
    return {"count": len(devices), "model": market if market and model and model in market.upper() else model,
            "memory_gb": common([d["memory_gb"] for d in devices]), "arch": common([d["arch"] for d in devices]),
            "devices": devices}


def parse_rocm_version(amd_smi_version: bytes | str | None, rocm_version_file: bytes | str | None) -> str | None:
    text = _text(amd_smi_version)
    match = re.search(r"ROCm version:\s*([\d.]+)", text) or re.search(r'"rocm_version":\s*"([\d.]+)', text)
    if match:
        return match.group(1)
    match = re.match(r"\s*(\d+\.\d+(?:\.\d+)?)", _text(rocm_version_file))
    return match.group(1) if match else None


# --- software -----------------------------------------------------------------------------------

def parse_vllm_version(raw: bytes | str | None) -> str | None:
    for line in reversed(_text(raw).strip().splitlines()):
        match = re.search(r"(\d+\.\d+(?:\.\d+)?(?:[.+-][\w.+-]*)?)\s*$", line.strip())
        if match:
            return match.group(1)
    return None


def parse_lmcache(raw: bytes | str) -> dict:
    data = _json(raw, "lmcache.json")
    if not data.get("installed"):
        return {"version": None, "commit": None, "hip": None}
    out = {"version": data.get("version"), "commit": data.get("commit"), "hip": data.get("hip")}
    # lmcache_inspect.py's fingerprint of the installed build ({sha256, version, commit, disk_io_threads, …}) and
    # whether it serves DELETE /cache/clear (how cold windows empty its DRAM tier): kept when the node reported them
    if isinstance(data.get("fingerprint"), dict):
        out["fingerprint"] = {key: data["fingerprint"].get(key) for key in
                              ("sha256", "version", "commit", "disk_io_threads", "disk_io_threads_from", "files")}
    if isinstance(data.get("clear_api"), bool):
        out["clear_api"] = data["clear_api"]
    return out


# --- network ------------------------------------------------------------------------------------

def parse_ethtool(raw: bytes | str | None) -> dict[str, dict]:
    """Interface → {"speed_gbps", "link"} from one or more concatenated ``ethtool IFACE`` outputs."""
    out: dict[str, dict] = {}
    current = None
    for line in _text(raw).splitlines():
        header = re.match(r"^Settings for (\S+):", line)
        if header:
            current = out.setdefault(header.group(1), {"speed_gbps": None, "link": None})
            continue
        if current is None:
            continue
        speed = re.match(r"^\s*Speed:\s*(\d+)\s*Mb/s", line)
        if speed:
            current["speed_gbps"] = int(speed.group(1)) / 1000
        link = re.match(r"^\s*Link detected:\s*(\w+)", line)
        if link:
            current["link"] = link.group(1) == "yes"
    return out


def parse_rdma_link(raw: bytes | str | None) -> dict[str, dict]:
    """Net device → {"rdma_device", "state"} from ``rdma -j link show`` (or its text form)."""
    text = _text(raw).strip()
    out: dict[str, dict] = {}
    if text.startswith("["):
        for row in _json(text, "rdma-link.json"):
            if row.get("netdev"):
                out[row["netdev"]] = {"rdma_device": row.get("ifname"), "state": row.get("state")}
        return out
    for match in re.finditer(r"link (\S+?)/\d+ state (\S+).*?netdev (\S+)", text):
        out[match.group(3)] = {"rdma_device": match.group(1), "state": match.group(2)}
    return out


def parse_ibv_devinfo(raw: bytes | str | None) -> dict[str, dict]:
    """HCA → {"port_state", "link_layer"} (first port)."""
    out: dict[str, dict] = {}
    current = None
    for line in _text(raw).splitlines():
        hca = re.match(r"^hca_id:\s*(\S+)", line)
        if hca:
            current = out.setdefault(hca.group(1), {"port_state": None, "link_layer": None})
        elif current is not None:
            state = re.match(r"^\s*state:\s*(\S+)", line)
            if state and current["port_state"] is None:
                current["port_state"] = state.group(1)
            layer = re.match(r"^\s*link_layer:\s*(\S+)", line)
            if layer and current["link_layer"] is None:
                current["link_layer"] = layer.group(1)
    return out


def parse_nics(ip_link: bytes | str, ethtool: bytes | str | None, rdma_link: bytes | str | None,
               ibv_devinfo: bytes | str | None) -> list[dict]:
    speeds, rdma, hcas = parse_ethtool(ethtool), parse_rdma_link(rdma_link), parse_ibv_devinfo(ibv_devinfo)
    try:
        links = _json(ip_link, "ip-link.json")
    except ProbeParseError:
        if not speeds:
            raise
        # iproute2 without -j: the interfaces ethtool described, up when it detected a link
        links = [{"ifname": name, "operstate": "UP" if eth["link"] else "DOWN"} for name, eth in speeds.items()]
    nics = []
    for link in links:
        name = link.get("ifname")
        if not name or link.get("link_type") == "loopback" or name == "lo":
            continue
        eth = speeds.get(name, {})
        up = link.get("operstate") == "UP" and eth.get("link") is not False
        device = rdma.get(name, {}).get("rdma_device")
        hca = hcas.get(device or "", {})
        nic = {"name": name, "state": "up" if up else "down", "speed_gbps": eth.get("speed_gbps"), "rdma_device": device,
               "rdma_state": None}
        if device:
            port = hca.get("port_state")
            # the port state as the tools print it: rdma link's ACTIVE/DOWN/INIT, else ibv_devinfo's PORT_ACTIVE → ACTIVE
            state = rdma[name].get("state") or (port.removeprefix("PORT_") if port else None)
            nic.update({"rdma_state": state, "port_state": port, "link_layer": hca.get("link_layer")})
        nics.append(nic)
    return nics


# --- NVMe ---------------------------------------------------------------------------------------

def _walk(value: Any) -> Iterator[dict]:
    if isinstance(value, dict):
        yield value
        for child in value.values():
            yield from _walk(child)
    elif isinstance(value, list):
        for child in value:
            yield from _walk(child)


def _controller_of(namespace: str) -> str | None:
    match = re.match(r"(?:/dev/)?(nvme\d+)(?:c\d+)?n\d+$", namespace)
    return match.group(1) if match else None


def _traddr(address: str | None) -> str | None:
    match = re.search(r"traddr=([^,\s]+)", address or "")
    return match.group(1) if match else (address or None)


def parse_nvme_list(raw: bytes | str) -> list[dict]:
    """Namespaces of ``nvme list -o json``: [{"namespace": "/dev/nvme0n1", "controller", "model", "size_bytes"}].

    Three shapes: nvme-cli 1.x and 2.x flat (``Devices[].DevicePath``); ``nvme list -v`` of 2.x and the plain
    output of 2.11+ (``Devices[].Subsystems[]``, namespaces under the subsystem when multipathed, else under each of
    its ``Controllers[]``), which also names the subsystem NQN, transport and address of each namespace.
    """
    source = "nvme-list.json"
    data = _json(raw, source)
    devices = data.get("Devices") if isinstance(data, dict) else None
    if not isinstance(devices, list):
        keys = ", ".join(sorted(map(str, data))[:8]) if isinstance(data, dict) else type(data).__name__
        raise ProbeParseError(source, f"not a shape nvme-cli prints (an object with a Devices list); found {keys}")
    namespaces: list[dict] = []
    for device in devices:
        if not isinstance(device, dict):
            raise ProbeParseError(source, "a Devices entry is not an object")
        if "DevicePath" in device:  # flat: nvme-cli 1.x and 2.x before 2.11
            path = device["DevicePath"]
            namespaces.append({"namespace": path, "controller": _controller_of(path),
                               "model": (device.get("ModelNumber") or "").strip() or None,
                               "size_bytes": device.get("PhysicalSize")})
        elif isinstance(device.get("Subsystems"), list):  # nested: nvme list -v of 2.x, nvme list of 2.11+
            for subsystem in device["Subsystems"]:
                namespaces += _subsystem_namespaces(subsystem, source)
        else:
            raise ProbeParseError(source, "a Devices entry has neither DevicePath (nvme-cli 1.x/2.x) nor Subsystems "
                                          f"(2.11); its keys: {', '.join(sorted(device)) or 'none'}")
    return namespaces


def _subsystem_namespaces(subsystem: Any, source: str) -> list[dict]:
    if not isinstance(subsystem, dict) or not isinstance(subsystem.get("Controllers", []), list):
        raise ProbeParseError(source, "a Subsystems entry is not an object with a Controllers list")
    controllers = [c for c in subsystem.get("Controllers") or [] if isinstance(c, dict)]
    nqn = subsystem.get("SubsystemNQN") or subsystem.get("NQN")
    out = []

    def add(ns: dict, controller: dict | None) -> None:
        name = ns.get("NameSpace")
        if not isinstance(name, str):
            raise ProbeParseError(source, f"a namespace of {subsystem.get('Subsystem') or nqn} has no NameSpace name")
        ctrl = controller or next((c for c in controllers if c.get("Controller") == _controller_of(name)), None) \
            or (controllers[0] if controllers else {})
        out.append({"namespace": "/dev/" + name, "controller": ctrl.get("Controller") or _controller_of(name),
                    "model": (ctrl.get("ModelNumber") or "").strip() or None, "size_bytes": ns.get("PhysicalSize"),
                    "nqn": nqn, "transport": ctrl.get("Transport"), "address": _traddr(ctrl.get("Address"))})

    for ns in subsystem.get("Namespaces") or []:  # multipath: the subsystem's namespaces, reached by every controller
        add(ns, None)
    for controller in controllers:  # without multipath: each controller's own namespaces
        for ns in controller.get("Namespaces") or []:
            add(ns, controller)
    return out


def parse_nvme_subsystems(raw: bytes | str) -> list[dict]:
    """Subsystems with their paths: [{"nqn", "name", "paths": [{"controller", "transport", "traddr", "state"}]}]."""
    source = "nvme-list-subsys.json"
    data = _json(raw, source)
    subsystems: list[dict] = []
    lists = [e["Subsystems"] for e in _walk(data) if isinstance(e.get("Subsystems"), list)]
    if not lists and data not in ([], {}):
        keys = ", ".join(sorted(map(str, data))[:8]) if isinstance(data, dict) else type(data).__name__
        raise ProbeParseError(source, f"not a shape nvme-cli prints (Subsystems lists, per host in 2.x); found {keys}")
    for items in lists:
        for item in items:
            if not isinstance(item, dict):
                continue
            if "NQN" in item or "SubsystemNQN" in item:
                subsystems.append({"nqn": item.get("NQN") or item.get("SubsystemNQN"), "name": item.get("Name"), "paths": []})
            paths = item.get("Paths")
            if isinstance(paths, list) and subsystems:  # in nvme-cli 1.x the Paths follow in their own object
                for path in paths:
                    subsystems[-1]["paths"].append({"controller": path.get("Name"), "transport": path.get("Transport"),
                                                    "traddr": _traddr(path.get("Address")), "state": path.get("State")})
    return subsystems


def parse_nvme_pcie(raw: bytes | str | None) -> dict[str, int | None]:
    """Controller → PCIe generation from the link speed sysfs reports (16 GT/s = Gen4)."""
    gens = {"2.5": 1, "5.0": 2, "8.0": 3, "16.0": 4, "32.0": 5, "64.0": 6}
    out = {}
    for line in _text(raw).splitlines():
        match = re.match(r"^(nvme\d+)\s+transport=(\S*)\s+speed=(\S*)", line)
        if match:
            speed = re.match(r"([\d.]+)", match.group(3))
            out[match.group(1)] = gens.get(f"{float(speed.group(1)):.1f}") if speed else None
    return out


# --- mounts, storage, host ------------------------------------------------------------------------

def parse_mounts(raw: bytes | str) -> list[dict]:
    """``mount`` output ("DEV on PATH type FS (OPTS)") or /proc/mounts lines ("DEV PATH FS OPTS 0 0")."""
    rows = []
    for line in _text(raw).splitlines():
        match = re.match(r"^(\S+) on (.+?) type (\S+) \((.*)\)$", line)
        if match:
            rows.append({"device": match.group(1), "path": match.group(2), "fstype": match.group(3),
                         "options": match.group(4)})
            continue
        parts = line.split()
        if len(parts) >= 4:
            rows.append({"device": parts[0], "path": parts[1], "fstype": parts[2], "options": parts[3]})
    return rows


def parse_fx_write(raw: bytes | str | None) -> dict:
    fields = dict(re.findall(r"(\w+)=(\S+)", _text(raw)))
    return {"mounted": fields.get("mounted") == "yes", "writable": fields.get("writable") == "yes", "path": fields.get("path")}


_SEQUENTIAL_READ = {"read"}


def _fio_rw(options: Any) -> str | None:
    if not isinstance(options, dict):
        return None
    value = options.get("rw", options.get("readwrite"))
    return str(value).split(":", 1)[0].strip() if value is not None else None


def parse_fio(raw: bytes | str, source: str, job_name: str | None = None) -> dict:
    """Sequential-read bandwidth in GB/s (10^9 B/s) of a fio 2.x/3.x JSON report, from its rw=read jobs only.

    A job's rw comes from its ``job options`` or else the report's ``global options``. fio 2.x printed neither: then
    only the jobs named ``job_name`` (the name the probe gave its sequential-read job) count. Concurrent jobs of one
    group (numjobs without group_reporting) are summed; of several groups (stonewall) the fastest is used. The jobs
    used are recorded in ``job``, ``jobs`` and ``groupid``.
    """
    data = _json(raw, source)
    jobs = data.get("jobs") if isinstance(data, dict) else None
    if not isinstance(jobs, list) or not jobs:
        found = ", ".join(sorted(map(str, data))[:8]) if isinstance(data, dict) else type(data).__name__
        raise ProbeParseError(source, f"no jobs in the fio report (found {found})")
    global_rw = _fio_rw(data.get("global options"))
    chosen, seen = [], []
    for job in jobs:
        if not isinstance(job, dict) or not isinstance(job.get("read"), dict):
            raise ProbeParseError(source, "a fio job without a read section: not a fio JSON report")
        rw = _fio_rw(job.get("job options")) or global_rw
        name = job.get("jobname")
        seen.append(f"{name} ({rw or 'rw not reported'})")
        if job.get("error") and (rw is None or rw in _SEQUENTIAL_READ):
            raise ProbeParseError(source, f"fio job {name} failed with error {job['error']}")
        if rw in _SEQUENTIAL_READ or (rw is None and job_name is not None and name == job_name):
            chosen.append(job)
    if not chosen:
        reported = any(_fio_rw(j.get("job options")) for j in jobs) or global_rw is not None
        why = "no sequential-read job (rw=read)" if reported or job_name is None else f"no job named {job_name}"
        raise ProbeParseError(source, f"{why} among the jobs {', '.join(seen)}")
    groups: dict[Any, list[dict]] = {}
    for job in chosen:
        groups.setdefault(job.get("groupid", 0), []).append(job)

    def bandwidth(job: dict) -> float:
        read = job["read"]
        if "bw_bytes" in read:
            return float(read["bw_bytes"])
        if "bw" in read:  # fio < 3.2 reports KiB/s only
            return float(read["bw"]) * 1024
        raise ProbeParseError(source, f"fio job {job.get('jobname')} reports no read bandwidth (bw_bytes or bw)")

    totals = {group: sum(bandwidth(j) for j in members) for group, members in groups.items()}
    group = max(totals, key=totals.get)
    names = sorted({str(j.get("jobname")) for j in groups[group]})
    result = {"read_gbps": round(totals[group] / 1e9, 3), "job": ", ".join(names), "jobs": len(groups[group]),
              "groupid": group}
    version = data.get("fio version")
    if version:
        result["fio_version"] = version
    return result


def parse_nproc(raw: bytes | str | None) -> int | None:
    text = _text(raw).strip()
    return int(text) if text.isdigit() else None


def parse_free(raw: bytes | str | None) -> int | None:
    """Total memory in GiB from ``free -b``."""
    for line in _text(raw).splitlines():
        if line.startswith("Mem:"):
            return round(int(line.split()[1]) / 2**30)
    return None


def parse_df(raw: bytes | str | None) -> list[dict]:
    rows = []
    for line in _text(raw).splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 6 and parts[1].isdigit():
            rows.append({"device": parts[0], "size_bytes": int(parts[1]), "used_bytes": int(parts[2]),
                         "available_bytes": int(parts[3]), "path": " ".join(parts[5:])})
    return rows


# --- the inventory ------------------------------------------------------------------------------

def build_inventory(node: str, raw: dict[str, bytes | str], *, simulated: bool, fx_mount: str, fx_nqn: str | None,
                    exit_codes: dict[str, int] | None = None) -> dict:
    """One node's inventory from its raw probe outputs (file name → content); ``fx_mount`` is the absolute path."""
    problems: list[str] = []
    exit_codes = exit_codes or {}

    def attempt(source: str, parse, default=None):
        if exit_codes.get(source) == 127:
            return default  # the tool is not installed: named once, not as an unreadable output
        try:
            return parse()
        except ProbeParseError as exc:
            problems.append(str(exc))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            problems.append(f"{source}: unexpected shape ({type(exc).__name__}: {exc})")
        return default

    def have(name: str) -> bool:
        return bool(_text(raw.get(name)).strip()) and exit_codes.get(name, 0) == 0

    missing = sorted({tool for name, tool in CAPTURE_TOOLS.items() if exit_codes.get(name) == 127})
    for tool in missing:
        if tool != "rocm-smi":  # only the fallback of amd-smi, which is named when it is missing too
            problems.append(missing_tool(tool, node))

    gpus = {"count": 0, "model": None, "memory_gb": None, "arch": None, "devices": []}
    if have("amd-smi-static.json"):
        gpus = attempt("amd-smi-static.json", lambda: parse_amd_smi_static(raw["amd-smi-static.json"]), gpus)
    if not gpus.get("count") and have("rocm-smi.json"):
        gpus = attempt("rocm-smi.json", lambda: parse_rocm_smi(raw["rocm-smi.json"]), gpus)
    if have("amd-smi-list.json"):
        listed = attempt("amd-smi-list.json", lambda: parse_amd_smi_list(raw["amd-smi-list.json"]), None)
        if listed is not None and gpus.get("count") and len(listed) != gpus["count"]:
            problems.append(f"amd-smi-list.json: lists {len(listed)} GPUs where amd-smi static describes {gpus['count']}")
        for device in gpus["devices"]:
            entry = next((e for e in listed or [] if e["index"] == device["index"]), None)
            if entry:
                device.update({"bdf": device.get("bdf") or entry["bdf"], "uuid": entry["uuid"]})
    if not gpus.get("count") and not ({"amd-smi", "rocm-smi"} <= set(missing)):
        problems.append("amd-smi-static.json, rocm-smi.json: no GPU found by either tool")

    rocm = parse_rocm_version(raw.get("amd-smi-version.txt"), raw.get("rocm-version.txt"))
    vllm = parse_vllm_version(raw.get("vllm-version.txt")) if have("vllm-version.txt") else None
    lmcache = {"version": None, "commit": None, "hip": None}
    if have("lmcache.json"):
        lmcache = attempt("lmcache.json", lambda: parse_lmcache(raw["lmcache.json"]), lmcache)
    nics = attempt("ip-link.json", lambda: parse_nics(raw.get("ip-link.json"), raw.get("ethtool.txt"),
                                                      raw.get("rdma-link.json"), raw.get("ibv_devinfo.txt")), [])

    namespaces = attempt("nvme-list.json", lambda: parse_nvme_list(raw.get("nvme-list.json")), []) or []
    subsystems = attempt("nvme-list-subsys.json", lambda: parse_nvme_subsystems(raw.get("nvme-list-subsys.json")), []) or []
    if not subsystems:
        subsystems = _subsystems_from_namespaces(namespaces)
    pcie = parse_nvme_pcie(raw.get("nvme-pcie.txt"))
    mounts = attempt("mounts.txt", lambda: parse_mounts(raw.get("mounts.txt")), []) or []
    mount_of = {m["device"]: m for m in mounts}

    fabric = [s for s in subsystems if any(p["transport"] in ("rdma", "tcp") for p in s["paths"])]
    fx_subsys = next((s for s in fabric if fx_nqn and s["nqn"] == fx_nqn), None)
    if fx_subsys is None and fabric and not fx_nqn:
        fx_subsys = fabric[0]
    fx_controllers = {p["controller"] for p in (fx_subsys or {}).get("paths", [])}
    fx_ns = next((n for n in namespaces if n["controller"] in fx_controllers), None)
    if fx_ns is None and fx_subsys is not None:
        # with native multipath the namespace is numbered after the subsystem (nvme-subsys1 → nvme1n1)
        number = re.search(r"(\d+)$", fx_subsys.get("name") or "")
        fx_ns = next((n for n in namespaces if number and n["controller"] == f"nvme{number.group(1)}"), None)
    write = parse_fx_write(raw.get("fx-write.txt"))
    fx_mounted_row = next((m for m in mounts if m["path"] == fx_mount), None)
    fx = {
        "transport": (fx_subsys["paths"][0]["transport"] if fx_subsys and fx_subsys["paths"] else None),
        "nqn": fx_subsys["nqn"] if fx_subsys else None,
        "address": (fx_subsys["paths"][0]["traddr"] if fx_subsys and fx_subsys["paths"] else None),
        "path_state": (fx_subsys["paths"][0]["state"] if fx_subsys and fx_subsys["paths"] else None),
        "namespace": fx_ns["namespace"] if fx_ns else None,
        "size_gb": round(fx_ns["size_bytes"] / 1e9) if fx_ns and fx_ns.get("size_bytes") else None,
        "mounted": bool(fx_ns and fx_mounted_row and fx_mounted_row["device"] == fx_ns["namespace"]),
        "mount_path": fx_mount,
        "writable": write["writable"],
    }
    if fx_subsys is None:
        problems.append(f"nvme-list-subsys.json: no NVMe-oF subsystem {fx_nqn or ''} is connected".replace("  ", " "))
    elif fx_mounted_row and fx_ns and fx_mounted_row["device"] != fx_ns["namespace"]:
        problems.append(f"mounts.txt: {fx_mount} holds {fx_mounted_row['device']}, not the FX namespace {fx_ns['namespace']}")

    fabric_controllers = {p["controller"] for s in fabric for p in s["paths"]}
    local_ns = next((n for n in namespaces if n["controller"] not in fabric_controllers
                     and pcie.get(n["controller"] or "") is not None), None) \
        or next((n for n in namespaces if n["controller"] not in fabric_controllers), None)
    local = {"namespace": None, "model": None, "size_gb": None, "pcie_gen": None}
    if local_ns:
        local = {"namespace": local_ns["namespace"], "model": local_ns["model"],
                 "size_gb": round(local_ns["size_bytes"] / 1e9) if local_ns.get("size_bytes") else None,
                 "pcie_gen": pcie.get(local_ns["controller"] or "")}
        if local_ns["namespace"] in mount_of:
            local["mount_path"] = mount_of[local_ns["namespace"]]["path"]
    else:
        problems.append("nvme-list.json: no local NVMe namespace")

    fio = {}
    for arm, name, job in (("fx", "fio-fx.json", "fx-seqread"), ("local_nvme", "fio-local.json", "local-seqread")):
        if have(name):
            fio[arm] = attempt(name, lambda name=name, job=job: parse_fio(raw[name], name, job), {"read_gbps": None})
        elif exit_codes.get(name) == 127:
            fio[arm] = {"read_gbps": None}  # named once above: fio is not installed
        else:
            err = _text(raw.get(name + ".err")).strip().splitlines()
            problems.append(f"{name}: fio did not run (exit {exit_codes.get(name, '?')})" + (f": {err[-1]}" if err else ""))
            fio[arm] = {"read_gbps": None}

    return {
        "schema": SCHEMA, "node": node, "simulated": simulated,
        "gpus": gpus, "rocm": rocm, "vllm": vllm, "lmcache": lmcache, "nics": nics,
        "fx": fx, "local_nvme": local, "mounts": mounts, "fio": fio,
        "cpu_cores": parse_nproc(raw.get("nproc.txt")), "memory_gb": parse_free(raw.get("free.txt")),
        "disks": parse_df(raw.get("df.txt")),
        "problems": problems,
    }


def _subsystems_from_namespaces(namespaces: list[dict]) -> list[dict]:
    """Subsystems as ``parse_nvme_subsystems`` gives them, from the NQN and address nvme-cli 2.11 lists per namespace."""
    out: dict[str, dict] = {}
    for ns in namespaces:
        if ns.get("nqn"):
            entry = out.setdefault(ns["nqn"], {"nqn": ns["nqn"], "name": None, "paths": []})
            if ns.get("controller") and all(p["controller"] != ns["controller"] for p in entry["paths"]):
                entry["paths"].append({"controller": ns["controller"], "transport": ns.get("transport"),
                                       "traddr": ns.get("address"), "state": None})
    return list(out.values())


def missing_fields(inventory: dict) -> list[str]:
    """Dotted names of the contract's fields that are null or empty: what the probe could not establish."""
    required = ["gpus.count", "gpus.model", "gpus.memory_gb", "gpus.arch", "rocm", "vllm", "lmcache.version",
                "lmcache.commit", "lmcache.hip", "nics", "fx.transport", "fx.nqn", "fx.namespace", "fx.mounted",
                "fx.mount_path", "fx.writable", "local_nvme.namespace", "local_nvme.model", "local_nvme.size_gb",
                "local_nvme.pcie_gen", "mounts", "fio.fx.read_gbps", "fio.local_nvme.read_gbps", "cpu_cores", "memory_gb"]
    missing = []
    for name in required:
        value: Any = inventory
        for part in name.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is None or value == "" or value == [] or value == {}:
            missing.append(name)
    return missing
