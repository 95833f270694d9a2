"""Portal fixtures: the demo people plus erin (vendor lead only) and dave (customer viewer), and a pilot
with a site, nodes, a credential, a G1 run with output and an artifact, a pass verdict and a report."""

from __future__ import annotations

import hashlib
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import cache

from gates import lifecycle
from gates.models import Evaluation, Report, Role


@contextmanager
def report_work_here():
    """What of a report's work (a job carried out, a countersignature added) ran in THIS process while the block ran:
    the test client's requests and the live server's run here, workers are processes of their own. A request that
    leaves the work to a worker records nothing, however long the machine takes to answer it (issue 47: it was a
    wall-clock bound of 5 s on the request)."""
    from reports import service

    ran: list[str] = []
    with mock.patch.object(service, "carry_out", side_effect=lambda *a, **k: ran.append("carry_out")), \
            mock.patch.object(service, "countersign", side_effect=lambda *a, **k: ran.append("countersign")):
        yield ran


@pytest.fixture(autouse=True)
def _fresh_throttle():
    cache.clear()
    yield
    cache.clear()


def private_key_text() -> str:
    key = ed25519.Ed25519PrivateKey.generate()
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()


def verdict(gate: int = 1, result: str = "pass") -> dict:
    return {
        "schema": "fxpilot.verdict/1",
        "gate": gate,
        "verdict": result,
        "plan_sha256": "0" * 64,
        "simulated": True,
        "validity": {"valid": True, "checks": [{"name": "enough requests", "ok": True, "detail": "96 ≥ 32"}]},
        "criteria": [
            {
                "key": "g1-ttft-cv",
                "description": "Baseline TTFT is stable",
                "description_zh": "基线首字延迟稳定",
                "metric": "ttft",
                "statistic": "cv",
                "comparison": "absolute",
                "op": "<=",
                "threshold": 0.1,
                "unit": "fraction",
                "verdict": result,
                "value": 0.04,
                "ci": [0.03, 0.05],
                "n": 48,
                "cells": [
                    {
                        "concurrency": 16,
                        "value": 0.04,
                        "ci": [0.03, 0.05],
                        "candidate_value": 0.04,
                        "baseline_value": None,
                        "n_candidate": 48,
                        "n_baseline": 0,
                        "verdict": result,
                    }
                ],
                "rule": "pass: the whole 95 % interval [0.030, 0.050] clears ≤ 0.100",
                "explanation": "recompute TTFT p50 coefficient of variation 4.0 % across 3 repetitions",
            }
        ],
        "metrics": [
            {
                "arm": "recompute",
                "phase": "measure",
                "concurrency": level,
                "repetition": 1,
                "n": 16,
                "n_ok": 16,
                "ttft_p50": 1.5 * level / 8,
                "throughput": 40.0 * level / 8,
            }
            for level in (8, 16)
        ],
        "distributions": {"recompute@16": [2.0 + 0.05 * q for q in range(21)]},
        "inputs": {},
    }


def add_person(username: str, organisation, role: str):
    user = get_user_model().objects.create_user(
        username, f"{username}@example.test", "pw-" + username, first_name=username.title()
    )
    lifecycle.add_member(user, organisation, role)
    return user


def add_lab(demo, fingerprint: str):
    """A site, a credential and a simulated node whose host key (with this fingerprint) waits for acceptance."""
    from runners.credentials import create_credential
    from runners.models import Node, Site

    site = Site.objects.create(pilot=demo.pilot, name="Lab", queue=f"lab-{demo.pilot.pk}")
    credential = create_credential(site, "lab key", private_key_text(), created_by=demo.alice)
    node = Node.objects.create(
        site=site, name="node1", host="127.0.0.1", port=2222, username="fx", credential=credential, simulated=True
    )
    Node.objects.filter(pk=node.pk).update(
        host_key_state=Node.HostKeyState.PENDING,
        pending_host_key_type="ssh-ed25519",
        pending_host_key="AAAAC3NzaC1lZDI1NTE5AAAAIExample",
        pending_host_key_fingerprint=fingerprint,
    )
    node.refresh_from_db()
    return site, credential, node


def build_world(demo) -> SimpleNamespace:
    """The demo pilot signed by both parties, with everything a page can show."""
    from runners import artifacts, output
    from runners.models import Job, Status, Step

    pilot = demo.pilot
    demo.erin = add_person("erin", pilot.vendor, Role.VENDOR_LEAD)
    demo.dave = add_person("dave", pilot.customer, Role.VIEWER)
    version = pilot.latest_plan
    lifecycle.sign_plan(version, demo.alice)
    lifecycle.sign_plan(version, demo.bob)
    pilot.refresh_from_db()
    site, credential, node = add_lab(demo, "SHA256:examplefingerprint")
    gate = pilot.gate(1)
    job = Job.objects.create(pilot=pilot, gate=gate, site=site, created_by=demo.alice, params={"time_scale": 0.01})
    step = Step.objects.create(job=job, seq=1, name="probe", node=node, status=Status.SUCCESSFUL)
    output.append_output(job, "probing node1\n", step=step)
    output.system_line(job, "probe done")
    artifact = artifacts.store_bytes(
        job, "node1/probe/amd-smi.json", b'{"gpus": 8}', kind="probe", step=step, node=node, simulated=True
    )
    evaluation = Evaluation.objects.create(
        gate=gate, job=job, plan_version=pilot.signed_plan, verdict="pass", result=verdict(), simulated=True
    )
    lifecycle.record_verdict(gate, evaluation)
    relative = Path("reports") / str(pilot.code) / "fixture.pdf"
    (Path(settings.DATA_DIR) / relative).parent.mkdir(parents=True, exist_ok=True)
    report_data = b"%PDF-1.7\n% fixture report\n"
    (Path(settings.DATA_DIR) / relative).write_bytes(report_data)
    report = Report.objects.create(
        pilot=pilot,
        gate=gate,
        evaluation=evaluation,
        kind=Report.Kind.GATE,
        path=str(relative),
        sha256=hashlib.sha256(report_data).hexdigest(),
        size=len(report_data),
        simulated=True,
    )
    gate.refresh_from_db()
    from gates.models import UploadVerification

    verification = UploadVerification.objects.create(requested_by=demo.alice, filename="r.pdf", sha256="0" * 64,
                                                      path="none", state=UploadVerification.State.ERROR,
                                                      error="a fixture row: nothing was uploaded")
    from gates.models import ReportJob

    report_job = ReportJob.objects.create(kind=ReportJob.Kind.COUNTERSIGN, pilot=pilot, report_kind=Report.Kind.GATE,
                                          gate=gate, evaluation=evaluation, source=report, sha256=report.sha256,
                                          requested_by=demo.bob, state=ReportJob.State.STALE, result=report,
                                          error="a decision or an evaluation was recorded after it was made",
                                          reason={"template": "a decision or an evaluation was recorded after it "
                                                              "was made", "values": {}})
    from runners import traces

    trace = traces.upload(pilot.gate(4), b"session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\n"
                          + b"".join(f"s{i},1,{20000 + 1000 * i},100,{i}.0\n".encode() for i in range(8)),
                          "customer-trace.csv", demo.bob, "customer")
    from gates.models import ApiToken

    token, _ = ApiToken.issue(demo.alice, "tenancy walk")  # alice's own: revoking it is hers alone
    return SimpleNamespace(
        **vars(demo),
        token=token,
        verification=verification,
        report_job=report_job,
        trace=trace,
        site=site,
        node=node,
        credential=credential,
        job=job,
        step=step,
        artifact=artifact,
        evaluation=evaluation,
        report=report,
        gate=gate,
    )


@pytest.fixture
def world(demo) -> SimpleNamespace:
    return build_world(demo)


# The browser test's full flow drives real simulated nodes and real workers with the runner engineers' fixtures.
from tests.orchestration.conftest import cluster, fast_settings  # noqa: E402, F401
from tests.runners.conftest import simnodes, user_key  # noqa: E402, F401
