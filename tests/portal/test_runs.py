"""The run page: steps with progress, the live log back-filled by chunk number without gaps, artifacts."""

from __future__ import annotations

import re

from django.urls import reverse

from runners import output
from runners.models import OutputChunk


def log_update(client, job, after: int) -> str:
    return client.get(reverse("run_log", args=[job.code]), {"after": after}).content.decode()


def seqs(html: str) -> list[int]:
    return [int(n) for n in re.findall(r'data-seq="(\d+)"', html)]


def test_the_run_page_shows_steps_log_and_artifacts_with_their_hashes(client, world):
    client.force_login(world.carol)
    page = client.get(reverse("run", args=[world.job.code])).content.decode()
    assert "probing node1" in page and "probe done" in page
    assert world.artifact.sha256 in page and "node1/probe/amd-smi.json" in page
    assert 'id="run-progress"' in page and "Simulated — not evidence" in page


def test_the_log_poll_returns_only_chunks_after_the_number_given(client, world):
    client.force_login(world.alice)
    output.append_output(world.job, "third\n")
    html = log_update(client, world.job, 1)
    assert seqs(html) == [2, 3] and "third" in html and "probing node1" not in html
    assert "after=3" in html


def test_the_log_poll_stops_at_a_missing_chunk_so_the_page_never_has_a_gap(client, world):
    client.force_login(world.alice)
    OutputChunk.objects.create(job=world.job, seq=5, stream="stdout", text="five\n")
    html = log_update(client, world.job, 1)
    assert seqs(html) == [2] and "five" not in html
    OutputChunk.objects.create(job=world.job, seq=3, stream="stdout", text="three\n")
    OutputChunk.objects.create(job=world.job, seq=4, stream="stdout", text="four\n")
    assert seqs(log_update(client, world.job, 2)) == [3, 4, 5]


def test_a_finished_run_stops_polling_once_nothing_is_new(client, world):
    from runners.models import Job, Status

    Job.objects.filter(pk=world.job.pk).update(status=Status.SUCCESSFUL)
    client.force_login(world.alice)
    html = log_update(client, world.job, 2)
    assert seqs(html) == [] and "hx-get" not in html.split('id="log-poller"')[1]


def test_a_running_job_keeps_polling_and_refreshes_its_status(client, world):
    from runners.models import Job, Status

    Job.objects.filter(pk=world.job.pk).update(status=Status.RUNNING)
    client.force_login(world.alice)
    html = log_update(client, world.job, 2)
    assert 'hx-trigger="every 1s"' in html and 'hx-swap-oob="true"' in html and "Running" in html


def test_a_bad_after_parameter_is_a_clear_400(client, world):
    client.force_login(world.alice)
    response = client.get(reverse("run_log", args=[world.job.code]), {"after": "x"})
    assert response.status_code == 400 and "after" in response.content.decode()


def test_an_artifact_downloads_byte_for_byte_with_its_hash(client, world):
    client.force_login(world.carol)
    response = client.get(reverse("artifact_download", args=[world.artifact.code]))
    assert b"".join(response.streaming_content) == b'{"gpus": 8}'
    assert response["X-Content-SHA256"] == world.artifact.sha256


def test_starting_a_run_on_a_gate_that_is_not_open_says_why(client, world):
    client.force_login(world.alice)
    response = client.post(reverse("run_start", args=[world.pilot.code, 1]), follow=True)
    assert "runs start only on an open gate" in response.content.decode()


def test_starting_a_run_without_a_gpu_node_says_what_is_missing(client, signed_pilot):
    client.force_login(signed_pilot.alice)
    response = client.post(reverse("run_start", args=[signed_pilot.pilot.code, 1]), follow=True)
    assert "no site with a GPU node" in response.content.decode()
