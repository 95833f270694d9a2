"""Loaded by pytest before Django (pytest.ini: -p tests.envsetup): tests get their own data folder, a watcher that
ends every process the session started when the session ends (infra.lifetime.start_watcher) and, without
CELERY_BROKER_URL, their own embedded Redis broker (infra.broker) for the session."""
import atexit
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("FXPILOT_ENV", "test")
# `make test` runs the suite in parallel sessions (pytest-xdist): each worker inherits the controller's
# environment, and then gets a data folder and a broker of its own (pytest-django gives it its own database),
# so two workers' Celery workers never take each other's tasks.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
# A data folder this session makes is removed once the session has ended and its watcher has ended everything the
# session started (also after a SIGKILL); FXPILOT_KEEP_TEST_DATA=1 keeps it, and a folder given in FXPILOT_DATA_DIR
# is always kept.
_MADE = _WORKER or not os.environ.get("FXPILOT_DATA_DIR")
if _WORKER:
    os.environ["FXPILOT_DATA_DIR"] = tempfile.mkdtemp(prefix=f"fxpilot-test-{_WORKER}-")
    if os.environ.get("FXPILOT_TEST_EMBEDDED_BROKER"):
        os.environ.pop("CELERY_BROKER_URL", None)  # the controller's embedded broker: start one of our own below
    elif os.environ.get("CELERY_BROKER_URL", "").startswith("redis://"):
        # A Redis server given from outside (.ci/run): the next databases, one per worker (gw0 → db N+1, …).
        base, _, number = os.environ["CELERY_BROKER_URL"].rpartition("/")
        index = int(_WORKER.removeprefix("gw") or 0)
        os.environ["CELERY_BROKER_URL"] = f"{base}/{(int(number) if number.isdigit() else 0) + 1 + index}"
elif _MADE:
    os.environ["FXPILOT_DATA_DIR"] = tempfile.mkdtemp(prefix="fxpilot-test-")

# Nothing this pytest process starts outlives it, even when it is killed with SIGKILL: a watcher, started before
# anything else, then ends every process that carries this session's mark in its environment (all it starts; an
# SSH server a fixture starts passes the mark on: tests/runners/conftest.py) and the process groups fixtures
# name in pid files (infra.lifetime.watch_files). Under pytest-xdist the controller and each worker have one.
from infra.lifetime import start_watcher  # noqa: E402

start_watcher(os.environ["FXPILOT_DATA_DIR"], remove_folder=bool(_MADE) and not os.environ.get("FXPILOT_KEEP_TEST_DATA"))
# Commands the tests run (python, celery, pyhanko, st) come from the interpreter's own environment,
# also when `make test` calls .venv/bin/python without activating the virtual environment.
os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")

if not os.environ.get("CELERY_BROKER_URL"):
    # The same broker as the embedded default, started for this session and stopped with it (also
    # when pytest is killed: the server gets SIGTERM when this process dies).
    from infra import broker
    from infra.lifetime import die_with_parent

    _data = Path(os.environ["FXPILOT_DATA_DIR"])
    _server = broker.start_child(_data, persistent=False, preexec_fn=die_with_parent())
    os.environ["CELERY_BROKER_URL"] = broker.embedded_url(_data)
    os.environ["FXPILOT_TEST_EMBEDDED_BROKER"] = "1"
    atexit.register(broker.stop_child, _server)
