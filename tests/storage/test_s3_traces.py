"""The customer's G4 trace in the S3 store: uploaded by the web tier, read back hashed by run creation and by the
worker that replays it, which sees nothing of the web tier's disk."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from runners import traces
from runners.models import Node, Site
from runners.orchestration import start_gate_run
from runners.steps import _trace
from tests.orchestration.conftest import open_gate
from tests.reports.test_traces import GOOD

pytestmark = pytest.mark.django_db


def test_the_trace_goes_to_the_bucket_and_the_worker_reads_it_from_there(s3_evidence, signed_pilot, settings,
                                                                          tmp_path):
    gate = signed_pilot.pilot.gate(4)
    trace = traces.upload(gate, GOOD + tmp_path.name.encode() + b",1,10,1,9\n", "ours.csv", signed_pilot.bob,
                          "customer")
    assert trace.path == f"traces/{signed_pilot.pilot.code}/{trace.sha256}.csv" and trace.path in s3_evidence.keys()
    assert not (Path(settings.DATA_DIR) / trace.path).exists()  # nothing on the web tier's disk
    data = traces.read(trace)

    site = Site.objects.create(pilot=signed_pilot.pilot, name="site1", queue="q-site1")
    Node.objects.create(site=site, name="node1", host="127.0.0.1", username="fxpilot", simulated=True)
    open_gate(signed_pilot.pilot, 4, signed_pilot)
    job = start_gate_run(gate, signed_pilot.alice, site=site)
    kept = job.artifacts.get(kind="trace")
    assert kept.sha256 == trace.sha256 and kept.storage_name in s3_evidence.keys()
    # The worker on the customer's side: another data folder, the same database and store.
    settings.DATA_DIR = tmp_path / "jump-host"
    assert _trace(SimpleNamespace(job=job))[0] == data

    s3_evidence.client().put_object(Bucket="fxpilot-evidence", Key=trace.path, Body=b"altered")
    with pytest.raises(traces.TraceRefused, match="no longer hashes"):
        traces.read(trace)
