"""Loaded by pytest before Django (pytest.ini: -p tests.envsetup): tests get their own data folder and,
without CELERY_BROKER_URL, their own embedded Redis broker (fxpilot.broker) for the session."""
import atexit
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("FXPILOT_ENV", "test")
os.environ.setdefault("FXPILOT_DATA_DIR", tempfile.mkdtemp(prefix="fxpilot-test-"))
# Commands the tests run (python, celery, pyhanko, st) come from the interpreter's own environment,
# also when `make test` calls .venv/bin/python without activating the virtual environment.
os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")

if not os.environ.get("CELERY_BROKER_URL"):
    # The same broker as the embedded default, started for this session and stopped with it (also
    # when pytest is killed: the server gets SIGTERM when this process dies).
    from fxpilot import broker
    from fxpilot.lifetime import die_with_parent

    _data = Path(os.environ["FXPILOT_DATA_DIR"])
    _server = broker.start_child(_data, persistent=False, preexec_fn=die_with_parent())
    os.environ["CELERY_BROKER_URL"] = broker.embedded_url(_data)
    atexit.register(broker.stop_child, _server)
