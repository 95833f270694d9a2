"""A run nobody has picked up for a minute says which worker queue it waits for and the command that serves it."""
from __future__ import annotations

from datetime import timedelta

from django.urls import reverse
from django.utils import timezone

from runners.models import Job, Site, Step


def test_a_run_nobody_picked_up_names_its_queue_and_the_worker_command(signed_pilot, client):
    pilot = signed_pilot.pilot
    site = Site.objects.create(pilot=pilot, name="Lab", queue="site-lab-7")
    job = Job.objects.create(pilot=pilot, gate=pilot.gate(1), site=site, created_by_label="command line (ops@jump1)")
    Step.objects.create(job=job, seq=1, name="probe")
    client.force_login(signed_pilot.carol)
    page = client.get(reverse("run", args=[job.code])).content.decode()
    assert "run-waiting" not in page  # too young to worry
    assert "Started by command line (ops@jump1)" in " ".join(page.split())  # started by no signed-in person
    Job.objects.filter(pk=job.pk).update(created=timezone.now() - timedelta(seconds=90))
    page = client.get(reverse("run", args=[job.code])).content.decode()
    assert "run-waiting" in page and "manage.py worker --queues site-lab-7" in page
    Step.objects.filter(job=job).update(status="running", started=timezone.now())
    assert "run-waiting" not in client.get(reverse("run", args=[job.code])).content.decode()
