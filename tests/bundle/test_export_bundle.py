"""The reproduction bundle unpacks, its manifest re-hashes, and its README's judge command reproduces the verdicts."""
from __future__ import annotations

import hashlib
import io
import json
import re
import subprocess
import sys
import tarfile

import pytest
from django.core.management import call_command

from gates.judge import synthetic
from runners.artifacts import store_bytes
from runners.evaluation import evaluate_job
from runners.models import Job

KINDS = {"records.jsonl": "records", "records.summary.json": "phase-summary", "retrieve.jsonl": "retrieve"}


@pytest.fixture
def judged_pilot(signed_pilot):
    pilot = signed_pilot.pilot
    gate = pilot.gate(1)
    job = Job.objects.create(pilot=pilot, gate=gate)
    for name, data in synthetic.gate_inputs(1):
        store_bytes(job, name, data, kind=KINDS.get(name, "inventory"), simulated=True)
    store_bytes(job, "node1/recompute/lmcache.yaml", b"chunk_size: 256\n", kind="config", simulated=True)
    evaluation = evaluate_job(job)
    return pilot, evaluation


def _unpack(path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_the_bundle_holds_client_scripts_judge_plan_artifacts_and_a_manifest(judged_pilot, tmp_path):
    pilot, evaluation = judged_pilot
    out = io.StringIO()
    call_command("export_bundle", str(pilot.code), "--output", str(tmp_path), stdout=out)
    path = out.getvalue().strip()
    files = _unpack(path)
    prefix = path.rsplit("/", 1)[-1].removesuffix(".tar.gz")
    names = {name.removeprefix(prefix + "/") for name in files}
    assert {"README.md", "SHA256SUMS", "manifest.json", "client/workload.py", "scripts/deploy.sh", "scripts/probe.sh",
            "judge/fxjudge.py", "judge/gates/plan.py", "plan/plan.json", "gates/G1/verdict.json",
            "gates/G1/artifacts/node1/recompute/lmcache.yaml", "gates/G1/artifacts/records.jsonl"} <= names
    # probe.sh and deploy.sh read the LMCache lookup from beside them: it travels with the scripts, once
    assert "scripts/lmcache_inspect.py" in names and "client/lmcache_inspect.py" not in names
    for line in files[f"{prefix}/SHA256SUMS"].decode().splitlines():
        digest, name = line.split("  ", 1)
        assert hashlib.sha256(files[f"{prefix}/{name}"]).hexdigest() == digest, name
    manifest = json.loads(files[f"{prefix}/manifest.json"])
    assert manifest["files"][f"{prefix}/gates/G1/artifacts/records.jsonl"]["sha256"] == evaluation.inputs["records.jsonl"]
    assert "SIMULATION" in files[f"{prefix}/README.md"].decode()


def test_the_judge_run_from_the_readme_reproduces_the_stored_verdict(judged_pilot, tmp_path):
    pilot, evaluation = judged_pilot
    out = io.StringIO()
    call_command("export_bundle", str(pilot.code), "--output", str(tmp_path), stdout=out)
    with tarfile.open(out.getvalue().strip()) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    root = next((tmp_path / "unpacked").iterdir())
    readme = (root / "README.md").read_text()
    command = re.search(r"\.\./\.\./\.\./\.venv/bin/python (.+?) > \.\./verdict\.replayed\.json", readme).group(1)
    command = command.replace("G3", "G1")
    work = root / "gates" / "G1" / "artifacts"
    result = subprocess.run(f"{sys.executable} {command}", shell=True, cwd=work, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (root / "gates" / "G1" / "verdict.json").read_text()
    assert json.loads(result.stdout)["verdict"] == evaluation.verdict
