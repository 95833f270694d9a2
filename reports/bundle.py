"""The reproduction bundle ("R8"): everything a third party needs to rerun the gates and check the figures.

A .tar.gz holding the workload client, the orchestration scripts shipped to nodes, the judge (pure
Python: pandas, numpy, PyYAML), the signed plan, the rendered configs and every raw artifact of every
gate run, the stored verdicts, the signed reports, and a manifest with the SHA-256 of every file.
"""
from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time
from pathlib import Path

from django.conf import settings

from gates.judge import canonical_json
from gates.models import Evaluation, Pilot
from reports.service import ReportError, report_bytes
from runners.artifacts import read_artifact

ROOT = Path(settings.BASE_DIR)
SHIPPED = {
    # lmcache_inspect.py is read by probe.sh and deploy.sh from beside them: it travels with the scripts
    "client": sorted(p for p in (ROOT / "runners" / "remote").glob("*.py") if p.name != "lmcache_inspect.py"),
    "scripts": sorted((ROOT / "runners" / "remote").glob("*.sh")) + sorted((ROOT / "runners" / "remote").glob("*.tmpl"))
    + [ROOT / "runners" / "remote" / "lmcache_inspect.py"],
    "judge/gates": [ROOT / "gates" / "plan.py", ROOT / "gates" / "sizing.py"],  # sizing: KV bytes per token (tiers)
    "judge/gates/judge": sorted((ROOT / "gates" / "judge").glob("*.py")),
    # the judge's trace oracle (G4's fidelity, strata and capacity check): numpy and the standard library only
    "judge/gates/traces": sorted((ROOT / "gates" / "traces").glob("*.py")),
}
JUDGE_REQUIREMENTS = ("pandas", "numpy", "PyYAML")

JUDGE_CLI = '''"""Run the fxpilot judge on files, as `manage.py judge` does, without Django.

    python3 judge/fxjudge.py --plan plan/plan.json --gate G3 FILE...
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gates.judge import RecordError, canonical_json, evaluate  # noqa: E402
from gates.plan import PlanError, load_plan  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("files", nargs="+")
parser.add_argument("--plan", required=True)
parser.add_argument("--gate", required=True)
args = parser.parse_args()
try:
    print(canonical_json(evaluate(load_plan(args.plan), args.gate, args.files)))
except (PlanError, RecordError) as error:
    sys.exit(f"fxjudge: {error}")
'''


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in JUDGE_REQUIREMENTS}


class Bundle:
    def __init__(self) -> None:
        self.buffer = io.BytesIO()
        self.tar = tarfile.open(fileobj=self.buffer, mode="w:gz")  # noqa: SIM115 - closed in finish()
        self.manifest: dict[str, dict] = {}

    def add(self, name: str, data: bytes, *, mode: int = 0o644) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mtime = int(time.time())
        info.mode = mode
        self.tar.addfile(info, io.BytesIO(data))
        self.manifest[name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}

    def finish(self, prefix: str) -> bytes:
        listing = "".join(f"{entry['sha256']}  {name.removeprefix(prefix + '/')}\n" for name, entry in sorted(self.manifest.items()))
        manifest = json.dumps({"schema": "fxpilot.bundle/1", "files": self.manifest}, indent=2, sort_keys=True).encode()
        self.add(f"{prefix}/SHA256SUMS", listing.encode())
        self.add(f"{prefix}/manifest.json", manifest)
        self.tar.close()
        return self.buffer.getvalue()


def build_bundle(pilot: Pilot) -> tuple[str, bytes]:
    """(file name, .tar.gz bytes) of the pilot's reproduction bundle."""
    prefix = f"fxpilot-bundle-{str(pilot.code)[:8]}"
    bundle = Bundle()
    simulated = False
    for folder, paths in SHIPPED.items():
        for path in paths:
            bundle.add(f"{prefix}/{folder}/{path.name}", path.read_bytes(), mode=0o755 if path.suffix == ".sh" else 0o644)
    bundle.add(f"{prefix}/judge/gates/__init__.py", b"")
    bundle.add(f"{prefix}/judge/fxjudge.py", JUDGE_CLI.encode())
    bundle.add(f"{prefix}/judge/requirements.txt", "".join(f"{k}=={v}\n" for k, v in _versions().items()).encode())
    plan = pilot.signed_plan
    if plan is not None:
        bundle.add(f"{prefix}/plan/plan.json", json.dumps(plan.to_plan().to_dict(), indent=2, ensure_ascii=False).encode())
    gates_done = []
    evaluations = Evaluation.objects.filter(gate__pilot=pilot, job__isnull=False).select_related("gate", "job", "plan_version")
    latest: dict[int, Evaluation] = {}
    for evaluation in evaluations.order_by("created", "id"):
        latest[evaluation.gate.number] = evaluation
    for number, evaluation in sorted(latest.items()):
        folder = f"{prefix}/gates/G{number}"
        job = evaluation.job
        for artifact in job.artifacts.order_by("name"):
            bundle.add(f"{folder}/artifacts/{artifact.name}", read_artifact(artifact))
            simulated |= artifact.simulated
        bundle.add(f"{folder}/inputs.txt", "".join(f"{name}\n" for name in sorted(evaluation.inputs)).encode())
        bundle.add(f"{folder}/verdict.json", canonical_json(evaluation.result).encode())
        if evaluation.plan_version_id != getattr(plan, "pk", None):
            bundle.add(f"{folder}/plan.json", json.dumps(evaluation.plan_version.to_plan().to_dict(), indent=2,
                                                         ensure_ascii=False).encode())
        gates_done.append((number, evaluation))
    for report in pilot.reports.order_by("created"):
        try:
            bundle.add(f"{prefix}/reports/{report.path.rsplit('/', 1)[-1]}", report_bytes(report))
        except ReportError:
            continue  # a report missing from the store is not shipped (the bundle's manifest lists what is)
    bundle.add(f"{prefix}/README.md", _readme(pilot, gates_done, simulated).encode())
    return f"{prefix}.tar.gz", bundle.finish(prefix)


def _readme(pilot: Pilot, gates_done: list[tuple[int, Evaluation]], simulated: bool) -> str:
    rows = "\n".join(f"| G{n} | {e.verdict} | `gates/G{n}/verdict.json` | {len(e.inputs)} |" for n, e in gates_done) or "| — | no gate judged yet | | |"
    warning = ("\n> **SIMULATION.** These artifacts come from fxpilot's simulated GPU nodes, not from real hardware. "
               "They show how the test works; they are not evidence about any cluster.\n") if simulated else ""
    requirements = " ".join(f"{k}=={v}" for k, v in _versions().items())
    return f"""# Reproduction bundle — {pilot.name}
{warning}
This bundle lets a third party check every figure of the pilot's reports and rerun the gates on
their own cluster. Every file is listed with its SHA-256 in `SHA256SUMS` and `manifest.json`.

| gate | stored verdict | verdict file | judged inputs |
|---|---|---|---|
{rows}

## 1. Check the files
```sh
sha256sum -c SHA256SUMS
```

## 2. Check the figures with the judge
The judge is plain Python (`judge/`). In a fresh virtual environment:
```sh
python3 -m venv .venv && .venv/bin/pip install {requirements}
cd gates/G3/artifacts
../../../.venv/bin/python ../../../judge/fxjudge.py --plan ../../../plan/plan.json --gate G3 $(cat ../inputs.txt) > ../verdict.replayed.json
cd .. && cmp verdict.json verdict.replayed.json && echo "G3 verdict reproduced bit for bit"
```
Do the same for each gate folder. A gate whose folder holds its own `plan.json` was judged on that
(earlier) plan version: pass that file to `--plan` instead. The judge reads `fxpilot.request/1` records (one
JSON line per request; the schema is in the project's docs/contracts.md), LMCache retrieval
records, phase summaries and node inventories; `vllm bench serve --save-result --save-detailed`
JSON is accepted too, so records from your own client can be judged the same way.

## 3. Rerun the gates on your own cluster
- `scripts/probe.sh` collects the node inventory (GPUs, ROCm, vLLM/LMCache versions, RoCE link, NVMe-oF namespace, fio).
- `scripts/attach_fx.sh` connects the FX namespace over NVMe-oF (RDMA) and mounts it; `scripts/deploy.sh` renders the
  LMCache configuration per arm (`recompute`, `local_nvme`, `fx`) and starts `vllm serve` with the LMCache connector
  (see the rendered configs under `gates/*/artifacts/*/`); `scripts/detach.sh` runs a command detached.
- `client/workload.py` (Python 3 standard library only) runs the long-context cold-recovery workload and the G2/G4
  modes against any OpenAI-compatible server and writes `fxpilot.request/1` records: `python3 client/workload.py --help`.
- Judge your records with step 2 and the signed plan in `plan/plan.json`.

## 4. Check the signed reports
`reports/` holds the signed PDF reports (PAdES). Any PDF signature validator can check them, e.g.
`pdfsig reports/<file>.pdf` (read its output: "Signature is Valid" and "Total document signed"), or
`pyhanko sign validate --trust <vendor root certificate> --trust-replace reports/<file>.pdf`.
"""
