"""Loaded by pytest before Django (pytest.ini: -p tests.envsetup): tests get their own data folder."""
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("FXPILOT_ENV", "test")
os.environ.setdefault("FXPILOT_DATA_DIR", tempfile.mkdtemp(prefix="fxpilot-test-"))
# Commands the tests run (python, celery, pyhanko, st) come from the interpreter's own environment,
# also when `make test` calls .venv/bin/python without activating the virtual environment.
os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
