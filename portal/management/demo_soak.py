"""The demo's G4 soak, sized before G4 runs: measure, then plan.

G4's soak is a timed phase: it sends requests for as long as it is told. On simulated nodes its request
rate is set by the CPU the simulated server gets on this machine, not by the model (a soak request
hits HBM and takes a fifth of a second of wall time at the demo's scale), so no constant length suits
every machine. Its failure-rate bar needs a number of error-free requests that the sample-size planner
gives (`gates.judge.planner`: `requests_needed` of the G4 rate criterion, 3,911 for "failed ≤ 0.1 %").

`measure_soak_rate` starts the simulated server as a soak's fx arm runs it (`python -m runners.sim serve`
with a cache tier, at the demo's time scale) and the workload client's own `soak` command against it
(`runners/remote/workload.py`, the program the nodes run, with the soak's prompts, outputs and concurrency),
both as child processes of the demo that die with it (the demo passes its `preexec_fn`). Once every
session was sent once (a first visit is a cold prefill, like the first window of the real soak), it
counts the requests answered per second of wall time over `STEADY_SECONDS`. It cycles over one session
per client where the soak cycles over more than the server's HBM holds (`soak_sessions`, about 7.6 per client):
a request read from the tier costs the client and the simulated server about the CPU of one that hits HBM, and
the warm-up takes a fraction of the time. `soak_seconds` turns the rate into the soak's length: the requests the planner needs, times
`SOAK_MARGIN` (in G4 the soak shares the CPU with the other node's replay, and a machine's load moves),
over the rate, plus the warm-up of the soak's own sessions. The soak itself does not end short of the planner's
count (it sends on for at most its length again), so a machine that got busier costs seconds, not a second G4.

G4's soak is open loop (issue 45): it sends at a rate planned from evidence, a share of the fx throughput G3 measured
at the soak's concurrency (`runners.gateplans.soak_rate_plan`). On simulated nodes the gate run itself makes the soak
long enough for the planner's count at that rate; `planned_rate` gives the demo the same rate before G4 starts, so
that it sizes the soak on the rate the soak will send at (`soak_seconds(needed, planned_rate(...) or measured)`) and
says it (`soak_line`). The calibration still measures what this machine serves closed loop: a planned rate above it
is one the simulated server could not keep up with here, which `planned_rate` says.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from runners import gateplans
from runners.config import DEFAULT_SIMULATED
from runners.remote.workload import soak_pool
from runners.sim.model import hbm_kv_capacity_tokens

STEADY_SECONDS = 8.0
"""Wall seconds of steady soak (every session seen once) over which the rate is measured."""
SOAK_MARGIN = 1.25
"""How many times the planner's request count the soak is sized for at the calibrated rate. In G4 the soak shares the
CPU with the other node's replay, so it gets less than the calibration did (at ×0.005 on 2 idle cores: 48 requests/s
calibrated, about 22 while the other node replayed, 37 after); the soak's own floor (`soak --min-requests`, the
planner's count) sends on past its length until it has them, for at most its length again, so the margin only has
to keep that extension short. Before the floor a margin of 2.0 was needed, and 1.5 fell short at load 6.6 (G4 ran
again, 3:23 lost)."""
CALIBRATION_TIMEOUT = 240.0
"""A calibration that has not measured its steady seconds by then gives up (the demo then says so)."""
FALLBACK_RATE = 4.0
"""Requests per second assumed when the calibration could not measure (a slow soak rather than a re-run)."""


def soak_sessions(concurrency: int, prompt_tokens: int = 65536) -> int:
    """The sessions the workload client's soak cycles over on a simulated node (runners/remote/workload.py,
    soak_pool: more than the simulated server's HBM holds, read from its vllm:cache_config_info); the calibration
    cycles over 1 × concurrency."""
    return soak_pool(concurrency, prompt_tokens, hbm_kv_capacity_tokens())


MIN_SOAK_SECONDS = 20.0


@dataclass(frozen=True)
class SoakRate:
    """What the calibration measured: requests per wall second in the steady part, its requests and seconds, and
    the seconds its sessions' first visits took (the warm-up; one session per client)."""

    per_second: float
    requests: int
    seconds: float
    warmup_seconds: float
    measured: bool = True
    note: str = ""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _spawn(argv: list[str], log: Path, env: dict[str, str], cwd: Path, preexec_fn) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=preexec_fn)


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)


def _records(path: Path) -> list[dict]:
    try:
        text = path.read_text()
    except OSError:
        return []
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            break  # a line still being written
    return rows


def steady_rate(rows: list[dict], sessions: int) -> tuple[float, int, float, float] | None:
    """(requests per second, requests, seconds, warm-up seconds) of the records after every one of `sessions`
    sessions had its first visit answered; None while there is no such part yet. Times are the client's wall
    stamps (t_send, t_end_wall or t_end)."""
    def end(row: dict) -> float | None:
        value = row.get("t_end_wall", row.get("t_end"))
        return float(value) if value is not None else None

    first = [row for row in rows if row.get("turn") == 1]
    if len(first) < sessions or any(end(row) is None for row in first) or not rows:
        return None
    start = min(float(row["t_send"]) for row in rows)
    warm_end = max(end(row) for row in first)
    later = [row for row in rows if row.get("turn", 1) > 1 and float(row["t_send"]) >= warm_end and end(row) is not None]
    if not later:
        return None
    last = max(end(row) for row in later)
    seconds = last - warm_end
    if seconds <= 0:
        return None
    ok = sum(1 for row in later if row.get("status") == "ok")
    return ok / seconds, ok, seconds, warm_end - start


def measure_soak_rate(*, model: str, time_scale: float, concurrency: int, folder: Path, root: Path,
                      steady_seconds: float = STEADY_SECONDS, timeout: float = CALIBRATION_TIMEOUT,
                      check=lambda: None, preexec_fn=None) -> SoakRate:
    """Run the simulated server and the workload client's soak on this machine until `steady_seconds` of steady
    soak are measured (see the module). `check` runs every half second (the demo watches its processes there;
    it may raise to stop the calibration). The folder is emptied first and removed at the end."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    port = _free_port()
    config = folder / "lmcache.yaml"
    # the soak's fx arm as the deploy renders it for a simulated node (runners/deploy.py): LMCache's DRAM tier and
    # the disk tier at the simulated deployment's sizes (runners.config.DEFAULT_SIMULATED)
    sizes = DEFAULT_SIMULATED["sizes"]
    config.write_text("# simulated: true (the demo's soak calibration)\n"
                      f"chunk_size: {int(sizes['chunk_size'])}\nlocal_cpu: true\n"
                      f"max_local_cpu_size: {float(sizes['max_local_cpu_size'])}\n"
                      f"local_disk: \"file://{folder / 'kv'}/\"\nmax_local_disk_size: {float(sizes['max_local_disk_size'])}\n"
                      "extra_config:\n  use_odirect: true\n")
    env = {**os.environ, "LMCACHE_CONFIG_FILE": str(config)}
    env.pop("FXPILOT_SIM_ROOT", None)
    server = client = None
    records = folder / "records.jsonl"
    sessions = concurrency
    try:
        server = _spawn([sys.executable, "-m", "runners.sim", "serve", model, "--tensor-parallel-size", "8",
                         "--host", "127.0.0.1", "--port", str(port), "--enable-prompt-tokens-details",
                         "--kv-transfer-config", '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}',
                         "--sim-time-scale", f"{time_scale:g}"], folder / "server.log", env, root, preexec_fn)
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{port}"
        while True:
            check()
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                return _failed("the simulated server did not start", folder)
            time.sleep(0.2)
        client = _spawn([sys.executable, str(root / "runners" / "remote" / "workload.py"), "soak", "--url", url,
                         "--arm", "fx", "--out", str(records), "--run-id", "calibration", "--instance", "calibration",
                         "--simulated", "yes", "--concurrency", str(concurrency), "--sessions", str(sessions),
                         "--windows", "1", "--duration-s", f"{timeout:.0f}", "--quiet"], folder / "client.log", env,
                        root, preexec_fn)
        while time.monotonic() < deadline:
            check()
            measured = steady_rate(_records(records), sessions)
            if measured is not None and measured[2] >= steady_seconds:
                rate, count, seconds, warmup = measured
                return SoakRate(per_second=rate, requests=count, seconds=seconds, warmup_seconds=warmup)
            if client.poll() is not None:
                return _failed(f"the workload client exited ({client.returncode})", folder)
            time.sleep(0.5)
        return _failed(f"no steady soak within {timeout:.0f} s", folder)
    finally:
        _stop(client)
        _stop(server)
        shutil.rmtree(folder, ignore_errors=True)


def _failed(why: str, folder: Path) -> SoakRate:
    tail = ""
    for name in ("client.log", "server.log"):
        try:
            text = (folder / name).read_text(errors="replace").strip().splitlines()
        except OSError:
            continue
        if text:
            tail = f" ({name}: {text[-1][:200]})"
            break
    return SoakRate(per_second=FALLBACK_RATE, requests=0, seconds=0.0, warmup_seconds=0.0, measured=False,
                    note=why + tail)


def soak_seconds(requests_needed: int, rate: SoakRate, *, margin: float = SOAK_MARGIN, sessions_per_client: float = 2.0) -> float:
    """The soak's length for `requests_needed` × `margin` requests at the measured rate, plus the warm-up of the
    soak's own sessions (its first visits count as requests too, but they are few and slow: they are left to
    the margin). The calibration warmed one session per client; the soak has `sessions_per_client`
    (soak_sessions ÷ concurrency)."""
    steady = requests_needed * margin / max(rate.per_second, 0.1)
    warmup = rate.warmup_seconds * sessions_per_client
    return float(max(MIN_SOAK_SECONDS, math.ceil(steady + warmup)))


def planned_rate(pilot, plan, measured: SoakRate | None = None) -> SoakRate | None:
    """The rate G4's soak will send at (runners.gateplans.soak_rate_plan: the plan's share of the fx throughput G3
    measured at the soak's concurrency), as a SoakRate with the calibration's warm-up; None when G3's evidence
    gives none (the soak then runs its closed loop). Its note says where the rate comes from and, when the
    calibration served less than that closed loop on this machine, that the simulated server may not keep up."""
    soak = dict((plan.workloads or {}).get("soak") or {})
    found = gateplans.soak_rate_plan(pilot, soak)
    if not found.get("rate_per_s"):
        return None
    note = gateplans.soak_rate_source(found)
    if measured is not None and measured.measured and measured.per_second < found["rate_per_s"]:
        note += (f"; this machine served {measured.per_second:.3g} requests/s closed loop in the calibration, less "
                 "than the planned rate: the simulated server may fall behind the soak's schedule")
    return SoakRate(per_second=float(found["rate_per_s"]), requests=0, seconds=0.0,
                    warmup_seconds=measured.warmup_seconds if measured is not None else 0.0, note=note)


def soak_line(rate: SoakRate, seconds: float, windows: int) -> str:
    """The demo's line for an open-loop soak, e.g. "soak: open loop at 3.2 requests/s, 1,840 requests, 12 windows"."""
    return (f"soak: open loop at {rate.per_second:.3g} requests/s, {int(rate.per_second * seconds):,} requests, "
            f"{int(windows)} windows")
