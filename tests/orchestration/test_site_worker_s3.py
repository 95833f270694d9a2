"""A site worker that shares only the database, the broker and the object store with the web tier.

The site worker runs with a data folder of its own (as on a jump host); the control worker (evaluate,
report) runs beside the web tier. Every artifact and report of a whole G1 lands in SeaweedFS, nothing in
either data folder, and the report read back from the store verifies.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings as django_settings

from gates.models import Report
from runners.artifacts import read_artifact
from runners.models import Status
from runners.orchestration import start_gate_run, wait_for
from tests.orchestration.conftest import FAST_RUN, Worker, purge
from tests.orchestration.test_gate_runs import explain
from tests.storage.conftest import s3_evidence, seaweedfs  # noqa: F401

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.mark.skipif(not django_settings.CELERY_BROKER_URL.startswith("redis"),
                    reason="two data folders need a broker outside them (Redis)")
def test_a_g1_run_keeps_every_artifact_and_report_in_the_object_store(cluster, sim_site, s3_evidence, tmp_path):  # noqa: F811
    web_data = Path(django_settings.DATA_DIR)
    site_data = tmp_path / "jump-host-data"
    site_data.mkdir()
    env = {**cluster.environment, **s3_evidence.env}
    control = cluster.worker("control", [cluster.control])
    control.stop()  # started again with the store's settings below
    purge([cluster.control, sim_site.site.queue])
    workers = [Worker("control-s3", [cluster.control], env, tmp_path).start(),
               Worker("site", [sim_site.site.queue], {**env, "FXPILOT_DATA_DIR": str(site_data),
                                                      "SECRET_KEY": django_settings.SECRET_KEY}, tmp_path).start()]
    try:
        job = start_gate_run(sim_site.pilot.gate(1), sim_site.people.alice, site=sim_site.site, params=FAST_RUN)
        job = wait_for(job, 300)
        logs = "\n".join(w.text()[-4000:] for w in workers)
        assert job.status in (Status.SUCCESSFUL, Status.FAILED), explain(job, cluster) + logs
        keys = set(s3_evidence.keys())
        artifacts = list(job.artifacts.all())
        assert artifacts and all(a.storage_name in keys for a in artifacts)
        assert not [a.name for a in artifacts if (web_data / a.storage_name).exists() or (site_data / a.storage_name).exists()]
        assert all(read_artifact(a) for a in artifacts if a.size)
        report = Report.objects.get(gate__pilot=sim_site.pilot, gate__number=1)
        assert report.path in keys and not (web_data / report.path).exists()
        from gates.reports.service import report_bytes, verify_report_bytes

        assert verify_report_bytes(report_bytes(report)).ok
    finally:
        for worker in workers:
            worker.stop()
