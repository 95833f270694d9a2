"""`make demo`'s wall time, measured: the whole simulated pilot (G1 → G4 and the procurement report) run N times
from this tree, each in a fresh data folder with `--no-serve`, with the machine's load recorded before and during
each run (benchmarks/demo/README.md).

    .venv/bin/python benchmarks/demo/bench_demo.py [--runs 3] [--scenario nominal] [--time-scale X]
                                                   [--idle-below 1.0 --idle-wait 600] [--busy N] [--results FILE]
    .venv/bin/python benchmarks/demo/bench_demo.py --table     # the recorded runs as a Markdown table

Per run it records the total wall time, each gate's time as the demo prints it ("G3 run ended … in 2:01",
the soak calibration too), whether any gate ran twice ("runs again"), the exit code, and the load: the
1-minute load average just before the run (after waiting up to --idle-wait seconds for it to fall below
--idle-below, saying whether it did), and its mean and maximum sampled every 5 s during the run, with the
15-minute figure at the end. Each run appends one JSON line to benchmarks/demo/results.jsonl (the git
commit and whether the tree had changes are in it); the demo's own output is kept in benchmarks/out/.
`--busy N` loads the machine on purpose: N processes that only spin on the CPU, at the demo's priority, run from
just before each run to its end (N + the demo's own 1–2 is the load a run then sees; the figures record it).
Exit 0 when every run completed the pilot, 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
GATE_LINE = re.compile(r"^(G[1-4]) run ended (\w+) in (\d+):(\d\d)", re.MULTILINE)
CALIBRATION = re.compile(r"^Total [\d:]+: .*soak calibration (\d+):(\d\d)", re.MULTILINE)
RATE = re.compile(r"^  ([\d.]+) requests/s .* the soak runs (\d+):(\d\d)", re.MULTILINE)


def load() -> tuple[float, float, float]:
    return os.getloadavg()


def git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def wait_idle(below: float, wait: float) -> tuple[bool, float]:
    """Wait up to `wait` seconds for the 1-minute load average to fall below `below`; (got it, seconds waited)."""
    began = time.monotonic()
    while load()[0] >= below and time.monotonic() - began < wait:
        time.sleep(10)
    return load()[0] < below, time.monotonic() - began


class LoadSampler(threading.Thread):
    def __init__(self, every: float = 5.0):
        super().__init__(daemon=True)
        self.every, self.samples, self.done = every, [], threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.samples.append(load()[0])
            self.done.wait(self.every)


def burners(count: int) -> list[subprocess.Popen]:
    """`count` processes that spin on the CPU until they are killed (or this script dies: their stdin closes)."""
    spin = "import sys, threading\nthreading.Thread(target=lambda: sys.stdin.read() or __import__('os')._exit(0), " \
           "daemon=True).start()\nwhile True: pass\n"
    return [subprocess.Popen([sys.executable, "-c", spin], stdin=subprocess.PIPE) for _ in range(count)]


def one_run(index: int, args: argparse.Namespace, out_dir: Path) -> dict:
    idle, waited = wait_idle(args.idle_below, args.idle_wait) if args.idle_wait else (load()[0] < args.idle_below, 0.0)
    busy = burners(args.busy)
    if busy:
        time.sleep(60)  # the load average follows a new load over about a minute: "before" then shows it
    before = load()
    commit, changed = git("rev-parse", "--short", "HEAD"), bool(git("status", "--porcelain", "--untracked-files=no"))
    data = Path(tempfile.mkdtemp(prefix="fxpilot-demo-bench-"))
    log = out_dir / f"demo-{datetime.now(UTC):%Y%m%dT%H%M%SZ}-run{index}.log"
    argv = [sys.executable, "manage.py", "demo", "--no-serve", "--port", "0", "--scenario", args.scenario]
    if args.time_scale:
        argv += ["--time-scale", str(args.time_scale)]
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "FXPILOT_ENV")}
    env["FXPILOT_DATA_DIR"] = str(data / "var")
    sampler = LoadSampler()
    sampler.start()
    began = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            code = proc.wait(args.timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)  # the demo cancels its run and stops what it started
            code = proc.wait(120)
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            proc.wait(120)
            raise
        finally:
            for burner in busy:
                burner.kill()
                burner.wait()
    seconds = time.monotonic() - began
    sampler.done.set()
    sampler.join()
    text = log.read_text(errors="replace")
    gates: dict[str, float] = {}
    for label, _status, minutes, secs in GATE_LINE.findall(text):
        gates[label] = gates.get(label, 0.0) + int(minutes) * 60 + int(secs)
    calibration = CALIBRATION.search(text)
    rate = RATE.search(text)
    during = sampler.samples or [load()[0]]
    result = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"), "commit": commit,
        "tree_changed": changed, "run": index,
        "scenario": args.scenario, "time_scale": args.time_scale, "busy_processes": args.busy, "exit_code": code, "total_seconds": round(seconds, 1),
        "gate_seconds": gates,
        "soak_calibration_seconds": int(calibration[1]) * 60 + int(calibration[2]) if calibration else None,
        "soak_rate_per_second": float(rate[1]) if rate else None,
        "soak_seconds": int(rate[2]) * 60 + int(rate[3]) if rate else None,
        "setup_seconds": _part(text, "set-up"), "signing_seconds": _part(text, "sign-offs and reports"),
        "gate_run_twice": "runs again" in text,
        "completed": code == 0 and bool(re.search(r"^Pilot .+: (Completed|Halted) in", text, re.MULTILINE)),
        "cpus": os.cpu_count(), "load_before": [round(x, 2) for x in before], "idle_before": idle,
        "waited_for_idle_seconds": round(waited), "load_during_mean": round(statistics.fmean(during), 2),
        "load_during_max": round(max(during), 2), "load_15min_after": round(load()[2], 2), "log": str(log.relative_to(ROOT)),
    }
    # tens of thousands of small files (the simulated cache tiers): removed in the background, after the figures
    threading.Thread(target=shutil.rmtree, args=(data,), kwargs={"ignore_errors": True}, daemon=False).start()
    return result


def _part(text: str, name: str) -> int | None:
    """Seconds of one named part of the demo's Total line (set-up; sign-offs and reports), None when absent."""
    found = re.search(rf"^Total [\d:]+: .*?\b{re.escape(name)} (\d+):(\d\d)", text, re.MULTILINE)
    return int(found[1]) * 60 + int(found[2]) if found else None


def clock(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    whole = int(round(seconds))
    return f"{whole // 60}:{whole % 60:02d}"


def table(path: Path) -> str:
    """The recorded runs as a Markdown table (--table)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    out = ["| when (UTC) | commit | total | G1 | G2 | G3 | soak calibration | G4 | soak rate → length | a gate twice | "
           "load before | load during (mean / max) |", "|---" * 12 + "|"]
    for r in rows:
        g = r["gate_seconds"]
        rate = (f"{r['soak_rate_per_second']:.1f}/s → {clock(r['soak_seconds'])}"
                if r.get("soak_rate_per_second") is not None else "—")
        out.append(f"| {r['when'][:16].replace('T', ' ')} | {r['commit']}{'+' if r['tree_changed'] else ''} | "
                   f"**{clock(r['total_seconds'])}**{'' if r['completed'] else ' (not completed)'} | "
                   f"{clock(g.get('G1'))} | {clock(g.get('G2'))} | {clock(g.get('G3'))} | "
                   f"{clock(r.get('soak_calibration_seconds'))} | {clock(g.get('G4'))} | {rate} | "
                   f"{'yes' if r['gate_run_twice'] else 'no'} | {r['load_before'][0]:.1f}"
                   f"{f' ({b} spinning)' if (b := r.get('busy_processes')) else ''} | "
                   f"{r['load_during_mean']:.1f} / {r['load_during_max']:.1f} |")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--scenario", default="nominal")
    parser.add_argument("--time-scale", type=float, default=None, help="default: the demo's own")
    parser.add_argument("--idle-below", type=float, default=1.0, help="1-minute load average counted as idle")
    parser.add_argument("--idle-wait", type=float, default=0.0, help="seconds to wait for an idle machine per run")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed per demo")
    parser.add_argument("--busy", type=int, default=0, help="CPU-spinning processes beside each run (a loaded machine)")
    parser.add_argument("--results", type=Path, default=HERE / "results.jsonl")
    parser.add_argument("--table", action="store_true", help="print the recorded runs as a Markdown table and exit")
    args = parser.parse_args()
    if args.table:
        print(table(args.results))
        return 0
    out_dir = ROOT / "benchmarks" / "out"
    out_dir.mkdir(parents=True, exist_ok=True)
    ok = True
    for index in range(1, args.runs + 1):
        result = one_run(index, args, out_dir)
        with open(args.results, "a") as out:
            out.write(json.dumps(result, sort_keys=True) + "\n")
        gates = ", ".join(f"{k} {v:.0f} s" for k, v in result["gate_seconds"].items())
        print(f"run {index}: {'completed' if result['completed'] else 'NOT completed'} in {result['total_seconds']:.0f} s "
              f"({gates}; soak {result['soak_seconds']} s at {result['soak_rate_per_second']} req/s); load before "
              f"{result['load_before'][0]:.1f}, during mean {result['load_during_mean']:.1f} max "
              f"{result['load_during_max']:.1f}{'; a gate ran twice' if result['gate_run_twice'] else ''}", flush=True)
        ok = ok and result["completed"] and result["exit_code"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
