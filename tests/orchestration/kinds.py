"""Step kinds for testing the engine on its own: local processes instead of remote ones.

Workers load this module with `--include tests.orchestration.kinds`. `t_work` runs a local
command detached (its own session, pid file, log, exit-code file) exactly as a node would, so
polling, reconcile and cancel meet a real process; `t_note` is a short synchronous step.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
from pathlib import Path

from django.conf import settings

from runners.kinds import Poll, StepContext, StepError, StepKind, register_kind


def workdir(ctx: StepContext) -> Path:
    return Path(settings.DATA_DIR) / "t-local" / str(ctx.job.code) / f"{ctx.step.seq}-a{ctx.step.attempts}"


def _note(ctx: StepContext) -> dict:
    if ctx.step.params.get("explode"):
        raise StepError(ctx.step.params["explode"])
    ctx.log(f"note from step {ctx.step.seq}\n")
    return {"noted": True, "worker": ctx.token.split("#")[0]}


def _start(ctx: StepContext) -> dict:
    where = workdir(ctx)
    where.mkdir(parents=True, exist_ok=True)
    count, pause = int(ctx.step.params.get("count", 5)), float(ctx.step.params.get("pause", 0.2))
    fail = int(ctx.step.params.get("exit", 0))
    # Each "request" appends one line to records.jsonl, then prints PROGRESS, like the workload client.
    body = (f"for i in $(seq 1 {count}); do sleep {pause}; echo '{{\"i\": '$i'}}' >> records.jsonl; "
            f"echo PROGRESS $i {count}; done; exit {fail}")
    script = (f"cd {shlex.quote(str(where))} || exit 1; "
              f"( bash -c {shlex.quote(body)}; echo $? > exit ) > log 2>&1 & echo $! > pid")
    subprocess.run(["bash", "-c", script], start_new_session=True, check=True)
    pid = int((where / "pid").read_text())
    return {"dir": str(where), "pid": pid, "pgid": os.getpgid(pid), "offset": 0, "worker": ctx.token.split("#")[0]}


def _poll(ctx: StepContext) -> Poll:
    where = Path(ctx.step.remote["dir"])
    # The exit file first, then the log (as runners.detached.poll reads state before output): a process that ends
    # between the two reads has its last lines in the log read after it, never an exit with a stale log.
    exit_file = where / "exit"
    exit_text = exit_file.read_text().strip() if exit_file.exists() else ""
    text = (where / "log").read_text() if (where / "log").exists() else ""
    offset = int(ctx.step.remote.get("offset", 0))
    new = text[offset:]
    ctx.save_remote({**ctx.step.remote, "offset": len(text)})
    done = total = None
    for line in text.splitlines():
        if line.startswith("PROGRESS "):
            done, total = (int(x) for x in line.split()[1:3])
    if exit_text:
        return Poll(running=False, exit_code=int(exit_text), requests_done=done, requests_total=total,
                    output=new)
    return Poll(running=True, requests_done=done, requests_total=total, output=new)


def _finish(ctx: StepContext, found: Poll) -> dict:
    if found.exit_code != 0:
        raise StepError(f"the local process exited with code {found.exit_code}")
    records = (Path(ctx.step.remote["dir"]) / "records.jsonl").read_text().splitlines()
    return {"records": len(records), "exit_code": found.exit_code}


def _cancel(ctx: StepContext) -> None:
    pgid = ctx.step.remote.get("pgid")
    if pgid:
        try:
            os.killpg(int(pgid), signal.SIGKILL)
        except ProcessLookupError:
            pass


register_kind(StepKind("t_note", run=_note, soft_time_limit=30))
# Like the report: its error is shown on the step but does not change the run's outcome.
register_kind(StepKind("t_aside", run=_note, soft_time_limit=30, affects_status=False))
register_kind(StepKind("t_work", start=_start, poll=_poll, finish=_finish, cancel=_cancel, soft_time_limit=30))
