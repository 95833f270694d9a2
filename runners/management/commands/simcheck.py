"""Fidelity check of the simulated server against the published Table 1 (docs/simulator.md).

Starts one simulated server per arm on a free loopback port, over a throw-away simulated node whose
state.json says which temporary directory is the FX mount and which the local NVMe; drives the
long-context cold-recovery workload with the shipped workload client; prints every Table 1 cell
beside the published figure; exits non-zero when any cell is off by more than the tolerance.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from runners.remote.workload import plan_args
from runners.sim.calibration import TABLE1
from runners.sim.launch import free_port, stop
from runners.simnode.state import default_state, save_state

MODEL = "Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8"
TRANSFER = '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}'
WORKLOAD = Path(settings.BASE_DIR) / "runners" / "remote" / "workload.py"
PLAN = Path(settings.BASE_DIR) / "gates" / "plans" / "default.yaml"


def cold_recovery_settings() -> dict:
    return yaml.safe_load(PLAN.read_text())["workloads"]["cold_recovery"]


def lmcache_yaml(disk_path: Path) -> str:
    """The same backend and sizes for both cache arms; only where the files live differs."""
    return yaml.safe_dump({"chunk_size": 256, "local_cpu": False, "local_disk": f"file://{disk_path}",
                           "max_local_disk_size": 500, "extra_config": {"use_odirect": True}})


class SimulatedServer:
    """`python -m runners.sim serve` as a subprocess; stopped on exit."""

    def __init__(self, arm: str, root: Path, scale: float):
        self.arm, self.port = arm, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = root / f"server-{arm}-{scale:g}.log"
        env = {**os.environ, "FXPILOT_SIM_ROOT": str(root), "VLLM_SERVER_DEV_MODE": "1"}
        argv = [sys.executable, "-m", "runners.sim", "serve", MODEL, "--tensor-parallel-size", "8",
                "--port", str(self.port), "--host", "127.0.0.1", "--sim-time-scale", f"{scale:g}"]
        if arm == "recompute":
            argv.append("--no-enable-prefix-caching")
        else:
            mount = root / "mnt" / ("fx" if arm == "fx" else "nvme0")
            config = root / f"lmcache-{arm}.yaml"
            config.write_text(lmcache_yaml(mount / "lmcache"))
            env["LMCACHE_CONFIG_FILE"] = str(config)
            argv += ["--kv-transfer-config", TRANSFER]
        self.log = open(self.log_path, "ab")
        self.process = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                        cwd=settings.BASE_DIR)

    def wait_healthy(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise CommandError(f"the simulated {self.arm} server exited with {self.process.returncode}:\n"
                                   + self.log_path.read_text()[-2000:])
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise CommandError(f"the simulated {self.arm} server did not become healthy in {timeout:g} s")

    def stop(self) -> None:
        stop(self.process)
        self.log.close()


def run_workload(server: SimulatedServer, command: str, out: Path, workload: dict, concurrency: list[int],
                 repetitions: int) -> list[dict]:
    """The one place the workload client is called: its populate or measure command (cold recovery),
    with the plan's numbers turned into flags by the client itself."""
    argv = [sys.executable, str(WORKLOAD), command, "--url", server.url, "--arm", server.arm, "--out", str(out),
            "--model", MODEL, "--run-id", "simcheck", "--simulated", "yes", "--quiet",
            *plan_args(command, {"cold_recovery": workload}),
            "-c", ",".join(map(str, concurrency)), "--repetitions", str(repetitions), "--evict", "reset"]
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise CommandError(f"the workload client failed on the {server.arm} arm (exit {result.returncode}):\n"
                           f"{result.stderr[-2000:]}")
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def cell_figures(records: list[dict], scale: float) -> dict[int, dict]:
    """Per concurrency, in model seconds: TTFT p50 over every measured request, and the mean over
    repetitions of the throughput (sum of output tokens / (last t_end − first t_send), design §5a)."""
    out: dict[int, dict] = {}
    measured = [r for r in records if r["phase"] == "measure"]
    for concurrency in sorted({r["concurrency"] for r in measured}):
        cell = [r for r in measured if r["concurrency"] == concurrency]
        ok = [r for r in cell if r["status"] == "ok"]
        ttfts = [(r["t_first_token"] - r["t_send"]) / scale for r in ok]
        throughputs = []
        for repetition in sorted({r["repetition"] for r in cell}):
            rows = [r for r in ok if r["repetition"] == repetition]
            span = (max(r["t_end"] for r in rows) - min(r["t_send"] for r in rows)) / scale
            throughputs.append(sum(r["output_tokens"] for r in rows) / span)
        out[concurrency] = {"ttft_p50": statistics.median(ttfts), "throughput": statistics.mean(throughputs),
                            "requests": len(cell), "failed": len(cell) - len(ok),
                            "hit_ratio": statistics.mean((r.get("cached_tokens") or 0) / r["prompt_tokens"] for r in ok)}
    return out


class Command(BaseCommand):
    help = "Run the cold-recovery workload against the simulated server and compare with the published Table 1."

    def add_arguments(self, parser):
        parser.add_argument("--time-scale", type=float, default=0.2,
                            help="wall seconds per model second while the cache arms are measured (default 0.2)")
        parser.add_argument("--populate-time-scale", type=float, default=0.005,
                            help="time scale while the sessions are written (default 0.005)")
        parser.add_argument("--recompute-time-scale", type=float, default=0.02,
                            help="time scale of the recompute arm, whose requests take minutes (default 0.02)")
        parser.add_argument("--repetitions", type=int, default=0, help="default: the plan's repetitions")
        parser.add_argument("--tolerance", type=float, default=0.15)
        parser.add_argument("--keep", action="store_true", help="keep the temporary node (logs, records)")

    def handle(self, *args, **options):
        tolerance = options["tolerance"]
        workload = cold_recovery_settings()
        repetitions = options["repetitions"] or int(workload.get("repetitions", 1))
        root = Path(tempfile.mkdtemp(prefix="fxpilot-simcheck-"))
        state = default_state(root, "simcheck", options["time_scale"])
        for path in (state["fx"]["mounted_at"], state["local_nvme"]["path"]):
            Path(path).mkdir(parents=True, exist_ok=True)
        save_state(root, state)
        self.stdout.write(f"simcheck (simulated: true): node {root}, time scales: measure {options['time_scale']:g}, "
                          f"populate {options['populate_time_scale']:g}, recompute "
                          f"{options['recompute_time_scale']:g}; workload {workload}, {repetitions} repetition(s)")
        started = time.monotonic()
        results: dict[tuple[str, int], dict] = {}
        # populate fast, restart (the disk tier persists, HBM starts empty), measure at the fidelity scale
        steps = [("fx", "populate", [8, 16, 32], options["populate_time_scale"]),
                 ("fx", "measure", [8, 16, 32], options["time_scale"]),
                 ("local_nvme", "populate", [8, 16, 32], options["populate_time_scale"]),
                 ("local_nvme", "measure", [8, 16, 32], options["time_scale"]),
                 ("recompute", "measure", [16], options["recompute_time_scale"])]
        try:
            for arm, command, levels, scale in steps:
                server = SimulatedServer(arm, root, scale)
                try:
                    server.wait_healthy()
                    records = run_workload(server, command, root / f"records-{arm}-{command}.jsonl", workload,
                                           levels, repetitions)
                finally:
                    server.stop()
                if command == "measure":
                    for concurrency, figures in cell_figures(records, scale).items():
                        results[(arm, concurrency)] = figures
                self.stdout.write(f"  {arm} {command}: done after {time.monotonic() - started:.0f} s")
        finally:
            if options["keep"]:
                self.stdout.write(f"kept {root}")
            else:
                shutil.rmtree(root, ignore_errors=True)
        worst = self.report(results, tolerance)
        self.stdout.write(f"wall time {time.monotonic() - started:.0f} s; worst relative error {worst:.1%} "
                          f"(tolerance {tolerance:.0%})")
        if worst > tolerance:
            raise CommandError(f"the simulator is off Table 1 by {worst:.1%} (> {tolerance:.0%}) in at least one cell")

    def report(self, results: dict, tolerance: float) -> float:
        self.stdout.write(f"{'arm':<11} {'c':>3}  {'TTFT p50 s':>10} {'published':>9} {'error':>7}   "
                          f"{'tok/s':>7} {'published':>9} {'error':>7}  {'hit':>5} {'failed':>6}")
        worst = 0.0
        for (arm, concurrency), (ttft, throughput) in TABLE1.items():
            got = results.get((arm, concurrency))
            if got is None:
                self.stdout.write(f"{arm:<11} {concurrency:>3}  missing")
                worst = float("inf")
                continue
            errors = (got["ttft_p50"] / ttft - 1, got["throughput"] / throughput - 1)
            worst = max(worst, *map(abs, errors))
            flags = ["" if abs(e) <= tolerance else " !" for e in errors]
            self.stdout.write(f"{arm:<11} {concurrency:>3}  {got['ttft_p50']:>10.2f} {ttft:>9.2f} {errors[0]:>+7.1%}"
                              f"{flags[0]:2} {got['throughput']:>7.1f} {throughput:>9.1f} {errors[1]:>+7.1%}{flags[1]:2}"
                              f"{got['hit_ratio']:>5.2f} {got['failed']:>6}")
        return worst
