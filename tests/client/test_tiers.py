"""Tier attribution (issue 43): LMCache's DRAM emptied before every cold window, and the disk tier's device read
counter sampled with every /metrics scrape into the summaries."""
from __future__ import annotations

from runners.remote import workload
from tests.client.conftest import read_jsonl, run_client, summaries

LOAD = ["--arm", "fx", "--sessions", "2", "--prompt-tokens", "32", "--turn-tokens", "4", "--output-tokens", "4",
        "-c", "1,2", "--repetitions", "1", "--requests-per-client", "1", "--evict", "reset"]
CLEAR = ("DELETE", "/cache/clear?locations=LocalCPUBackend")


def test_every_cold_window_begins_with_lmcache_dram_cleared_on_every_process(server_url, lmcache_api, tmp_path):
    rank0, rank1 = lmcache_api(), lmcache_api()
    out = tmp_path / "fx.jsonl"
    result = run_client("cold-recovery", "--url", server_url, "--out", str(out), *LOAD,
                        "--lmcache-api", rank0.url, "--lmcache-api", rank1.url)
    assert result.returncode == 0, result.stderr
    # one eviction per measured cell (two levels), each after the prefix-cache reset
    assert rank0.calls == [CLEAR, CLEAR] and rank1.calls == [CLEAR, CLEAR]
    by_phase = {(s["phase"], s["concurrency"]): s for s in summaries(out)}
    assert by_phase["populate", 2]["dram_cleared"] is False
    assert by_phase["measure", 1]["dram_cleared"] is True and by_phase["measure", 2]["dram_cleared"] is True
    eviction = by_phase["measure", 1]["eviction"]
    assert list(eviction) == ["reset", "lmcache-dram"]
    assert eviction["lmcache-dram"] == (f"LMCache DRAM cleared ({rank0.url[7:]}: 3 removed, "
                                        f"{rank1.url[7:]}: 3 removed)")
    assert "EVICT prefix cache reset; LMCache DRAM cleared" in result.stdout


def test_without_lmcache_api_summaries_say_null_not_false(server_url, tmp_path):
    out = tmp_path / "fx.jsonl"
    assert run_client("cold-recovery", "--url", server_url, "--out", str(out), *LOAD).returncode == 0
    assert {s["dram_cleared"] for s in summaries(out)} == {None}
    assert {s["tier_bytes"] for s in summaries(out) if "tier_bytes" in s} == {None}


def test_a_refused_dram_clear_stops_the_run_naming_the_url_and_keeps_the_records(server_url, lmcache_api, tmp_path):
    api = lmcache_api()
    url = api.url
    api.close()  # nobody listens there any more: connection refused
    out = tmp_path / "fx.jsonl"
    result = run_client("cold-recovery", "--url", server_url, "--out", str(out), *LOAD, "--lmcache-api", url)
    assert result.returncode == 3
    assert f"DELETE {url}/cache/clear?locations=LocalCPUBackend failed:" in result.stderr
    assert "LMCache's DRAM was not cleared" in result.stderr
    # what was collected before stays: the populate's records and summary; no measure ran
    assert [r["phase"] for r in read_jsonl(out)] == ["populate", "populate"]
    assert [s["phase"] for s in summaries(out)] == ["populate"]


def test_a_non_2xx_dram_clear_stops_the_run_with_the_answer(server_url, lmcache_api, tmp_path):
    api = lmcache_api(status=503)
    out = tmp_path / "fx.jsonl"
    result = run_client("measure", "--url", server_url, "--out", str(out), *LOAD, "--lmcache-api", api.url)
    assert result.returncode == 3
    assert (f"DELETE {api.url}/cache/clear?locations=LocalCPUBackend answered HTTP 503: "
            '{"error": "Failed to clear cache", "message": "engine gone"}') in result.stderr
    assert not out.exists() or read_jsonl(out) == []


def test_a_bad_lmcache_url_is_refused_before_anything_is_sent(server_url, tmp_path):
    out = tmp_path / "fx.jsonl"
    result = run_client("cold-recovery", "--url", server_url, "--out", str(out), *LOAD, "--lmcache-api", "ftp://x")
    assert result.returncode == 2 and "--lmcache-api 'ftp://x': expected http://host:port" in result.stderr
    assert not out.exists()


def test_device_read_bytes_are_the_sectors_the_device_read_over_each_window(start_server, tmp_path):
    stats = tmp_path / "diskstats"
    url = start_server("--diskstats", str(stats), "--sectors-per-request", "10")
    out = tmp_path / "fx.jsonl"
    result = run_client("cold-recovery", "--url", url, "--out", str(out), *LOAD, "--disk-device", "/dev/vdb",
                        env={"FXPILOT_DISKSTATS": str(stats)})
    assert result.returncode == 0, result.stderr
    by_phase = {(s["phase"], s["concurrency"]): s["tier_bytes"] for s in summaries(out)}
    # populate: 2 requests, measure@1: 1, measure@2: 2 — 10 sectors of 512 bytes each
    assert by_phase["populate", 2]["device_read_bytes"] == 2 * 10 * 512
    assert by_phase["measure", 1]["device_read_bytes"] == 1 * 10 * 512
    assert by_phase["measure", 2]["device_read_bytes"] == 2 * 10 * 512
    for tier in by_phase.values():
        assert tier["device"] == "vdb" and tier["error"] is None and tier["seconds"] > 0


def test_an_unknown_device_or_unreadable_counter_is_an_error_never_a_zero(server_url, tmp_path):
    stats = tmp_path / "diskstats"
    stats.write_text("   7       0 loop0 5 0 40 1 0 0 0 0 0 1 1\n")
    out = tmp_path / "fx.jsonl"
    result = run_client("cold-recovery", "--url", server_url, "--out", str(out), *LOAD, "--disk-device", "nvme9n1",
                        env={"FXPILOT_DISKSTATS": str(stats)})
    assert result.returncode == 0, result.stderr
    tiers = [s["tier_bytes"] for s in summaries(out)]
    assert tiers and all(t["device_read_bytes"] is None for t in tiers)
    assert {t["error"] for t in tiers} == {f"device 'nvme9n1' is not in {stats} (1 lines)"}
    out2 = tmp_path / "fx2.jsonl"
    missing = tmp_path / "nowhere" / "diskstats"
    result = run_client("populate", "--url", server_url, "--out", str(out2), *LOAD, "--disk-device", "vdb",
                        env={"FXPILOT_DISKSTATS": str(missing)})
    assert result.returncode == 0, result.stderr
    [tier] = [s["tier_bytes"] for s in summaries(out2)]
    assert tier["device_read_bytes"] is None and tier["error"] == f"cannot read {missing}: No such file or directory"


def test_disk_samples_read_field_six_and_name_a_bad_line(tmp_path, monkeypatch):
    stats = tmp_path / "diskstats"
    monkeypatch.setenv("FXPILOT_DISKSTATS", str(stats))
    stats.write_text(" 259 0 nvme1n1 100 3 4096 9 0 0 0 0 0 9 9\n 259 1 nvme1n1p1 1 0 8 0 0 0 0 0 0 0 0\n")
    first = workload.disk_sample("nvme1n1")
    assert first["sectors_read"] == 4096 and first["error"] is None
    stats.write_text(" 259 0 nvme1n1 180 3 6144 9 0 0 0 0 0 9 9\n")
    second = workload.disk_sample("nvme1n1")
    tier = workload.tier_bytes("nvme1n1", first, second)
    assert tier["device_read_bytes"] == (6144 - 4096) * 512 and tier["error"] is None
    assert workload.tier_bytes("nvme1n1", second, first)["error"].startswith(
        "the sectors-read counter of nvme1n1 went down (6144 → 4096)")
    stats.write_text(" 259 0 nvme1n1 180 3 lots\n")
    assert workload.disk_sample("nvme1n1")["error"] == (f"{stats}, line 1: the sectors-read field (6th) of nvme1n1 "
                                                        "is 'lots', not a whole number")
    assert workload.disk_sample(None) is None and workload.tier_bytes(None, None, None) is None


def test_the_fault_runs_recovery_starts_with_dram_cleared_and_its_cut_window_does_not(server_url, lmcache_api,
                                                                                      tmp_path):
    api = lmcache_api()
    out = tmp_path / "fault.jsonl"
    result = run_client("fault", "--url", server_url, "--arm", "fx", "--out", str(out), "--fault-start", "0.4",
                        "--fault-seconds", "0.6", "--duration-s", "1.6", "-c", "2", "--prompt-tokens", "32",
                        "--turn-tokens", "4", "--output-tokens", "4", "--evict", "reset", "--lmcache-api", api.url)
    assert result.returncode == 0, result.stderr
    assert api.calls == [CLEAR, CLEAR]   # before the load, and after the restore
    by_phase = {s["phase"]: s for s in summaries(out)}
    assert by_phase["populate"]["dram_cleared"] is False
    assert by_phase["measure"]["dram_cleared"] is True and by_phase["fault"]["dram_cleared"] is False
    assert by_phase["recovery"]["dram_cleared"] is True
    assert by_phase["recovery"]["fault"]["eviction"]["lmcache-dram"].startswith("LMCache DRAM cleared")
