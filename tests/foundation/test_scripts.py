"""The shell scripts a new machine runs first: `.ci/run`, `scripts/system-packages`, `scripts/real-engine`.

Each passes shellcheck; the real-engine recipe hash works with its optional constraints file absent (its
failure under `set -euo pipefail` once made every first build exit 1 after building); system-packages waits
for the dpkg/apt lock, saying who holds it, and names the package that cannot be installed.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def shell_scripts() -> list[Path]:
    found = []
    for folder in (ROOT / "scripts", ROOT / ".ci"):
        for path in sorted(folder.iterdir()):
            if path.is_file() and path.read_bytes()[:64].split(b"\n", 1)[0].startswith(b"#!") \
                    and path.read_bytes().split(b"\n", 1)[0].rstrip().endswith((b"bash", b"/sh")):
                found.append(path)
    return found


def test_the_shell_scripts_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in shell_scripts()}
    assert {".ci/run", "scripts/system-packages", "scripts/real-engine"} <= names


@pytest.mark.parametrize("script", shell_scripts(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_shell_script_passes_shellcheck(script):
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.fail("shellcheck is not installed: scripts/system-packages shellcheck (make test installs it)")
    result = subprocess.run([shellcheck, "--severity=info", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# --- scripts/real-engine: the recipe hash and `ready`, on a copy with no constraints file ---

@pytest.fixture
def engine_script(tmp_path):
    """A copy of the script and its connector patch, without the optional constraints file, and an empty engine
    folder for it."""
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    for name in ("real-engine", "real-engine-connector.py"):
        shutil.copy2(ROOT / "scripts" / name, scripts / name)
    assert not (scripts / "real-engine.constraints.txt").exists()
    env = {**os.environ, "FXPILOT_ENGINE_DIR": str(tmp_path / "engine")}
    return scripts / "real-engine", env


def expected_hash(script: Path, constraints: bytes = b"") -> str:
    data = script.read_bytes() + (script.parent / "real-engine-connector.py").read_bytes() + constraints
    return hashlib.sha256(data).hexdigest()[:16]


def test_an_engine_folder_that_was_never_built_is_not_ready(engine_script):
    script, env = engine_script
    assert subprocess.run([str(script), "--check"], env=env).returncode == 1
    path = subprocess.run([str(script), "--path"], env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert path == env["FXPILOT_ENGINE_DIR"]


def test_the_recipe_hash_reads_the_files_that_exist_without_the_constraints_file(engine_script):
    """`ready` holds the recipe's hash, written by the build's last line: with no constraints file the hash is the
    script's and the connector's, and --check accepts exactly it."""
    script, env = engine_script
    folder = Path(env["FXPILOT_ENGINE_DIR"])
    folder.mkdir()
    (folder / "ready").write_text(expected_hash(script) + "\n")
    assert subprocess.run([str(script), "--check"], env=env).returncode == 0
    # An older recipe's environment is not ready: it is rebuilt.
    (folder / "ready").write_text("0123456789abcdef\n")
    assert subprocess.run([str(script), "--check"], env=env).returncode == 1


def test_the_builds_last_line_succeeds_under_the_scripts_own_options_without_constraints(engine_script):
    """The line that ends a first build, `recipe_hash >"$DIR/ready"`, run as the script runs it (its definitions,
    `set -euo pipefail`): it exits 0 and writes the hash --check then accepts."""
    script, env = engine_script
    text = script.read_text()
    definitions = text[text.index("\nHERE="):text.index("\ncase ")]
    folder = Path(env["FXPILOT_ENGINE_DIR"])
    folder.mkdir()
    snippet = f"set -euo pipefail\n{definitions}\nrecipe_hash >\"$DIR/ready\"\necho written\n"
    result = subprocess.run(["bash", "-c", snippet, str(script)], env=env, capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout == "written\n", result.stderr
    assert (folder / "ready").read_text().strip() == expected_hash(script)
    assert subprocess.run([str(script), "--check"], env=env).returncode == 0


def test_a_constraints_file_changes_the_recipe(engine_script):
    script, env = engine_script
    folder = Path(env["FXPILOT_ENGINE_DIR"])
    folder.mkdir()
    (folder / "ready").write_text(expected_hash(script) + "\n")
    (script.parent / "real-engine.constraints.txt").write_bytes(b"numpy==2.2.6\n")
    assert subprocess.run([str(script), "--check"], env=env).returncode == 1
    (folder / "ready").write_text(expected_hash(script, b"numpy==2.2.6\n") + "\n")
    assert subprocess.run([str(script), "--check"], env=env).returncode == 0


def test_a_failed_first_build_leaves_no_partial_folder(engine_script, tmp_path):
    """A build that breaks early (here: an interpreter that cannot make a venv) exits non-zero and removes what
    it began, so the next call starts again."""
    script, env = engine_script
    broken = tmp_path / "python-without-venv"
    broken.write_text("#!/bin/sh\n[ \"$1\" = --version ] && echo 'Python 3.11' && exit 0\necho 'no venv here' >&2\nexit 3\n")
    broken.chmod(0o755)
    result = subprocess.run([str(script)], env={**env, "FXPILOT_ENGINE_PYTHON": str(broken)}, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode != 0
    assert "build failed; removing the partial" in result.stderr
    assert not Path(env["FXPILOT_ENGINE_DIR"]).exists()


# --- scripts/system-packages: the dpkg/apt lock ---

SYSTEM_PACKAGES = ROOT / "scripts" / "system-packages"


class HeldLock:
    """An fcntl write lock on a file, held by another process (as apt-get or dpkg holds theirs) until released."""

    def __init__(self, path: Path):
        path.touch()
        self.proc = subprocess.Popen([sys.executable, "-c", (
            "import fcntl, os, sys\n"
            f"fd = os.open({str(path)!r}, os.O_RDWR)\n"
            "fcntl.lockf(fd, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "sys.stdin.read()\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "held"

    def release(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(600)


def test_system_packages_with_nothing_missing_does_nothing():
    result = subprocess.run([str(SYSTEM_PACKAGES), "bash"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and result.stdout == "" and result.stderr == ""


def test_system_packages_gives_up_on_a_held_lock_naming_it_and_its_holder(tmp_path):
    lock = tmp_path / "lock-frontend"
    held = HeldLock(lock)
    try:
        started = time.monotonic()
        result = subprocess.run([str(SYSTEM_PACKAGES), "fxpilot-no-such-package"], capture_output=True, text=True,
                                timeout=600, env={**os.environ, "FXPILOT_APT_LOCKS": str(lock),
                                                 "FXPILOT_APT_LOCK_WAIT": "2"})
        waited = time.monotonic() - started
    finally:
        held.release()
    assert result.returncode == 1
    assert f"waiting (up to 2 s) for {lock}, held by pid {held.proc.pid}" in result.stderr
    assert f"gave up after 2 s waiting for {lock}" in result.stderr
    assert waited >= 2


@pytest.mark.skipif(os.geteuid() != 0, reason="installs through apt-get, as root")
def test_system_packages_waits_for_the_lock_then_names_the_package_that_failed(tmp_path):
    """The lock is released while the script waits: it goes on to apt-get, which cannot install a package that
    does not exist; the script says which one and why."""
    lock = tmp_path / "lock"
    held = HeldLock(lock)
    proc = subprocess.Popen([str(SYSTEM_PACKAGES), "fxpilot-no-such-package"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "FXPILOT_APT_LOCKS": str(lock), "FXPILOT_APT_LOCK_WAIT": "120"})
    time.sleep(2)
    assert proc.poll() is None, "it did not wait for the held lock"
    held.release()
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 1
    assert "waiting (up to 120 s)" in err
    assert "fxpilot-no-such-package: this machine's package lists do not know it" in err
    assert "Unable to locate package fxpilot-no-such-package" in err
