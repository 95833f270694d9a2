"""The probe parsers against raw outputs of the real tools across versions (tests/fixtures/probe/)."""
from __future__ import annotations

from pathlib import Path

import pytest

from runners import inventory as inv

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "probe"
NQN = "nqn.2026-01.com.example.fx:fx100.pool0"


def raw(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


@pytest.mark.parametrize("name, model, count", [
    ("amd-smi-static-26.2-list.json", "AMD Instinct MI308X", 8),
    ("amd-smi-static-25.x-gpu_data.json", "AMD Instinct MI300X", 2),
    ("amd-smi-static-24.x-strings.json", "AMD Instinct MI308X", 2),
])
def test_amd_smi_static_is_read_in_every_known_layout(name, model, count):
    gpus = inv.parse_amd_smi_static(raw(name))
    assert gpus["count"] == count and gpus["model"] == model and gpus["memory_gb"] == 192
    if "24.x" not in name:
        assert gpus["arch"] == "gfx942"


def test_legacy_rocm_smi_json_gives_the_same_gpus():
    gpus = inv.parse_rocm_smi(raw("rocm-smi-6.x.json"))
    assert gpus == {"count": 8, "model": "AMD Instinct MI308X", "memory_gb": 192, "arch": "gfx942",
                    "models": ["AMD Instinct MI308X"]}


@pytest.mark.parametrize("version_text, info, expected", [
    ("amd-smi-version-26.2.txt", None, "7.2.1"), ("amd-smi-version-24.6.txt", None, "6.2.2"),
    (None, "rocm-info-version.txt", "7.2.1")])
def test_the_rocm_version_comes_from_amd_smi_or_the_rocm_info_file(version_text, info, expected):
    assert inv.parse_rocm_version(raw(version_text) if version_text else None, raw(info) if info else None) == expected


@pytest.mark.parametrize("listing, subsys", [("nvme-list-1.x.json", "nvme-list-subsys-1.x.json"),
                                             ("nvme-list-2.x.json", "nvme-list-subsys-2.x.json"),
                                             ("nvme-list-2.x-verbose.json", "nvme-list-subsys-2.x.json")])
def test_nvme_cli_1_and_2_both_show_the_fx_namespace_over_rdma(listing, subsys):
    namespaces = inv.parse_nvme_list(raw(listing))
    subsystems = inv.parse_nvme_subsystems(raw(subsys))
    fx = next(s for s in subsystems if s["nqn"] == NQN)
    assert fx["paths"][0]["transport"] == "rdma" and fx["paths"][0]["traddr"] == "192.168.100.10"
    assert fx["paths"][0]["controller"] == "nvme1"
    assert {n["namespace"] for n in namespaces} == {"/dev/nvme0n1", "/dev/nvme1n1"}
    assert next(n for n in namespaces if n["controller"] == "nvme1")["size_bytes"] == 30_720_000_000_000


@pytest.mark.parametrize("name", ["fio-3.36.json", "fio-3.1-kib.json"])
def test_fio_3_reports_are_read_with_or_without_bw_bytes(name):
    gbps = inv.parse_fio(raw(name), name)["read_gbps"]
    assert gbps == pytest.approx(11.5, rel=0.01)


def test_a_failed_fio_job_is_named_not_read_as_zero():
    with pytest.raises(inv.ProbeParseError, match="fio-fx.json: fio job x failed with error 5"):
        inv.parse_fio('{"jobs": [{"jobname": "x", "error": 5, "read": {}}]}', "fio-fx.json")


def test_broken_json_names_the_file_and_the_place():
    with pytest.raises(inv.ProbeParseError, match=r"nvme-list.json: not valid JSON at line 2, column 1"):
        inv.parse_nvme_list('{"Devices":\n]')


def test_nics_join_ip_ethtool_rdma_and_ibv_devinfo():
    nics = inv.parse_nics(raw("ip-link.json"), raw("ethtool-100g.txt"), raw("rdma-link.json"), raw("ibv_devinfo.txt"))
    roce = next(n for n in nics if n["rdma_device"])
    assert roce == {"name": "ens1f0np0", "state": "up", "speed_gbps": 100.0, "rdma_device": "mlx5_0",
                    "rdma_state": "ACTIVE", "port_state": "PORT_ACTIVE", "link_layer": "Ethernet"}
    assert inv.parse_rdma_link(raw("rdma-link.txt")) == inv.parse_rdma_link(raw("rdma-link.json"))


def test_without_ip_json_the_nics_come_from_ethtool():
    nics = inv.parse_nics(b"Option \"-j\" is unknown", raw("ethtool-100g.txt"), raw("rdma-link.txt"), raw("ibv_devinfo.txt"))
    assert nics[0]["name"] == "ens1f0np0" and nics[0]["state"] == "up" and nics[0]["rdma_device"] == "mlx5_0"


def test_mounts_are_read_from_mount_and_from_proc_mounts():
    rows = inv.parse_mounts(raw("mount.txt"))
    assert {"device": "/dev/nvme1n1", "path": "/mnt/fx", "fstype": "xfs",
            "options": "rw,noatime,attr2,inode64,logbufs=8,logbsize=32k,noquota"} in rows
    assert inv.parse_mounts("/dev/nvme1n1 /mnt/fx xfs rw,noatime 0 0")[0]["path"] == "/mnt/fx"


def test_a_whole_inventory_from_nvme_cli_1_outputs_is_complete():
    files = {"amd-smi-static.json": raw("amd-smi-static-26.2-list.json"),
             "amd-smi-version.txt": raw("amd-smi-version-26.2.txt"),
             "vllm-version.txt": b"INFO 06-29 12:00:00 [__init__.py:239] Automatically detected platform rocm.\n0.20.1+rocm721\n",
             "lmcache.json": b'{"installed": true, "version": "0.3.15.dev12", "commit": "4f2a9c1", "hip": true}',
             "ip-link.json": raw("ip-link.json"), "ethtool.txt": raw("ethtool-100g.txt"),
             "rdma-link.json": raw("rdma-link.json"), "ibv_devinfo.txt": raw("ibv_devinfo.txt"),
             "nvme-list.json": raw("nvme-list-1.x.json"), "nvme-list-subsys.json": raw("nvme-list-subsys-1.x.json"),
             "nvme-pcie.txt": b"nvme0 transport=pcie speed=16.0_GT/s_PCIe width=4\nnvme1 transport=rdma speed= width=\n",
             "mounts.txt": raw("mount.txt"), "fx-write.txt": b"mounted=yes writable=yes path=/mnt/fx\n",
             "fio-fx.json": raw("fio-3.36.json"), "fio-local.json": raw("fio-3.1-kib.json"),
             "nproc.txt": b"192\n", "free.txt": b"        total\nMem: 2199023255552 1 2 3 4 5\n"}
    result = inv.build_inventory("gpu01", files, simulated=False, fx_mount="/mnt/fx", fx_nqn=NQN)
    assert inv.missing_fields(result) == [] and result["problems"] == []
    assert result["schema"] == "fxpilot.inventory/1" and result["simulated"] is False
    assert result["vllm"] == "0.20.1+rocm721" and result["rocm"] == "7.2.1"
    assert result["fx"]["namespace"] == "/dev/nvme1n1" and result["fx"]["mounted"] and result["fx"]["writable"]
    assert result["local_nvme"] == {"namespace": "/dev/nvme0n1", "model": "SAMSUNG MZQL21T9HCJR-00A07", "size_gb": 1920,
                                    "pcie_gen": 4, "mount_path": "/mnt/nvme0"}
    assert result["memory_gb"] == 2048 and result["cpu_cores"] == 192


def test_missing_outputs_are_named_and_leave_the_fields_empty():
    result = inv.build_inventory("gpu01", {"amd-smi-static.json": b"{oops", "nvme-list.json": b"[]",
                                           "nvme-list-subsys.json": b"[]", "ip-link.json": b"[]"},
                                 simulated=True, fx_mount="/mnt/fx", fx_nqn=NQN)
    assert result["gpus"]["count"] == 0 and result["fx"]["namespace"] is None
    assert any(p.startswith("amd-smi-static.json: not valid JSON") for p in result["problems"])
    assert any("no NVMe-oF subsystem" in p for p in result["problems"])
    assert "fio.fx.read_gbps" in inv.missing_fields(result)
