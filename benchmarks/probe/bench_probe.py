"""Probe 8 simulated nodes in parallel vs one node alone: the parallel run must take ≤ 1.5 × the single one.

    .venv/bin/python benchmarks/probe/bench_probe.py [--nodes 8] [--repeat 3] [--time-scale 0.05] [--fio-runtime 30]

The simulated nodes run in their own process (manage.py simnode), as in the demo; the probes run here over
real SSH from threads (runners.probe.probe_nodes), storing every raw output as an artifact in a scratch
database. Writes benchmarks/out/probe-<time>.json and exits 1 when the ratio misses the bar.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BAR = 1.5


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--time-scale", type=float, default=0.1, help="simulated time per real second of fio")
    parser.add_argument("--fio-runtime", type=int, default=30, help="fio seconds per disk (scaled on simulated nodes)")
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="fxpilot-bench-probe-"))
    os.environ.update({"FXPILOT_ENV": "test", "FXPILOT_DATA_DIR": str(scratch / "data"),
                       "DATABASE_URL": f"sqlite:///{scratch / 'bench.sqlite3'}", "DJANGO_SETTINGS_MODULE": "fxpilot.settings",
                       "LOG_LEVEL": "WARNING"})
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    nodes_dir = scratch / "simnodes"
    server = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "simnode", "--nodes", str(args.nodes),
                               "--dir", str(nodes_dir), "--time-scale", str(args.time_scale)],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        ports = _wait_for_ports(server, args.nodes)
        nodes, job_factory = _register(nodes_dir, ports)
        from runners.probe import probe_node, probe_nodes

        probe_node(nodes[0], job=job_factory(), fio_runtime=args.fio_runtime)  # warm-up: imports, first handshakes
        singles, parallels = [], []
        for _ in range(args.repeat):
            start = time.perf_counter()
            probe_node(nodes[0], job=job_factory(), fio_runtime=args.fio_runtime)
            singles.append(time.perf_counter() - start)
            start = time.perf_counter()
            results = probe_nodes(nodes, job=job_factory(), fio_runtime=args.fio_runtime)
            parallels.append(time.perf_counter() - start)
            failed = {name: str(r) for name, r in results.items() if isinstance(r, Exception)}
            if failed:
                print(f"probe failed: {failed}", file=sys.stderr)
                return 2
    finally:
        server.terminate()
        server.wait(timeout=30)
    single, parallel = statistics.median(singles), statistics.median(parallels)
    ratio = parallel / single
    report = {"benchmark": "probe", "simulated": True, "nodes": args.nodes, "repeat": args.repeat,
              "time_scale": args.time_scale, "fio_runtime": args.fio_runtime, "cpus": os.cpu_count(),
              "single_s": singles, "parallel_s": parallels, "single_median_s": round(single, 3),
              "parallel_median_s": round(parallel, 3), "ratio": round(ratio, 3), "bar": BAR, "ok": ratio <= BAR}
    out = ROOT / "benchmarks" / "out" / f"probe-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"one node: {single:.2f} s   {args.nodes} nodes in parallel: {parallel:.2f} s   ratio {ratio:.2f} "
          f"(bar {BAR})   -> {out.relative_to(ROOT)}")
    return 0 if ratio <= BAR else 1


def _wait_for_ports(server: subprocess.Popen, count: int) -> dict[str, int]:
    ports: dict[str, int] = {}
    deadline = time.monotonic() + 60
    while len(ports) < count and time.monotonic() < deadline:
        line = server.stdout.readline()
        if not line:
            raise SystemExit(f"simnode exited early (code {server.poll()})")
        match = re.match(r"^(node\d+)\s+host=\S+ port=(\d+)", line)
        if match:
            ports[match.group(1)] = int(match.group(2))
    if len(ports) < count:
        raise SystemExit("simnode did not print every node within 60 s")
    return ports


def _register(nodes_dir: Path, ports: dict[str, int]):
    import paramiko

    from gates.models import Organisation, Pilot
    from runners.config import default_simulated
    from runners.credentials import create_credential
    from runners.models import Job, Node, Site

    vendor = Organisation.objects.create(name="Bench vendor", kind=Organisation.Kind.VENDOR)
    customer = Organisation.objects.create(name="Bench customer", kind=Organisation.Kind.CUSTOMER)
    pilot = Pilot.objects.create(name="Probe benchmark", vendor=vendor, customer=customer, deployment=default_simulated())
    site = Site.objects.create(pilot=pilot, name="Bench site", queue="bench-probe")
    credential = create_credential(site, "bench", (nodes_dir / "client_key").read_text())
    nodes = []
    for name, port in sorted(ports.items(), key=lambda item: int(item[0][4:])):
        # the host keys are read from the simulated nodes' own files: nothing offered over the network is trusted
        key = paramiko.Ed25519Key.from_private_key_file(str(nodes_dir / f"{name}.host_key"))
        nodes.append(Node.objects.create(site=site, name=name, host="127.0.0.1", port=port, username="fxpilot",
                                         credential=credential, simulated=True,
                                         host_key_state=Node.HostKeyState.ACCEPTED, host_key_type=key.get_name(),
                                         host_key=key.get_base64(), host_key_fingerprint=key.fingerprint))
    return nodes, lambda: Job.objects.create(pilot=pilot, site=site, kind=Job.Kind.PROBE)


if __name__ == "__main__":
    sys.exit(main())
