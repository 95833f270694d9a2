"""How `manage.py demo` shows its gate runs going, from `runners.progress.job_progress` figures.

On a terminal: one live line per gate (rich), redrawn in place, with the step, what runs now (requests done
of the step's total, or for a timed phase such as the soak its time: elapsed of planned) and an estimate of
what is left; when the run ends its line is replaced by how it ended, and the next gate gets a line of its
own. Anything else the demo says is printed above the live line. When stdout is not a terminal (a log
file, CI, a pipe) there is no redrawing: a plain progress line at most every `PLAIN_EVERY` seconds.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TextIO

from rich.console import Console
from rich.live import Live
from rich.text import Text

PLAIN_EVERY = 10.0
"""The least number of seconds between two plain progress lines of a gate (stdout not a terminal)."""


def clock(seconds: float | None) -> str:
    """Seconds as a person reads a duration: 0:07, 3:05, 1:02:03."""
    whole = max(0, int(round(seconds or 0)))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _running(step: dict[str, Any]) -> str:
    where = "@".join(part for part in (step.get("arm"), step.get("node")) if part)
    name = f"{step['name']} {where}".rstrip()
    planned = step.get("seconds_planned")
    if planned:
        spent, floor = step.get("seconds_elapsed") or 0.0, step.get("requests_floor")
        ok = step.get("requests_ok")
        ok = step["requests_done"] if ok is None else ok
        if spent > planned and floor and ok < floor:  # past its length, short of its bar's count of error-free ones
            return f"{name} {clock(planned)} done, on to {floor:,} error-free requests ({ok:,} so far)"
        return f"{name} {clock(min(spent, planned))} of {clock(planned)} ({step['requests_done']:,} requests)"
    if step.get("requests_total"):
        return f"{name} requests {step['requests_done']:,}/{step['requests_total']:,}"
    return name


def gate_line(label: str, progress: dict[str, Any]) -> str:
    """One line for a gate run: `G4: step 7/16 · soak fx@node2 1:05 of 3:00 (2,128 requests) · 2:10 elapsed,
    about 2:40 left`. A timed phase shows its time; its request count is what it sent so far, not a total."""
    parts = [f"{label}: step {progress['step']}/{progress['steps_total']}"]
    running = [_running(step) for step in progress.get("current") or []]
    if running:
        parts.append(", ".join(running))
    elif progress.get("status") == "pending":
        parts.append("waiting for a worker to start it")
    if progress.get("elapsed_seconds") is not None:
        timing = f"{clock(progress['elapsed_seconds'])} elapsed"
        if progress.get("eta_seconds") is not None:
            timing += f", about {clock(progress['eta_seconds'])} left"
        parts.append(timing)
    return " · ".join(parts)


class ProgressView:
    """The demo's output: message lines, and the progress of the gate run going (see the module)."""

    def __init__(self, stream: TextIO, *, terminal: bool | None = None, every: float = PLAIN_EVERY,
                 now: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        # terminal: None asks the stream (isatty, TERM=dumb); True or False says it
        self.console = Console(file=stream, highlight=False, soft_wrap=False, force_terminal=terminal)
        self.terminal = self.console.is_terminal and not self.console.is_dumb_terminal
        self.every, self.now = every, now
        self.live: Live | None = None
        self.last_plain: float | None = None
        self.label = ""

    def say(self, text: str) -> None:
        """A message line: above the live line on a terminal, as it is otherwise."""
        try:
            if self.live is not None:
                self.console.print(Text(text), soft_wrap=True)
            else:
                self.stream.write(text + "\n")
                self.stream.flush()
        except OSError:
            pass  # the terminal went away (SIGHUP): the demo still stops what it started

    def start(self, label: str) -> None:
        """A gate run begins: its live line (terminal), or the clock of its plain lines."""
        self.end_live()
        self.label, self.last_plain = label, self.now()
        if self.terminal:
            self.live = Live(Text(f"{label}: starting …"), console=self.console, refresh_per_second=4,
                             transient=True, redirect_stdout=False, redirect_stderr=False)
            try:
                self.live.start()
            except OSError:
                self.live = None

    def update(self, progress: dict[str, Any]) -> None:
        line = gate_line(self.label, progress)
        if self.live is not None:
            try:
                self.live.update(Text(line, no_wrap=True, overflow="ellipsis"), refresh=True)
            except OSError:
                pass
            return
        now = self.now()
        if self.last_plain is None or now - self.last_plain >= self.every:
            self.last_plain = now
            self.say("  " + line)

    def end(self, text: str) -> None:
        """The gate run ended: its live line gives way to `text`."""
        self.end_live()
        self.say(text)

    def end_live(self) -> None:
        live, self.live = self.live, None
        if live is not None:
            try:
                live.stop()
            except OSError:
                pass
