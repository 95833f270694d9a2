"""The production layout on one machine: the web tier and the customer's network apart (Linux network namespaces).

The web tier — this test process (the portal's code), PostgreSQL, Redis, SeaweedFS and the control worker —
stays in the machine's own network. A namespace is the customer's network: the simulated GPU nodes and the
site worker live there, and the web tier's data folder is covered by an empty file system in the worker's
view. The worker reaches PostgreSQL, Redis and the S3 store through one link to the web tier; the portal
cannot reach the nodes. A gate run still completes, every artifact and report is in the object store, and
the reports read back from it verify.
"""
from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.conf import settings as django_settings
from django.db import connection

from gates.models import Report
from runners import ssh
from runners.artifacts import read_artifact
from runners.models import Node, Site, Status
from runners.orchestration import start_gate_run, wait_for
from tests.orchestration.conftest import FAST_RUN, ROOT, Worker, database_url, purge
from tests.orchestration.test_gate_runs import explain
from tests.storage.seaweed import SeaweedFS
from tests.topology.netns import CustomerNetwork, available

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=str(available())),
              pytest.mark.skipif(connection.vendor != "postgresql" or not django_settings.CELERY_BROKER_URL.startswith("redis"),
                                 reason="the customer network reaches PostgreSQL and Redis over the network")]


def _until(condition, timeout: float, why) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(why())
        time.sleep(0.2)


class NamespacedWorker(Worker):
    """A Celery worker inside the customer network, the web tier's data folder hidden from it."""

    def __init__(self, net: CustomerNetwork, hide: list[str], *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.net, self.hide = net, hide

    def start(self) -> NamespacedWorker:
        argv = [sys.executable, "-m", "celery", "-A", "fxpilot", "worker", "-Q", ",".join(self.queues), "-c",
                str(self.concurrency), "-P", "prefork", "-n", f"{self.name}@%h", "-l", "INFO", "--without-gossip",
                "--without-mingle", "--without-heartbeat"]
        self.proc = subprocess.Popen(self.net.argv(argv, hide=self.hide), cwd=ROOT, env=self.env,
                                     stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)
        _until(lambda: " ready." in self.text() or self.proc.poll() is not None, 90, self.text)
        if self.proc.poll() is not None:
            raise RuntimeError(f"worker {self.name} exited:\n{self.text()[-3000:]}")
        return self


def test_a_gate_run_with_the_portal_and_the_site_worker_on_two_networks(cluster, signed_pilot, settings, tmp_path):
    web_data = str(Path(django_settings.DATA_DIR).resolve())
    site_data = tmp_path / "jump-host"
    site_data.mkdir()
    started = []
    with CustomerNetwork() as net:
        db = connection.settings_dict
        pg_port = net.forward(int(db["PORT"] or 5432), db["HOST"] or "127.0.0.1")
        broker = urlsplit(django_settings.CELERY_BROKER_URL)
        redis_port = net.forward(broker.port or 6379, broker.hostname or "127.0.0.1")
        store = SeaweedFS(tmp_path / "s3", host=net.web_address).start()
        started.append(store)
        settings.STORAGES = {**settings.STORAGES, "evidence": store.evidence_storage}
        try:
            url = urlsplit(database_url())
            customer_db = url._replace(netloc=f"{url.netloc.rsplit('@', 1)[0]}@{net.web_address}:{pg_port}").geturl()
            common = {**cluster.environment, **store.env, "SECRET_KEY": django_settings.SECRET_KEY}
            customer = {**common, "DATABASE_URL": customer_db, "FXPILOT_DATA_DIR": str(site_data),
                        "CELERY_BROKER_URL": f"redis://{net.web_address}:{redis_port}{broker.path}"}
            pilot = signed_pilot.pilot
            site = Site.objects.create(pilot=pilot, name="customer network", queue=f"site-cust-{uuid.uuid4().hex[:6]}")
            purge([cluster.control, site.queue])

            sim_log = tmp_path / "simnode.log"
            simnode = subprocess.Popen(net.argv([sys.executable, "manage.py", "simnode", "--nodes", "2", "--dir",
                                                 str(tmp_path / "nodes"), "--register-site", str(site.code),
                                                 "--accept-host-keys", "--time-scale", str(FAST_RUN["time_scale"])],
                                                hide=[web_data]),
                                       cwd=ROOT, env=customer, stdout=open(sim_log, "ab"), stderr=subprocess.STDOUT,
                                       start_new_session=True)
            started.append(simnode)
            _until(lambda: Node.objects.filter(site=site, host_key_state=Node.HostKeyState.ACCEPTED).count() == 2
                   or simnode.poll() is not None, 90, lambda: sim_log.read_text(errors="replace")[-3000:])
            nodes = list(site.nodes.order_by("name"))
            assert len(nodes) == 2, sim_log.read_text(errors="replace")[-3000:]

            # The portal's network cannot reach the nodes, and the worker's view of the web data folder is empty.
            for node in nodes:
                with pytest.raises(ssh.Unreachable):
                    ssh.connect(node)
            seen = net.run(["unshare", "--mount", "--", "sh", "-c",
                            f"mount -t tmpfs -o size=1m,mode=000 hidden {web_data} && ls -A {web_data}"],
                           capture_output=True, text=True)
            assert seen.returncode == 0 and seen.stdout == "", seen.stderr

            site_worker = NamespacedWorker(net, [web_data], "site", [site.queue], customer, tmp_path).start()
            started.append(site_worker)
            control = Worker("control", [cluster.control], common, tmp_path).start()
            started.append(control)

            # Evidence is content-addressed: a blob the suite's earlier runs left in the web data folder has the
            # same name as this run's; only a file that appears during this run would betray a local write.
            before = {path for root in (Path(web_data), site_data) if root.exists() for path in root.rglob("*")}
            job = start_gate_run(pilot.gate(1), signed_pilot.alice, site=site, params=FAST_RUN)
            job = wait_for(job, 360)
            logs = "\n".join(w.text()[-3000:] for w in (site_worker, control))
            assert job.status in (Status.SUCCESSFUL, Status.FAILED), explain(job, cluster) + logs
            keys = set(store.keys())
            artifacts = list(job.artifacts.all())
            assert {"node1/inventory.json", "node2/inventory.json"} <= {a.name for a in artifacts}
            assert all(a.storage_name in keys for a in artifacts)
            assert not [a.name for a in artifacts
                        for path in (Path(web_data) / a.storage_name, site_data / a.storage_name)
                        if path.exists() and path not in before]
            assert all(read_artifact(a) is not None for a in artifacts)
            from gates.reports.service import report_bytes, verify_report_bytes

            reports = list(Report.objects.filter(pilot=pilot))
            assert reports and all(r.path in keys and verify_report_bytes(report_bytes(r)).ok for r in reports)
        finally:
            for proc in reversed(started):
                if isinstance(proc, subprocess.Popen):
                    import os
                    import signal

                    if proc.poll() is None:
                        os.killpg(proc.pid, signal.SIGTERM)
                        try:
                            proc.wait(timeout=15)
                        except subprocess.TimeoutExpired:
                            os.killpg(proc.pid, signal.SIGKILL)
                else:
                    proc.stop()
