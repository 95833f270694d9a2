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
        return json.loads(text[start:])
    except json.JSONDecodeError as exc:
        raise ProbeParseError(source, f"not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None


# --- GPUs --------------------------------------------------------------------------------------

def _amd_smi_gpus(data: Any) -> list[dict]:
    if isinstance(data, dict) and isinstance(data.get("gpu_data"), list):
        return [g for g in data["gpu_data"] if isinstance(g, dict)]
    if isinstance(data, list):
        return [g for g in data if isinstance(g, dict)]
    if isinstance(data, dict):
        return [g for key, g in data.items() if isinstance(g, dict) and key.lower().startswith("gpu")]
    return []


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


def parse_amd_smi_static(raw: bytes | str) -> dict:
    gpus = _amd_smi_gpus(_json(raw, "amd-smi-static.json"))
    if not gpus:
        raise ProbeParseError("amd-smi-static.json", "no GPU entries")
    models, memories, arches = [], [], []
    for gpu in gpus:
        asic, board, vram = gpu.get("asic") or {}, gpu.get("board") or {}, gpu.get("vram") or {}
        model = asic.get("market_name") or board.get("product_name") or asic.get("product_name")
        models.append(model if model and model != "N/A" else None)
        size = next((vram[k] for k in ("size", "vram_size", "vram_size_mb", "size_mb") if k in vram), None)
        memories.append(_megabytes(size))
        arches.append(asic.get("target_graphics_version") or asic.get("gfx_version") or None)
    return _gpu_summary(models, memories, arches)


def parse_rocm_smi(raw: bytes | str) -> dict:
    data = _json(raw, "rocm-smi.json")
    cards = [v for k, v in data.items() if k.lower().startswith("card") and isinstance(v, dict)] if isinstance(data, dict) else []
    if not cards:
        raise ProbeParseError("rocm-smi.json", "no card entries")
    models, memories, arches = [], [], []
    for card in cards:
        fields = {k.lower(): v for k, v in card.items()}
        model = fields.get("card series") or fields.get("card model") or fields.get("card sku")
        models.append(model if model and model != "N/A" else None)
        vram = fields.get("vram total memory (b)")
        memories.append(int(vram) / 2**20 if vram not in (None, "N/A") else None)
        arches.append(fields.get("gfx version"))
    return _gpu_summary(models, memories, arches)


def _gpu_summary(models: list, memories: list, arches: list) -> dict:
    def common(values: list) -> Any:
        known = [v for v in values if v]
        return max(set(known), key=known.count) if known else None

    memory = common([round(m / 1024) for m in memories if m])
    return {"count": len(models), "model": common(models), "memory_gb": memory, "arch": common(arches),
            "models": sorted({m for m in models if m})}


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
    return {"version": data.get("version"), "commit": data.get("commit"), "hip": data.get("hip")}


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
        nic = {"name": name, "state": "up" if up else "down", "speed_gbps": eth.get("speed_gbps"), "rdma_device": device}
        if device:
            nic.update({"rdma_state": rdma[name].get("state"), "port_state": hca.get("port_state"),
                        "link_layer": hca.get("link_layer")})
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


def parse_nvme_list(raw: bytes | str) -> list[dict]:
    """Namespaces: [{"namespace": "/dev/nvme0n1", "controller": "nvme0", "model", "size_bytes"}], nvme-cli 1.x/2.x."""
    data = _json(raw, "nvme-list.json")
    namespaces = []
    for entry in _walk(data):
        if "DevicePath" in entry:  # flat form: nvme-cli 1.x and 2.x without -v
            path = entry["DevicePath"]
            ctrl = re.match(r"/dev/(nvme\d+)n\d+", path)
            namespaces.append({"namespace": path, "controller": ctrl.group(1) if ctrl else None,
                               "model": (entry.get("ModelNumber") or "").strip() or None,
                               "size_bytes": entry.get("PhysicalSize")})
        elif "Namespaces" in entry and "Controllers" in entry:  # verbose form of nvme-cli 2.x (Subsystems)
            controllers = [c for c in entry.get("Controllers") or [] if isinstance(c, dict)]
            model = next(((c.get("ModelNumber") or "").strip() for c in controllers if c.get("ModelNumber")), None)
            for ns in entry.get("Namespaces") or []:
                name = ns.get("NameSpace")
                if isinstance(name, str):
                    ctrl = re.match(r"(nvme\d+)n\d+", name)
                    namespaces.append({"namespace": "/dev/" + name, "controller": ctrl.group(1) if ctrl else None,
                                       "model": model, "size_bytes": ns.get("PhysicalSize")})
    return namespaces


def parse_nvme_subsystems(raw: bytes | str) -> list[dict]:
    """Subsystems with their paths: [{"nqn", "name", "paths": [{"controller", "transport", "traddr", "state"}]}]."""
    data = _json(raw, "nvme-list-subsys.json")
    subsystems: list[dict] = []
    lists = [e["Subsystems"] for e in _walk(data) if isinstance(e.get("Subsystems"), list)]
    for items in lists:
        for item in items:
            if not isinstance(item, dict):
                continue
            if "NQN" in item or "SubsystemNQN" in item:
                subsystems.append({"nqn": item.get("NQN") or item.get("SubsystemNQN"), "name": item.get("Name"), "paths": []})
            paths = item.get("Paths")
            if isinstance(paths, list) and subsystems:  # in nvme-cli 1.x the Paths follow in their own object
                for path in paths:
                    address = path.get("Address") or ""
                    traddr = re.search(r"traddr=([^,\s]+)", address)
                    subsystems[-1]["paths"].append({"controller": path.get("Name"), "transport": path.get("Transport"),
                                                    "traddr": traddr.group(1) if traddr else address or None,
                                                    "state": path.get("State")})
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


def parse_fio(raw: bytes | str, source: str) -> dict:
    """Sequential read bandwidth in GB/s (10^9 B/s) summed over the jobs of a fio 3.x JSON report."""
    data = _json(raw, source)
    jobs = data.get("jobs") if isinstance(data, dict) else None
    if not jobs:
        raise ProbeParseError(source, "no jobs in the fio report")
    total = 0.0
    for job in jobs:
        if job.get("error"):
            raise ProbeParseError(source, f"fio job {job.get('jobname')} failed with error {job['error']}")
        read = job.get("read") or {}
        if "bw_bytes" in read:
            total += float(read["bw_bytes"])
        elif "bw" in read:  # fio < 3.2 reports KiB/s only
            total += float(read["bw"]) * 1024
    result = {"read_gbps": round(total / 1e9, 3)}
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
        try:
            return parse()
        except ProbeParseError as exc:
            problems.append(str(exc))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            problems.append(f"{source}: unexpected shape ({type(exc).__name__}: {exc})")
        return default

    def have(name: str) -> bool:
        return bool(_text(raw.get(name)).strip()) and exit_codes.get(name, 0) == 0

    gpus = {"count": 0, "model": None, "memory_gb": None, "arch": None}
    if have("amd-smi-static.json"):
        gpus = attempt("amd-smi-static.json", lambda: parse_amd_smi_static(raw["amd-smi-static.json"]), gpus)
    if not gpus.get("count") and have("rocm-smi.json"):
        gpus = attempt("rocm-smi.json", lambda: parse_rocm_smi(raw["rocm-smi.json"]), gpus)
    if not gpus.get("count"):
        problems.append("amd-smi-static.json, rocm-smi.json: no GPU found by either tool")
    gpus.pop("models", None)

    rocm = parse_rocm_version(raw.get("amd-smi-version.txt"), raw.get("rocm-version.txt"))
    vllm = parse_vllm_version(raw.get("vllm-version.txt")) if have("vllm-version.txt") else None
    lmcache = {"version": None, "commit": None, "hip": None}
    if have("lmcache.json"):
        lmcache = attempt("lmcache.json", lambda: parse_lmcache(raw["lmcache.json"]), lmcache)
    nics = attempt("ip-link.json", lambda: parse_nics(raw.get("ip-link.json"), raw.get("ethtool.txt"),
                                                      raw.get("rdma-link.json"), raw.get("ibv_devinfo.txt")), [])

    namespaces = attempt("nvme-list.json", lambda: parse_nvme_list(raw.get("nvme-list.json")), []) or []
    subsystems = attempt("nvme-list-subsys.json", lambda: parse_nvme_subsystems(raw.get("nvme-list-subsys.json")), []) or []
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
    for arm, name in (("fx", "fio-fx.json"), ("local_nvme", "fio-local.json")):
        if have(name):
            fio[arm] = attempt(name, lambda name=name: parse_fio(raw[name], name), {"read_gbps": None})
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
