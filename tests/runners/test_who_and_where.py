"""Pages say who did what and where: a run started from the command line names it, a host key accepted from
the command line too, a node without GPUs says so, each line of parallel steps says its node and step, and the
workload command is logged once, exactly as run."""
from __future__ import annotations

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone, translation

from gates.management.lookup import command_line_actor
from portal.views.runs import log_html
from runners.management.commands.run_gate import follow_job
from runners.models import Job, Node, Site, Step
from runners.output import append_output, system_line
from runners.progress import log_since
from runners.steps import once


@pytest.fixture(autouse=True)
def english_afterwards():
    """A page request activates its reader's language for the thread; the next test starts in English again."""
    yield
    translation.activate("en")


def _site(pilot, nodes=2) -> Site:
    site = Site.objects.create(pilot=pilot, name="site1", queue="q-site1")
    for i in range(1, nodes + 1):
        Node.objects.create(site=site, name=f"node{i}", host="127.0.0.1", username="fxpilot", simulated=True)
    return site


def test_a_run_started_from_the_command_line_says_so_on_its_pages(signed_pilot, client):
    _site(signed_pilot.pilot, 1)
    call_command("run_gate", str(signed_pilot.pilot.code)[:8], "G1", "--no-follow", stdout=open("/dev/null", "w"))
    job = Job.objects.get()
    assert job.created_by is None and job.created_by_label == command_line_actor()
    assert command_line_actor().startswith("command line (") and "@" in command_line_actor()
    client.force_login(signed_pilot.carol)
    where = command_line_actor().removeprefix("command line (").removesuffix(")")
    page = client.get(reverse("run", args=[job.code])).content.decode()
    assert f"Started by command line ({where})" in page and "Started by —" not in page
    gate_page = client.get(reverse("gate", args=[signed_pilot.pilot.code, 1])).content.decode()
    assert f"command line ({where})" in gate_page
    client.post(reverse("set_language"), {"language": "zh-hans", "next": "/"})
    page = client.get(reverse("run", args=[job.code])).content.decode()
    assert f"命令行（{where}）" in page
    # The gate's history in its reports names the command line too.
    from reports.context import gate_history

    assert [e["who"] for e in gate_history(signed_pilot.pilot.gate(1)) if e["kind"] == "run"] == [command_line_actor()]


def test_the_node_page_never_says_none(demo, client):
    node = _site(demo.pilot, 1).nodes.get()
    node.host_key_state = Node.HostKeyState.ACCEPTED
    node.host_key_fingerprint = "SHA256:abc"
    node.host_key_accepted_at = timezone.now()
    node.inventory = {"gpus": {"count": 0, "model": None, "memory_gb": None, "arch": None, "devices": []}}
    node.save()
    client.force_login(demo.alice)
    page = client.get(reverse("node", args=[node.code])).content.decode()
    assert "None" not in page
    assert "none found by the probe" in page and "by whom was not recorded" in page
    node.host_key_accepted_label = "command line (ops@jump1)"
    node.inventory["gpus"] = {"count": 8, "model": None, "devices": []}
    node.save()
    page = client.get(reverse("node", args=[node.code])).content.decode()
    assert "None" not in page and "accepted by command line (ops@jump1)" in page and "8 × —" in page
    client.post(reverse("set_language"), {"language": "zh-hans", "next": "/"})
    page = client.get(reverse("node", args=[node.code])).content.decode()
    assert "命令行（ops@jump1）" in page and "None" not in page
    # Simulated nodes say so in words a person reads, on the node and the sites page alike.
    assert "模拟 — 非证据" in page
    sites = client.get(reverse("sites", args=[demo.pilot.code])).content.decode()
    assert "simulated: true" not in sites and "simulated: true" not in page


def test_each_line_of_parallel_steps_carries_its_node_and_step(signed_pilot):
    site = _site(signed_pilot.pilot)
    node1, node2 = site.nodes.order_by("name")
    job = Job.objects.create(pilot=signed_pilot.pilot, gate=signed_pilot.pilot.gate(1), site=site)
    a = Step.objects.create(job=job, seq=1, name="measure", node=node1, arm="fx")
    b = Step.objects.create(job=job, seq=2, name="measure", node=node2, arm="local_nvme")
    system_line(job, "run started")
    append_output(job, "a1\na2 par", step=a)          # a's second line is cut by the poll
    append_output(job, "b1\n", step=b)
    append_output(job, "t of a2\na3\n", step=a)       # the rest of a's line, then a new one
    system_line(job, "step 1 measure [fx] on node1: done", step=a)
    chunks = log_since(job, 0)
    assert [c.label for c in chunks] == ["", "node1 measure/fx", "node2 measure/local_nvme", "node1 measure/fx", ""]
    assert [c.continues for c in chunks] == [False, False, False, True, False]
    html = str(log_html(chunks))
    assert html.count('<span class="lbl">node1 measure/fx</span>') == 3  # a1, a2, a3 — not the continuation
    assert html.count('<span class="lbl">node2 measure/local_nvme</span>') == 1
    # A reader that starts after the cut still knows the chunk continues a line.
    assert log_since(job, 3)[0].continues
    job.status = "successful"
    job.save(update_fields=["status"])
    lines = []
    follow_job(job, lines.append, every=0)
    text = "\n".join(lines)
    assert "[node1 measure/fx] a1\n[node1 measure/fx] a2 par" in text
    assert "[node2 measure/local_nvme] b1" in text and "t of a2\n[node1 measure/fx] a3" in text
    assert "run started" in text and "[node1 measure/fx] step 1" not in text


def test_the_workload_command_has_each_flag_once_the_runs_value_where_the_plans_stood():
    args = ["measure", "--url", "http://127.0.0.1:8000", "--concurrency", "8,16", "--repetitions", "3",
            "--prompt-tokens", "4096", "--concurrency", "16", "--repetitions", "2"]
    assert once(args) == ["measure", "--url", "http://127.0.0.1:8000", "--concurrency", "16", "--repetitions", "2",
                          "--prompt-tokens", "4096"]
