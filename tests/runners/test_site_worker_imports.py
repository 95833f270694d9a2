"""A site worker (a jump host) imports no PDF renderer or signer: it needs neither Pango nor fonts to start."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runners.management.commands import worker

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("weasyprint", "pyhanko", "portal.views.pilots")

# What a Celery worker process does at start: set Django up, run the fix-up's checks unless told not to, then
# import every task module. Prints the heavy modules it ended up with.
START = """
import os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fxpilot.settings")
from fxpilot.celery import app
app.loader.import_default_modules()
import portal.tasks, runners.tasks
print(",".join(m for m in HEAVY if m in sys.modules))
""".replace("HEAVY", repr(HEAVY))


def worker_env(monkeypatch, queues: str) -> dict:
    """The environment `manage.py worker --queues QUEUES` hands to Celery (execve is where the command ends)."""
    seen = {}

    def execve(path, argv, env):
        seen.update(env)
        raise SystemExit(0)

    monkeypatch.setattr(worker.os, "execve", execve)
    monkeypatch.setattr(worker.settings, "FXPILOT_EMBEDDED_BROKER", False)
    with pytest.raises(SystemExit):
        worker.Command().handle(queues=queues, concurrency=1, beat=False, hostname=None, loglevel="INFO",
                                include=None)
    return seen


def start_modules(env: dict) -> set[str]:
    out = subprocess.run([sys.executable, "-c", START], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return {m for m in out.stdout.strip().split(",") if m}


def test_a_site_worker_starts_without_the_renderer_and_the_control_worker_runs_the_checks(monkeypatch):
    site = worker_env(monkeypatch, "site-lab")
    assert site.get("CELERY_SKIP_CHECKS") == "1"
    assert start_modules(site) == set()
    control = worker_env(monkeypatch, f"{worker.CONTROL_QUEUE},site-lab")
    assert "CELERY_SKIP_CHECKS" not in control
    # The control worker runs Django's checks, which load the portal (and make reports there).
    assert "portal.views.pilots" in start_modules(control)
