"""Portal load benchmark: 200 pilots × 50 runs, gunicorn on loopback, 10 concurrent clients.

Builds its own SQLite database in a scratch data folder, serves it with gunicorn (DEBUG off), logs in
as the vendor engineer who sees every pilot, and drives each page with a threaded keep-alive client.
The floor measured in the same run is a static file served by WhiteNoise through the same stack; the
target is p95 ≤ 100 ms for the list and detail pages. Writes benchmarks/out/portal-<time>.json.

    .venv/bin/python benchmarks/portal/bench_portal.py [--pilots 200 --runs 50 --requests 300 --clients 10]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from urllib.parse import urlencode, urlparse

ROOT = Path(__file__).resolve().parents[2]
TARGET_P95_MS = 100.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def populate(pilots: int, runs: int) -> dict:
    """Run inside a child interpreter with the scratch environment: the demo people, N pilots, M runs each."""
    import django

    django.setup()
    from django.core.management import call_command
    from django.utils import timezone

    call_command("migrate", verbosity=0)
    from gates import lifecycle
    from gates.models import AuditEvent, Pilot
    from portal.management.commands.seed_demo import DEMO_PASSWORD, seed
    from runners.models import Job, Node, OutputChunk, Site, Status, Step

    demo = seed()
    people = {u.username: u for u in django.contrib.auth.get_user_model().objects.all()}
    lifecycle.sign_plan(demo.latest_plan, people["alice"])
    lifecycle.sign_plan(demo.latest_plan, people["bob"])
    for n in range(pilots - 1):
        pilot = lifecycle.create_pilot(
            name=f"Bench pilot {n:03d}", customer=demo.customer, vendor=demo.vendor, who="bench"
        )
        if n % 2 == 0:
            lifecycle.sign_plan(pilot.latest_plan, people["alice"])
            lifecycle.sign_plan(pilot.latest_plan, people["bob"])
    now = timezone.now()
    jobs, steps, events = [], [], []
    for pilot in Pilot.objects.all():
        site = Site.objects.create(pilot=pilot, name="Lab", queue=f"bench-{pilot.pk}")
        Node.objects.create(site=site, name="node1", host="127.0.0.1", username="fx", simulated=True)
        gate = pilot.gates.get(number=1)
        for _ in range(runs):
            jobs.append(
                Job(
                    pilot=pilot,
                    gate=gate,
                    site=site,
                    status=Status.SUCCESSFUL,
                    created=now,
                    started=now,
                    finished=now,
                    chunk_count=0,
                    params={"time_scale": 0.01},
                )
            )
        for e in range(50):
            events.append(
                AuditEvent(
                    pilot=pilot,
                    actor_label="bench",
                    action="bench.event",
                    object_type="pilot",
                    object_id=str(pilot.pk),
                    detail={"n": e},
                )
            )
    Job.objects.bulk_create(jobs, batch_size=2000)
    AuditEvent.objects.bulk_create(events, batch_size=2000)
    node_of = {n.site.pilot_id: n for n in Node.objects.select_related("site")}
    for job in Job.objects.all().only("id", "pilot_id"):
        for seq, name in enumerate(("probe", "collect", "evaluate"), 1):
            steps.append(
                Step(
                    job_id=job.pk,
                    seq=seq,
                    name=name,
                    node=node_of[job.pilot_id],
                    status=Status.SUCCESSFUL,
                    requests_done=100,
                    requests_total=100,
                )
            )
    Step.objects.bulk_create(steps, batch_size=5000)
    job = Job.objects.filter(pilot=demo).first()
    OutputChunk.objects.bulk_create(
        [OutputChunk(job=job, seq=n, stream="stdout", text=f"line {n} of the probe output\n") for n in range(1, 1001)]
    )
    Job.objects.filter(pk=job.pk).update(chunk_count=1000)
    return {
        "pilot": str(demo.code),
        "job": str(job.code),
        "password": DEMO_PASSWORD,
        "pilots": Pilot.objects.count(),
        "runs": Job.objects.count(),
        "steps": Step.objects.count(),
    }


def scratch_database(url: str, *, create: bool) -> None:
    """Create (after dropping a leftover) or drop the benchmark's own PostgreSQL database."""
    import psycopg

    parts = urlparse(url)
    name = parts.path.lstrip("/")
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name or ""):
        raise SystemExit(f"--database-url: {name!r} is not a plain database name")
    admin = parts._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        if create:
            conn.execute(f"CREATE DATABASE {name}")


def server_cpu_seconds(master: int) -> float:
    """User + system CPU time of the gunicorn workers (children of the master), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == master:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


class Client:
    """One keep-alive HTTP connection with a session cookie."""

    def __init__(self, port: int, cookie: str):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.cookie = cookie

    def get(self, path: str) -> tuple[int, float]:
        start = time.perf_counter()
        self.conn.request("GET", path, headers={"Cookie": self.cookie, "Host": "127.0.0.1"})
        response = self.conn.getresponse()
        response.read()
        return response.status, (time.perf_counter() - start) * 1000


def log_in(port: int, username: str, password: str) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/accounts/login/", headers={"Host": "127.0.0.1"})
    response = conn.getresponse()
    body = response.read().decode()
    csrf = re.search(r"csrftoken=([^;]+)", response.getheader("Set-Cookie")).group(1)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', body).group(1)
    conn.request(
        "POST",
        "/accounts/login/",
        urlencode({"username": username, "password": password, "csrfmiddlewaretoken": token}),
        headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "Cookie": f"csrftoken={csrf}",
            "Host": "127.0.0.1",
            "Referer": f"http://127.0.0.1:{port}/accounts/login/",
        },
    )
    response = conn.getresponse()
    response.read()
    session = re.search(r"sessionid=([^;]+)", response.getheader("Set-Cookie") or "")
    if response.status != 302 or not session:
        raise SystemExit(f"log-in failed: HTTP {response.status}")
    return f"sessionid={session.group(1)}; csrftoken={csrf}"


def load_wrk(port: int, cookie: str, path: str, clients: int, seconds: float, nice: int = 0) -> dict:
    """wrk (C, light on the CPU the server needs) with `clients` connections for `seconds`."""
    argv = [
        *(["nice", "-n", str(nice)] if nice else []),
        "wrk",
        "-t",
        "2",
        "-c",
        str(clients),
        "-d",
        f"{seconds:g}s",
        "--timeout",
        "10s",
        "-s",
        str(Path(__file__).with_name("report.lua")),
        "-H",
        f"Cookie: {cookie}",
        "-H",
        "Host: 127.0.0.1",
        f"http://127.0.0.1:{port}{path}",
    ]
    text = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    result = json.loads(text.strip().splitlines()[-1])
    result["rps"] = round(result["requests"] / result["seconds"], 1)
    return {"path": path, "tool": "wrk", **result}


def load(port: int, cookie: str, path: str, clients: int, requests: int) -> dict:
    """The same load from Python threads with keep-alive connections, when wrk is not installed."""
    latencies: list[float] = []
    errors: list[int] = []
    lock = threading.Lock()
    per_client = requests // clients

    def worker() -> None:
        client = Client(port, cookie)
        client.get(path)  # warm the connection and the worker
        mine, bad = [], []
        for _ in range(per_client):
            status, ms = client.get(path)
            (mine if status == 200 else bad).append(ms if status == 200 else status)
        with lock:
            latencies.extend(mine)
            errors.extend(bad)

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    latencies.sort()
    q = statistics.quantiles(latencies, n=100)
    return {
        "path": path,
        "tool": "python",
        "requests": len(latencies),
        "errors": len(errors),
        "rps": round(len(latencies) / elapsed, 1),
        "p50_ms": round(q[49], 1),
        "p95_ms": round(q[94], 1),
        "p99_ms": round(q[98], 1),
        "max_ms": round(latencies[-1], 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pilots", type=int, default=200)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--requests", type=int, default=300, help="per page, spread over the clients (Python client)")
    parser.add_argument("--seconds", type=float, default=10.0, help="per page (wrk)")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--workers", type=int, default=3, help="gunicorn worker processes")
    parser.add_argument(
        "--database-url",
        default="",
        help="postgres://user:pass@host:port/NAME: a scratch PostgreSQL database NAME, created and dropped here "
        "(the role needs CREATEDB); default: SQLite in the scratch folder",
    )
    parser.add_argument(
        "--tuned",
        action="store_true",
        help="serve with benchmarks/portal/tuned_settings.py (persistent connections, cached sessions)",
    )
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="run gunicorn and wrk at this niceness (e.g. -10 as root, to measure beside unrelated load)",
    )
    parser.add_argument("--populate", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.populate:
        print(json.dumps(populate(args.pilots, args.runs)))
        return 0

    scratch = Path(tempfile.mkdtemp(prefix="fxpilot-bench-portal-"))
    database_url = args.database_url or f"sqlite:///{scratch}/bench.sqlite3"
    if args.database_url:
        scratch_database(args.database_url, create=True)
    env = {
        **os.environ,
        "FXPILOT_DATA_DIR": str(scratch),
        "DATABASE_URL": database_url,
        "DEBUG": "false",
        "DJANGO_SETTINGS_MODULE": "tuned_settings" if args.tuned else "fxpilot.settings",
        "PYTHONPATH": f"{ROOT}{os.pathsep}{Path(__file__).resolve().parent}",
        "LOG_LEVEL": "WARNING",
    }
    env.pop("FXPILOT_ENV", None)
    python = sys.executable
    started = time.perf_counter()
    made = json.loads(
        subprocess.run(
            [python, __file__, "--populate", "--pilots", str(args.pilots), "--runs", str(args.runs)],
            env=env,
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    print(
        f"populated {made['pilots']} pilots, {made['runs']} runs, {made['steps']} steps "
        f"in {time.perf_counter() - started:.0f} s",
        flush=True,
    )
    subprocess.run([python, "manage.py", "collectstatic", "--noinput", "-v", "0"], env=env, cwd=ROOT, check=True)
    port = free_port()
    server = subprocess.Popen(
        [
            *(["nice", "-n", str(args.nice)] if args.nice else []),
            python,
            "-m",
            "gunicorn",
            "fxpilot.wsgi",
            "-w",
            str(args.workers),
            "-b",
            f"127.0.0.1:{port}",
            "--log-level",
            "warning",
        ],
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        cookie = log_in(port, "alice", made["password"])
        pages = {
            "static file (floor)": "/static/fxpilot/portal.css",
            f"pilot list (home, {made['pilots']} pilots, 25 a page)": "/",
            "pilot overview": f"/pilots/{made['pilot']}/",
            "gate page": f"/pilots/{made['pilot']}/gates/1/",
            "plan": f"/pilots/{made['pilot']}/plan/",
            "run page (1000 log chunks)": f"/runs/{made['job']}/",
            "live log poll": f"/runs/{made['job']}/log/?after=990",
            "sites and nodes": f"/pilots/{made['pilot']}/sites/",
            "audit log": f"/pilots/{made['pilot']}/audit/",
        }
        results = {}
        for label, path in pages.items():
            cpu_before = server_cpu_seconds(server.pid)
            if shutil.which("wrk"):
                results[label] = load_wrk(port, cookie, path, args.clients, args.seconds, args.nice)
            else:
                results[label] = load(port, cookie, path, args.clients, args.requests)
            r = results[label]
            r["server_cpu_ms_per_request"] = round(
                (server_cpu_seconds(server.pid) - cpu_before) * 1000 / max(1, r["requests"]), 2
            )
            print(
                f"{label:32} p50 {r['p50_ms']:6.1f}  p95 {r['p95_ms']:6.1f}  p99 {r['p99_ms']:6.1f} ms  "
                f"{r['rps']:6.1f} req/s  server CPU {r['server_cpu_ms_per_request']:5.1f} ms/req  errors {r['errors']}",
                flush=True,
            )
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=20)
        shutil.rmtree(scratch, ignore_errors=True)
        if args.database_url:
            scratch_database(args.database_url, create=False)
    pages_only = {k: v for k, v in results.items() if "floor" not in k}
    worst = max(pages_only.values(), key=lambda r: r["p95_ms"])
    ok = worst["p95_ms"] <= TARGET_P95_MS and not any(r["errors"] for r in results.values())
    out = ROOT / "benchmarks" / "out"
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "database": "postgresql" if args.database_url else "sqlite",
        "settings": "tuned" if args.tuned else "default",
        "nice": args.nice,
        "load_average": os.getloadavg(),
        "when": datetime.now().isoformat(timespec="seconds"),
        "args": vars(args),
        "data": made,
        "target_p95_ms": TARGET_P95_MS,
        "ok": ok,
        "results": results,
    }
    path = out / f"portal-{datetime.now():%Y%m%d-%H%M%S}.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    print(f"worst page p95 {worst['p95_ms']} ms (target ≤ {TARGET_P95_MS}); {'met' if ok else 'MISSED'}; {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
