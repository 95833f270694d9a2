"""Detached long commands: started in their own process group on the node, followed by short polls.

No SSH session stays open while the command runs. ``start`` ships runners/remote/detach.sh and
returns a RemoteProcess (keep ``to_dict()`` in Step.remote); ``poll`` reports running / exited /
canceled / vanished plus the log bytes written since the last poll (re-attaching after a dropped
connection is just polling again with the stored dict); ``cancel`` kills the whole process group.

Each function takes a Node (a connection is opened for the call) or an open NodeConnection.
"""
from __future__ import annotations

import base64
import codecs
import contextlib
import re
import shlex
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from runners.models import Job, Node, OutputChunk, Step
from runners.output import append_output, system_line
from runners.ssh import NodeConnection, SSHError, connect, shell_path

DETACH_SCRIPT = Path(__file__).resolve().parent / "remote" / "detach.sh"
DEFAULT_ROOT = "~/.fxpilot/detached"
POLL_MAX_BYTES = 256 * 1024


def _alive(pgid: int) -> str:
    """Shell test: does the group still hold a live process? Zombies do not count (a PID 1 may be slow to reap)."""
    return f"ps -eo pgid=,stat= | awk -v g={pgid} '$1 == g && $2 !~ /^Z/ {{found = 1}} END {{exit !found}}'"
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,100}$")


@dataclass
class RemoteProcess:
    dir: str
    pid: int
    pgid: int
    stdout_offset: int = 0
    stderr_offset: int = 0

    @property
    def stdout(self) -> str:
        return f"{self.dir}/stdout"

    @property
    def stderr(self) -> str:
        return f"{self.dir}/stderr"

    def to_dict(self) -> dict:
        return dict(asdict(self), stdout=self.stdout, stderr=self.stderr)

    @classmethod
    def from_dict(cls, data: dict | RemoteProcess) -> RemoteProcess:
        if isinstance(data, RemoteProcess):
            return data
        try:
            proc = cls(dir=str(data["dir"]), pid=int(data["pid"]), pgid=int(data["pgid"]),
                       stdout_offset=int(data.get("stdout_offset", 0)), stderr_offset=int(data.get("stderr_offset", 0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a detached process record ({exc}): {data!r}") from None
        if proc.pgid <= 1 or proc.pid <= 1:
            raise ValueError(f"refusing process group {proc.pgid}: not a detached process record")
        return proc


@dataclass
class PollResult:
    state: str                      # running | exited | canceled | vanished
    exit_code: int | None
    proc: RemoteProcess
    stdout: str = ""
    stderr: str = ""
    new_bytes: int = 0
    more: bool = False              # more log bytes are waiting than one poll carries

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def finished(self) -> bool:
        """Ended, and every byte it logged read: a process that ended with more unread than one poll carries is
        not finished for whoever closes its step on it (the rest would be lost)."""
        return not self.running and not self.more


@dataclass
class CancelResult:
    signalled: bool
    left: list[int] = field(default_factory=list)


@contextlib.contextmanager
def _conn(target: Node | NodeConnection) -> Iterator[NodeConnection]:
    if isinstance(target, NodeConnection):
        yield target
    else:
        with connect(target) as conn:
            yield conn


def start(target: Node | NodeConnection, run_dir_or_command: str, command: str | None = None, *,
          job: Job | None = None, step: Step | None = None, name: str | None = None) -> RemoteProcess:
    """Start ``command`` detached: ``start(node, run_dir, command)`` or ``start(conn, command, name=...)``.

    Without a run directory one is made under ~/.fxpilot/detached/ from ``name`` (letters, digits, . _ -).
    """
    if command is None:
        command = run_dir_or_command
        label = name or time.strftime("run-%Y%m%d-%H%M%S")
        if not _NAME.match(label):
            raise ValueError(f"detached process name {label!r}: use letters, digits and . _ - only")
        run_dir = f"{DEFAULT_ROOT}/{label}"
    else:
        run_dir = run_dir_or_command
    with _conn(target) as conn:
        conn.mkdirs(run_dir)
        script = f"{run_dir}/detach.sh"
        conn.upload(DETACH_SCRIPT.read_bytes(), script, mode=0o755)
        if job is not None:
            system_line(job, f"[{conn.node.name}] detached: {command}", step=step)
        res = conn.run(f"bash {shell_path(script)} {shell_path(run_dir)} {shlex.quote(command)}", echo=False, timeout=60)
    match = re.search(r"pid=(\d+) pgid=(\d+) dir=(.+)$", res.stdout_tail.strip())
    if not match:
        raise SSHError(f"detach.sh printed no pid: {res.stdout_tail[-200:]!r}", node=conn.node)
    return RemoteProcess(dir=match.group(3), pid=int(match.group(1)), pgid=int(match.group(2)))


def poll(target: Node | NodeConnection, proc: RemoteProcess | dict, *, job: Job | None = None, step: Step | None = None,
         max_bytes: int = POLL_MAX_BYTES) -> PollResult:
    """State of the process and the log bytes since the stored offsets; with a job, those bytes go into its output.

    The returned ``proc`` carries the advanced offsets: store ``result.proc.to_dict()`` (e.g. in Step.remote).
    """
    proc = RemoteProcess.from_dict(proc)
    d = shell_path(proc.dir)
    script = (
        f"cd {d} || exit 4; "
        # exit_code is looked at again after the group is found gone: the wrapper may have written it in between
        f"if [ -f exit_code ]; then st=\"exited $(cat exit_code)\"; elif {_alive(proc.pgid)}; then st=running; "
        f"elif [ -f exit_code ]; then st=\"exited $(cat exit_code)\"; elif [ -f canceled ]; then st=canceled; "
        f"else st=vanished; fi; "
        f"so=$(stat -c %s stdout 2>/dev/null || echo 0); se=$(stat -c %s stderr 2>/dev/null || echo 0); "
        f"echo \"$st $so $se\"; "
        f"n=$(( so > {proc.stdout_offset} ? so - {proc.stdout_offset} : 0 )); n=$(( n > {max_bytes} ? {max_bytes} : n )); "
        f"tail -c +{proc.stdout_offset + 1} stdout 2>/dev/null | head -c $n | base64 -w0; echo; "
        f"n=$(( se > {proc.stderr_offset} ? se - {proc.stderr_offset} : 0 )); n=$(( n > {max_bytes} ? {max_bytes} : n )); "
        f"tail -c +{proc.stderr_offset + 1} stderr 2>/dev/null | head -c $n | base64 -w0; echo"
    )
    with _conn(target) as conn:
        res = conn.run(script, echo=False, timeout=120)
        node = conn.node
    lines = res.stdout_tail.split("\n")
    header = lines[0].split()
    if len(header) < 3:
        raise SSHError(f"unexpected poll answer for {proc.dir}: {res.stdout_tail[:200]!r}", node=node)
    state = header[0]
    exit_code = int(header[1]) if state == "exited" else None
    sizes = [int(header[-2]), int(header[-1])]
    out_bytes = base64.b64decode(lines[1]) if len(lines) > 1 and lines[1] else b""
    err_bytes = base64.b64decode(lines[2]) if len(lines) > 2 and lines[2] else b""
    out_bytes, err_bytes = _whole_chars(out_bytes), _whole_chars(err_bytes)
    new = RemoteProcess(proc.dir, proc.pid, proc.pgid, proc.stdout_offset + len(out_bytes), proc.stderr_offset + len(err_bytes))
    result = PollResult(state=state, exit_code=exit_code, proc=new, stdout=out_bytes.decode("utf-8", errors="replace"),
                        stderr=err_bytes.decode("utf-8", errors="replace"), new_bytes=len(out_bytes) + len(err_bytes),
                        more=new.stdout_offset < sizes[0] or new.stderr_offset < sizes[1])
    if job is not None:
        append_output(job, result.stdout, stream=OutputChunk.Stream.STDOUT, step=step)
        append_output(job, result.stderr, stream=OutputChunk.Stream.STDERR, step=step)
    if isinstance(proc, RemoteProcess):
        proc.stdout_offset, proc.stderr_offset = new.stdout_offset, new.stderr_offset
    return result


def cancel(target: Node | NodeConnection, proc: RemoteProcess | dict, *, grace_seconds: float = 10.0,
           job: Job | None = None, step: Step | None = None) -> CancelResult:
    """TERM the whole process group, KILL what is left after the grace time, and verify that nothing is left."""
    proc = RemoteProcess.from_dict(proc)
    tenths = max(1, int(grace_seconds * 10))
    pg = proc.pgid
    script = (
        f"cd {shell_path(proc.dir)} || exit 4; sig=no; "
        f"if {_alive(pg)}; then sig=yes; kill -TERM -- -{pg} 2>/dev/null; "
        f"for i in $(seq {tenths}); do {_alive(pg)} || break; sleep 0.1; done; "
        f"if {_alive(pg)}; then kill -KILL -- -{pg} 2>/dev/null; fi; "
        f"for i in $(seq 50); do {_alive(pg)} || break; sleep 0.1; done; fi; "
        f"[ -f exit_code ] || date -u +%Y-%m-%dT%H:%M:%SZ > canceled; "
        f"echo \"signalled=$sig\"; ps -eo pid=,pgid=,stat= | awk -v g={pg} '$2 == g && $3 !~ /^Z/ {{print $1}}' | tr '\\n' ' '; echo"
    )
    with _conn(target) as conn:
        res = conn.run(script, echo=False, timeout=grace_seconds + 60)
        node = conn.node
    lines = res.stdout_tail.strip().split("\n")
    left = [int(p) for p in (lines[1].split() if len(lines) > 1 else []) if p.isdigit()]
    if job is not None:
        system_line(job, f"[{node.name}] canceled process group {pg} in {proc.dir}", step=step)
    if left:
        raise SSHError(f"process group {pg} still has processes {left} after TERM and KILL", node=node)
    return CancelResult(signalled="signalled=yes" in lines[0], left=left)


def _whole_chars(data: bytes) -> bytes:
    """Drop a UTF-8 sequence cut at the end, so the next poll starts on a character boundary."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    decoder.decode(data, final=False)
    pending = len(decoder.getstate()[0])
    return data[: len(data) - pending] if pending and pending < 4 else data
