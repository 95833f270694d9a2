"""The probe parsers against raw outputs of the real tools across versions (tests/fixtures/probe/)."""
from __future__ import annotations

import json
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
    devices = gpus.pop("devices")
    assert gpus == {"count": 8, "model": "AMD Instinct MI308X", "memory_gb": 192, "arch": "gfx942"}
    assert [d["index"] for d in devices] == list(range(8))
    assert {(d["model"], d["memory_gb"], d["arch"]) for d in devices} == {("MI308X", 192, "gfx942")}


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
    assert all("rdma_state" in nic for nic in nics)
    assert next(n for n in nics if not n["rdma_device"])["rdma_state"] is None
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


def test_every_gpu_is_listed_with_its_index_and_normalised_model():
    gpus = inv.parse_amd_smi_static(raw("amd-smi-static-26.2-list.json"))
    assert [d["index"] for d in gpus["devices"]] == list(range(8))
    assert {(d["model"], d["memory_gb"], d["arch"]) for d in gpus["devices"]} == {("MI308X", 192, "gfx942")}
    assert gpus["devices"][3]["market_name"] == "AMD Instinct MI308X"


@pytest.mark.parametrize("name, device_id, model", [
    ("AMD Instinct MI308X", "0x74a2", "MI308X"), ("MI308X", None, "MI308X"), ("AMD Instinct MI300X VF", "0x74b5", "MI300X"),
    ("AMD INSTINCT MI200 (MCM) OAM LC MBA HPE C2", "0x7408", "MI250X"), ("Aqua Vanjaram", "0x74a1", "MI300X"),
    ("Instinct MI250X/MI250", None, "MI250X"), ("N/A", None, None),
    ("Strix Halo [Radeon Graphics / Radeon 8050S Graphics / Radeon 8060S Graphics]", "0x1586",
     "Strix Halo [Radeon Graphics / Radeon 8050S Graphics / Radeon 8060S Graphics]")])
def test_gpu_models_are_normalised_as_plans_name_them(name, device_id, model):
    assert inv.normalise_gpu_model(name, device_id) == model


# --- outputs of the real tools found in other projects (tests/fixtures/probe/README.md names each source) -------

def test_amd_smi_static_gpu_data_of_an_mi210():
    gpus = inv.parse_amd_smi_static(raw("amd-smi-static-gpu_data-dme-mi210.json"))
    assert gpus["devices"] == [{"index": 0, "model": "MI210", "market_name": "AMD Instinct MI210", "memory_gb": 64,
                                "arch": "gfx90a", "device_id": "0x740f", "bdf": None}]
    assert (gpus["count"], gpus["model"], gpus["memory_gb"], gpus["arch"]) == (1, "AMD Instinct MI210", 64, "gfx90a")


def test_rocm_smi_of_an_mi250x_that_names_only_its_family():
    gpus = inv.parse_rocm_smi(raw("rocm-smi-mi250x-issue159.json"))
    assert gpus["count"] == 1 and gpus["model"] == "MI250X" and gpus["arch"] == "gfx9010"
    assert gpus["devices"][0]["market_name"] == "AMD INSTINCT MI200 (MCM) OAM LC MBA HPE C2"


def test_amd_smi_list_in_its_text_form():
    assert inv.parse_amd_smi_list(raw("amd-smi-list-6.3-changelog.txt")) == [
        {"index": 0, "bdf": "0000:23:00.0", "uuid": "<redacted>", "kfd_id": "45412"},
        {"index": 1, "bdf": "0000:26:00.0", "uuid": "<redacted>", "kfd_id": "59881"}]


def test_amd_smi_list_json_adds_bdf_and_uuid_to_each_gpu():
    files = {"amd-smi-static.json": raw("amd-smi-static-26.2-list.json"),
             "amd-smi-list.json": json.dumps([{"gpu": i, "bdf": f"0000:{i:02x}:00.0", "uuid": f"u{i}", "kfd_id": i,
                                               "node_id": i + 2, "partition_id": 0} for i in range(8)])}
    result = inv.build_inventory("gpu01", files, simulated=False, fx_mount="/mnt/fx", fx_nqn=NQN)
    assert result["gpus"]["devices"][5]["uuid"] == "u5"
    assert result["gpus"]["devices"][5]["bdf"] == "0000:af:00.0"  # amd-smi static's own bus.bdf comes first
    files["amd-smi-list.json"] = json.dumps([{"gpu": 0, "bdf": "0000:00:00.0", "uuid": "u0"}])
    result = inv.build_inventory("gpu01", files, simulated=False, fx_mount="/mnt/fx", fx_nqn=NQN)
    assert "amd-smi-list.json: lists 1 GPUs where amd-smi static describes 8" in result["problems"]


def test_nvme_cli_1_x_flat_list_of_a_fabric_array():
    namespaces = inv.parse_nvme_list(raw("nvme-list-1.x-gonvme-powerstore.json"))
    assert namespaces == [
        {"namespace": "/dev/nvme0n1", "controller": "nvme0", "model": "dellemc", "size_bytes": 5368709120},
        {"namespace": "/dev/nvme0n2", "controller": "nvme0", "model": "dellemc", "size_bytes": 5368709120}]


@pytest.mark.parametrize("name, nqn, model, size", [
    ("nvme-list-2.11-gonvme-powerstore-tcp.json", "nqn.1988-11.com.dell:powerstore:00:42c92aa830b1FF113003",
     "dellemc-powerstore", 3221225472),
    ("nvme-list-2.11-gonvme-powermax-tcp.json", "nqn.1988-11.com.dell:PowerMax_2500:00:000120001647",
     "EMC PowerMax_2500", 3222405120)])
def test_nvme_cli_2_11_multipath_namespaces_under_the_subsystem(name, nqn, model, size):
    assert inv.parse_nvme_list(raw(name)) == [{"namespace": "/dev/nvme0n1", "controller": "nvme0", "model": model,
                                               "size_bytes": size, "nqn": nqn, "transport": "tcp",
                                               "address": "10.11.12.13"}]


def test_nvme_cli_2_11_namespaces_under_each_controller():
    namespaces = inv.parse_nvme_list(raw("nvme-list-2.11-netdata.json"))
    assert [(n["namespace"], n["controller"], n["transport"], n["size_bytes"]) for n in namespaces] == [
        (f"/dev/nvme{i}n1", f"nvme{i}", "pcie", 4000787030016) for i in range(3)]
    assert {n["model"] for n in namespaces} == {"Seagate FireCuda 530 ZP4000GM30023"}


def test_nvme_cli_2_x_flat_list_with_product_names():
    namespaces = inv.parse_nvme_list(raw("nvme-list-2.3-netdata.json"))
    assert [(n["namespace"], n["controller"], n["size_bytes"]) for n in namespaces] == [
        ("/dev/nvme0n1", "nvme0", 4000787030016), ("/dev/nvme1n1", "nvme1", 4000787030016)]


def test_nvme_list_subsys_of_a_tcp_array_with_two_paths():
    subsystems = inv.parse_nvme_subsystems(raw("nvme-list-subsys-2.x-gonvme-tcp.json"))
    assert subsystems == [{"nqn": "nqn.1988-11.com.dell:mock:00:1a1111a1111aAA11111A", "name": "nvme-subsys0", "paths": [
        {"controller": "nvme3", "transport": "tcp", "traddr": "10.1.1.1", "state": "live"},
        {"controller": "nvme2", "transport": "tcp", "traddr": "10.1.1.2", "state": "live"}]}]


def test_a_2_11_listing_alone_finds_the_fabric_namespace():
    files = {"nvme-list.json": raw("nvme-list-2.11-gonvme-powerstore-tcp.json"), "nvme-list-subsys.json": b"[]",
             "mounts.txt": b"/dev/nvme0n1 /mnt/fx xfs rw 0 0\n"}
    result = inv.build_inventory("gpu01", files, simulated=False, fx_mount="/mnt/fx",
                                 fx_nqn="nqn.1988-11.com.dell:powerstore:00:42c92aa830b1FF113003")
    assert result["fx"]["namespace"] == "/dev/nvme0n1" and result["fx"]["transport"] == "tcp"
    assert result["fx"]["address"] == "10.11.12.13" and result["fx"]["mounted"] is True


def test_fio_2_random_read_jobs_are_not_a_sequential_read():
    with pytest.raises(inv.ProbeParseError, match="no job named fx-seqread among the jobs random-read"):
        inv.parse_fio(raw("fio-2.1.11-storperf-randread-4jobs.json"), "fio-fx.json", "fx-seqread")


def test_fio_2_jobs_named_by_the_probe_count_and_are_summed():
    report = json.loads(raw("fio-2.1.11-storperf-randread-4jobs.json"))
    result = inv.parse_fio(json.dumps(report), "fio-fx.json", "random-read")
    # fio 2.x reports KiB/s: 4 concurrent jobs of 21 KiB/s
    assert result == {"read_gbps": round(4 * 21 * 1024 / 1e9, 3), "job": "random-read", "jobs": 4, "groupid": 0,
                      "fio_version": "fio-2.1.11"}


def test_fio_3_random_jobs_are_refused_by_rw():
    with pytest.raises(inv.ProbeParseError, match=r"no sequential-read job \(rw=read\) among the jobs read_iops "
                                                  r"\(randread\), write_iops \(randwrite\)"):
        inv.parse_fio(raw("fio-3.20-kubestr-randread-randwrite.json"), "fio-fx.json", "fx-seqread")


def test_fio_3_only_sequential_read_jobs_count_and_the_job_is_recorded():
    report = json.loads(raw("fio-3.20-kubestr-randread-randwrite.json"))
    seq = json.loads(json.dumps(report["jobs"][0]))
    seq.update(jobname="seq_read", groupid=1)
    seq["job options"] = dict(seq["job options"], name="seq_read", rw="read", bs="1M")
    seq["read"]["bw_bytes"] = 7_000_000_000
    report["jobs"].append(seq)
    result = inv.parse_fio(json.dumps(report), "fio-fx.json")
    assert result == {"read_gbps": 7.0, "job": "seq_read", "jobs": 1, "groupid": 1, "fio_version": "fio-3.20"}


def test_fio_text_after_the_json_document_is_ignored():
    text = raw("fio-3.36.json").decode() + "\nfx-seqread: (groupid=0, jobs=4): err= 0: pid=1\n  read: IOPS=10.9k\n"
    assert inv.parse_fio(text, "fio-fx.json")["read_gbps"] == pytest.approx(11.5, rel=0.01)


@pytest.mark.parametrize("parse, text, message", [
    (inv.parse_amd_smi_static, '{"system": {"cpus": 2}}', "not a shape amd-smi prints"),
    (inv.parse_amd_smi_static, '[{"gpu": 0, "power": {}}]', "GPU entries without asic or board sections"),
    (inv.parse_amd_smi_list, '{"foo": 1}', "not a shape amd-smi prints"),
    (inv.parse_amd_smi_list, '[{"gpu": 0, "power": 1}]', "GPU entries without bdf or uuid"),
    (inv.parse_rocm_smi, '{"system": {"Driver version": "6.8"}}', "no card entries"),
    (inv.parse_nvme_list, '[{"DevicePath": "/dev/nvme0n1"}]', "not a shape nvme-cli prints"),
    (inv.parse_nvme_list, '{"Devices": [{"Name": "nvme0"}]}', "neither DevicePath"),
    (inv.parse_nvme_subsystems, '{"Hosts": []}', "not a shape nvme-cli prints"),
    (lambda text: inv.parse_fio(text, "fio-fx.json"), '{"jobs": [{"jobname": "x"}]}', "without a read section"),
])
def test_an_unfamiliar_shape_is_refused_with_a_clear_error(parse, text, message):
    with pytest.raises(inv.ProbeParseError, match=message):
        parse(text)


def test_a_missing_tool_is_named_with_what_to_install():
    codes = {"amd-smi-static.json": 127, "amd-smi-list.json": 127, "rocm-smi.json": 127, "nvme-list.json": 127,
             "nvme-list-subsys.json": 127, "fio-fx.json": 127, "fio-local.json": 127}
    result = inv.build_inventory("node1", {"ip-link.json": b"[]"}, simulated=False, fx_mount="/mnt/fx", fx_nqn=NQN,
                                 exit_codes=codes)
    assert "`amd-smi` is not installed on node1: install ROCm's amd-smi" in result["problems"]
    assert "`nvme` is not installed on node1: install nvme-cli" in result["problems"]
    assert "`fio` is not installed on node1: install fio" in result["problems"]
    assert not any("rocm-smi" in p for p in result["problems"])  # the fallback is named through amd-smi
    assert not any("no GPU found" in p or "fio did not run" in p or "empty output" in p for p in result["problems"])


def test_the_lmcache_fingerprint_and_clear_api_the_node_reports_are_kept():
    fingerprint = {"sha256": "a" * 64, "version": "0.5.6", "commit": "3e11e108", "disk_io_threads": 4,
                   "disk_io_threads_from": "default", "files": 850}
    found = inv.parse_lmcache(json.dumps({"installed": True, "version": "0.5.6", "commit": "3e11e108", "hip": False,
                                          "fingerprint": fingerprint, "clear_api": True}))
    assert found == {"version": "0.5.6", "commit": "3e11e108", "hip": False, "fingerprint": fingerprint,
                     "clear_api": True}
    # an older lmcache_inspect.py (or a node that could not say) leaves them out
    assert inv.parse_lmcache(b'{"installed": true, "version": "0.3.9", "commit": null, "hip": true}') == {
        "version": "0.3.9", "commit": None, "hip": True}
