"""Loaded by pytest before Django (pytest.ini: -p tests.envsetup): tests get their own data folder."""
import os
import tempfile

os.environ.setdefault("FXPILOT_ENV", "test")
os.environ.setdefault("FXPILOT_DATA_DIR", tempfile.mkdtemp(prefix="fxpilot-test-"))
