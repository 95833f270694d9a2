"""The probe looks for vLLM and LMCache in the interpreter the deployment launches vLLM with, not the node's python3."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from runners.probe import launch_python

PROBE = Path(__file__).resolve().parents[2] / "runners" / "remote" / "probe.sh"


def _venv_with_packages(root: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=600)
    site = next((root / "lib").glob("python3*/site-packages"))
    (site / "vllm").mkdir()
    (site / "vllm" / "__init__.py").write_text('__version__ = "0.20.1"\n')
    (site / "lmcache").mkdir()
    (site / "lmcache" / "__init__.py").write_text("")
    (site / "lmcache" / "_version.py").write_text('__version__ = "0.5.6"\n__commit_id__ = "3e11e108"\n')
    return root / "bin" / "python"


def test_the_probe_asks_the_launchers_interpreter_for_vllm_and_lmcache(tmp_path):
    python = _venv_with_packages(tmp_path / "venv")
    out = tmp_path / "out"
    for folder in ("fx", "nvme", "bin"):
        (tmp_path / folder).mkdir()
    # Another vLLM on the PATH (the system's): not the one the deployment launches.
    (tmp_path / "bin" / "vllm").write_text("#!/bin/sh\necho 0.19.0\n")
    (tmp_path / "bin" / "vllm").chmod(0o755)
    subprocess.run(["bash", str(PROBE), "--out", str(out), "--fx-mount", str(tmp_path / "fx"), "--local-path",
                    str(tmp_path / "nvme"), "--fio-size", "1M", "--fio-runtime", "1", "--python", str(python)],
                   capture_output=True, timeout=600,
                   env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)})
    assert (out / "vllm-version.txt").read_text().strip() == "0.20.1"
    found = json.loads((out / "lmcache.json").read_text())
    assert found["installed"] and found["version"] == "0.5.6" and found["commit"] == "3e11e108", found


def test_the_interpreter_comes_from_a_venv_or_a_conda_path_only():
    def launcher(**kw):
        return SimpleNamespace(launcher=SimpleNamespace(**{"kind": "", "venv": None, "conda": None, "prefix": (),
                                                           **kw}))

    assert launch_python(launcher(kind="venv", venv="~/venvs/vllm/")) == "~/venvs/vllm/bin/python"
    assert launch_python(launcher(kind="conda", conda="/opt/conda/envs/rocm")) == "/opt/conda/envs/rocm/bin/python"
    assert launch_python(launcher(kind="conda", conda="rocm")) is None
    assert launch_python(launcher(kind="prefix", prefix=("docker", "run", "img"))) is None
    assert launch_python(launcher()) is None
