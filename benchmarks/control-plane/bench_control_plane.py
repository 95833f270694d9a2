"""The control plane at scale: many concurrent runs over many sites, steps that only sleep.

    .venv/bin/python benchmarks/control-plane/bench_control_plane.py [--runs 20,200] [--sites 100] [--nodes 8]

Needs PostgreSQL and Redis: DATABASE_URL names a database of its own (created when missing, e.g.
postgres://fxpilot:…@127.0.0.1:5432/fxpilot_bench_cp) and CELERY_BROKER_URL a Redis database. For each
run count it creates the sites (one queue each) and their nodes, then that many gate-run-shaped jobs —
two chains of `--chain` steps on two nodes of one site, joined by a last step on the control queue — and
starts them at once. Real Celery workers (threads pool) serve the control queue and every site's queue;
`manage.py reconcile --loop` runs beside them as in production. Measured from the database afterwards:
dispatch latency from "may run" (the job was created, or the last dependency finished) to "running" (the
step was claimed), p50/p99; database connections held (pg_stat_activity, sampled); steps lost (not
successful at the end) or run twice (two executions noted by the step kind). Writes
benchmarks/out/control-plane-<time>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = q / 100 * (len(ordered) - 1)
    low, high = int(rank), min(int(rank) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ensure_database(url: str) -> None:
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = parts._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="20,200", help="comma-separated run counts, each measured in turn")
    parser.add_argument("--sites", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=8, help="simulated nodes per site (rows; never contacted)")
    parser.add_argument("--chain", type=int, default=4, help="steps per node chain (two chains per run + 1 join)")
    parser.add_argument("--seconds", type=float, default=1.0, help="what each step sleeps")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=50, help="threads per worker")
    args = parser.parse_args()

    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres") or not os.environ.get("CELERY_BROKER_URL", "").startswith("redis"):
        print("set DATABASE_URL (PostgreSQL, a database of its own) and CELERY_BROKER_URL (Redis)", file=sys.stderr)
        return 2
    ensure_database(url)
    scratch = Path(tempfile.mkdtemp(prefix="fxpilot-bench-cp-"))
    marks = scratch / "marks"
    os.environ.update({"FXPILOT_ENV": "test", "FXPILOT_DATA_DIR": str(scratch / "data"), "DJANGO_SETTINGS_MODULE":
                       "fxpilot.settings", "FXPILOT_BENCH_MARKS": str(marks), "FXPILOT_POLL_SECONDS": "0.5",
                       "FXPILOT_STALE_SECONDS": "30", "FXPILOT_RECONCILE_SECONDS": "5",
                       "PYTHONPATH": f"{ROOT}{os.pathsep}{HERE}"})
    sys.path[:0] = [str(ROOT), str(HERE)]
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    results = [measure(count, args, marks, scratch) for count in (int(x) for x in args.runs.split(","))]
    out = ROOT / "benchmarks" / "out"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"control-plane-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    print(f"\nwritten {path}")
    return 0 if all(r["lost"] == 0 and r["run_twice"] == 0 for r in results) else 1


def measure(count: int, args, marks: Path, scratch: Path) -> dict:
    from django.db import connection, transaction

    from gates.models import Organisation, Pilot
    from runners.dispatch import dispatch_advance
    from runners.gateplans import StepList
    from runners.models import Job, Node, Site, Status, Step
    from runners.queues import CONTROL_QUEUE

    marks.write_text("")
    tag = uuid.uuid4().hex[:6]
    vendor = Organisation.objects.create(name=f"Bench vendor {tag}", kind=Organisation.Kind.VENDOR)
    customer = Organisation.objects.create(name=f"Bench customer {tag}", kind=Organisation.Kind.CUSTOMER)
    sites = []
    for s in range(args.sites):
        pilot = Pilot.objects.create(name=f"Bench {tag} {s}", vendor=vendor, customer=customer)
        site = Site.objects.create(pilot=pilot, name=f"site {s}", queue=f"bench-{tag}-{s:03d}")
        Node.objects.bulk_create([Node(site=site, name=f"node{n}", host=f"10.{s // 250}.{s % 250}.{n + 1}",
                                       username="fx", simulated=True) for n in range(1, args.nodes + 1)])
        sites.append(site)
    queues = [CONTROL_QUEUE, *[site.queue for site in sites]]
    import redis

    redis.Redis.from_url(os.environ["CELERY_BROKER_URL"]).delete(*queues)
    procs = start_processes(args, queues, scratch, tag)
    samples: list[int] = []
    stop = threading.Event()
    name = connection.settings_dict["NAME"]

    def sample() -> None:
        import psycopg

        with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
            while not stop.wait(0.5):
                samples.append(conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                                            (name,)).fetchone()[0] - 1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        jobs = []
        started = time.monotonic()
        with transaction.atomic():
            for i in range(count):
                site = sites[i % len(sites)]
                nodes = list(site.nodes.order_by("name"))
                pair = [nodes[(2 * (i // len(sites))) % len(nodes)], nodes[(2 * (i // len(sites)) + 1) % len(nodes)]]
                job = Job.objects.create(pilot=site.pilot, site=site, kind=Job.Kind.PROBE, params={})
                steps = StepList(job)
                ends = []
                for node in pair:
                    previous = None
                    for _ in range(args.chain):
                        previous = steps.add("b_sleep", node=node, after=[previous] if previous else [],
                                             seconds=args.seconds)
                    ends.append(previous)
                steps.add("b_sleep", after=ends, seconds=args.seconds)
                steps.save()
                jobs.append(job)
                transaction.on_commit(lambda pk=job.pk: dispatch_advance(pk))
        deadline = time.monotonic() + 600 + count * 5
        while Job.objects.filter(pk__in=[j.pk for j in jobs]).exclude(status__in=[Status.SUCCESSFUL, Status.FAILED,
                                                                                  Status.ERROR, Status.CANCELED]).exists():
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        wall = time.monotonic() - started
    finally:
        stop.set()
        sampler.join(timeout=5)
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)

    steps = list(Step.objects.filter(job__in=jobs).select_related("job"))
    by_key = {(s.job_id, s.seq): s for s in steps}
    latencies = []
    for step in steps:
        if step.started is None:
            continue
        deps = [by_key[(step.job_id, seq)] for seq in step.params.get("after", [])]
        may_run = max([d.finished for d in deps if d.finished] or [step.job.created])
        latencies.append((step.started - may_run).total_seconds())
    executions = Counter(int(line) for line in marks.read_text().split())
    lost = sum(1 for s in steps if s.status != Status.SUCCESSFUL)
    twice = sum(1 for s in steps if executions.get(s.pk, 0) > 1 or s.attempts > 1)
    result = {"runs": count, "steps": len(steps), "wall_s": round(wall, 1),
              "dispatch_p50_ms": round(percentile(latencies, 50) * 1000, 1),
              "dispatch_p99_ms": round(percentile(latencies, 99) * 1000, 1),
              "dispatch_max_ms": round(max(latencies, default=0) * 1000, 1),
              "db_connections_max": max(samples, default=0),
              "db_connections_median": statistics.median(samples) if samples else 0,
              "lost": lost, "run_twice": twice,
              "ideal_s": round((2 * args.chain + 1) * args.seconds if count else 0, 1)}
    print(json.dumps(result))
    return result


def start_processes(args, queues: list[str], scratch: Path, tag: str) -> list[subprocess.Popen]:
    env = dict(os.environ)
    procs, logs = [], []
    for w in range(args.workers):
        logs.append(scratch / f"worker-{tag}-{w}.log")
        log = open(logs[-1], "ab")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "fxpilot", "worker", "-Q", ",".join(queues), "-P", "threads",
             "-c", str(args.threads), "-n", f"bench{w}-{tag}@%h", "-l", "INFO", "--without-gossip", "--without-mingle",
             "--without-heartbeat", "--include", "bench_kinds"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    procs.append(subprocess.Popen([sys.executable, "manage.py", "reconcile", "--loop", "--interval", "5"], cwd=ROOT,
                                  env=env, stdout=open(scratch / f"reconcile-{tag}.log", "ab"),
                                  stderr=subprocess.STDOUT, start_new_session=True))
    deadline = time.monotonic() + 120
    while not all(" ready." in path.read_text(errors="replace") for path in logs):  # consuming every queue
        if time.monotonic() > deadline:
            raise RuntimeError("the workers did not get ready within 120 s")
        time.sleep(0.5)
    return procs


if __name__ == "__main__":
    sys.exit(main())
