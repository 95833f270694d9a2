"""`python manage.py run_gate PILOT GATE [--follow]`: start a gate run and follow it to its end.

Exit codes: 0 successful, 1 failed (a bar was missed), 2 error (the infrastructure broke),
3 canceled, 4 the run could not start (closed gate, unsigned plan, no nodes, a run already going).
A node held by another run makes the run wait for it (the log says which node and run); with --no-wait
it is refused instead, naming that run.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import InterfaceError, OperationalError, close_old_connections, connections

from gates.lifecycle import TransitionRefused
from gates.management.lookup import REFUSED, command_line_actor, find_pilot
from gates.plan import parse_gate_label
from runners.models import Job, Site, Status
from runners.orchestration import RunRefused, job_progress, log_since, start_gate_run
from runners.validators import validate_trace_size

EXIT_CODES = {Status.SUCCESSFUL: 0, Status.FAILED: 1, Status.ERROR: 2, Status.CANCELED: 3}


def follow_job(job: Job, write, *, every: float = 1.0, progress_every: float = 10.0) -> Job:
    """Print the live log and a progress line now and then until the job ends.

    A database that goes away (a restart, a failover) is waited for, saying so once, and the log
    goes on from where it stopped: following never ends the run, and it does not end on an outage.
    """
    seen = 0
    last_progress = 0.0
    outage_since: float | None = None
    while True:
        try:
            job.refresh_from_db()
            for chunk in log_since(job, seen):
                seen = chunk.seq
                write("".join(f"[{label}] {line}" if label else line for label, line in chunk.lines()).rstrip("\n"))
            if job.is_finished:
                return job
            now = time.monotonic()
            if now - last_progress >= progress_every:
                last_progress = now
                write(progress_line(job_progress(job)))
            if outage_since is not None:
                write(f"— the database answers again after {now - outage_since:.0f} s —")
                outage_since = None
        except (OperationalError, InterfaceError) as exc:
            close_old_connections()
            connections.close_all()
            if outage_since is None:
                outage_since = time.monotonic()
                write(f"— the database does not answer ({str(exc).strip().splitlines()[0][:200]}); "
                      "waiting for it, the run goes on —")
        time.sleep(every)


def progress_line(p: dict) -> str:
    parts = [f"— step {p['step']} of {p['steps_total']}"]
    if p["requests_total"]:
        parts.append(f"requests {p['requests_done']} of {p['requests_total']}")
    if p["eta_seconds"] is not None:
        parts.append(f"about {int(p['eta_seconds'])} s left")
    return ", ".join(parts) + " —"


class Command(BaseCommand):
    help = "Start a run of a gate (G1–G4) of a pilot on its site's nodes and follow it (exit 0/1/2/3: see the module)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("pilot", help="pilot name or code")
        parser.add_argument("gate", help="G1, G2, G3 or G4")
        parser.add_argument("--site", help="site name (default: the pilot's first site with GPU nodes)")
        parser.add_argument("--follow", action="store_true", default=True, help="follow until the run ends (default)")
        parser.add_argument("--no-follow", dest="follow", action="store_false", help="start it and return")
        parser.add_argument("--time-scale", type=float, help="time scale of simulated nodes (1.0 = real time)")
        parser.add_argument("--params", help='JSON object of run parameters, e.g. {"repetitions": 2}')
        parser.add_argument("--trace", help="G4: the customer's session trace CSV (default: the trace uploaded on the G4 page; a generated sample trace only if the signed plan allows it)")
        parser.add_argument("--no-wait", dest="wait", action="store_false", default=True,
                            help="refuse (exit 3) when another run holds one of the nodes, instead of waiting for it")
        parser.add_argument("--as", dest="actor", default=None,
                            help="who is starting it, for the run's page and the audit log (default: command line (user@host))")

    def handle(self, *args, pilot: str, gate: str, site: str | None, follow: bool, time_scale: float | None,
               params: str | None, trace: str | None, actor: str, wait: bool = True, **options) -> None:
        the_pilot = find_pilot(pilot)
        try:
            number = parse_gate_label(gate)
        except KeyError as exc:
            raise CommandError(str(exc.args[0]), returncode=REFUSED) from None
        run_params = {}
        if params:
            try:
                run_params = json.loads(params)
            except json.JSONDecodeError as exc:
                raise CommandError(f"--params is not JSON: {exc}", returncode=REFUSED) from None
            if not isinstance(run_params, dict):
                raise CommandError("--params must be a JSON object", returncode=REFUSED)
        if time_scale is not None:
            if not 0 < time_scale <= 1000:
                raise CommandError(f"--time-scale {time_scale} must be above 0", returncode=REFUSED)
            run_params["time_scale"] = time_scale
        the_site = None
        if site:
            the_site = Site.objects.filter(pilot=the_pilot, name=site).first()
            if the_site is None:
                raise CommandError(f"the pilot has no site named {site!r}", returncode=REFUSED)
        trace_bytes = None
        if trace:
            try:
                validate_trace_size(Path(trace).stat().st_size)
                trace_bytes = Path(trace).read_bytes()
            except OSError as exc:
                raise CommandError(f"--trace {trace}: {exc.strerror}", returncode=REFUSED) from None
            except ValidationError as exc:
                raise CommandError(f"--trace {trace}: {' '.join(exc.messages)}", returncode=REFUSED) from None
        try:
            job = start_gate_run(the_pilot.gate(number), actor or command_line_actor(), site=the_site, params=run_params,
                                 trace=trace_bytes, wait=wait)
        except (TransitionRefused, RunRefused) as exc:
            raise CommandError(f"cannot start G{number}: {exc}", returncode=REFUSED) from None
        self.stdout.write(f"G{number} run {job.code} started")
        self.stdout.flush()
        if not follow:
            if job.waiting_for:
                self.stdout.write(job.waiting_for)
            return
        write = self._writer()
        try:
            job = follow_job(job, write)
        except KeyboardInterrupt:
            self.stdout.write(f"\nstopped following; the run goes on. Cancel it with: manage.py cancel_run {job.code}")
            return
        p = job_progress(job)
        self.stdout.write(f"run {job.status} after {int(p['elapsed_seconds'] or 0)} s")
        for step in p["steps"]:
            if step["status"] in (Status.ERROR, Status.FAILED):
                self.stdout.write(f"  step {step['seq']} {step['name']} {step['status']}: {step['error']}")
        raise SystemExit(EXIT_CODES.get(job.status, 2))

    def _writer(self):
        def write(text: str) -> None:
            self.stdout.write(text)
            self.stdout.flush()
        return write

