"""A site that works from its card (issue 46): the agent's address is the portal's real one, the card says what to
install and no HTTPS above an http URL, the kit's code starts on its own, and a contact nobody answers says why."""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tarfile
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from runners.models import Node

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_site_url(monkeypatch):
    monkeypatch.delenv("SITE_URL", raising=False)


def test_the_card_names_the_portals_own_address_and_says_http_is_not_encrypted(client, world):
    client.force_login(world.alice)
    page = client.post(reverse("site_agent_create", args=[world.site.code])).content.decode()
    url = re.search(r"FXPILOT_AGENT_URL=(\S+)", page).group(1)
    assert url == "http://testserver" and "127.0.0.1:8000" not in page
    assert "over HTTPS" not in page and 'id="agent-transport" class="warn"' in page and "Not encrypted" in page
    assert re.search(r"PyNaCl==\d", page) and re.search(r"paramiko==\d", page) and re.search(r"cryptography==\d", page)
    assert "fxpilot-agent.service" in page and "python -m runners.agent --check" in page


def test_an_https_portal_is_said_to_be_https(client, world):
    client.force_login(world.alice)
    page = client.post(reverse("site_agent_create", args=[world.site.code]), secure=True).content.decode()
    assert "FXPILOT_AGENT_URL=https://testserver" in page and "over HTTPS" in page and "Not encrypted" not in page


def test_the_kits_agent_starts_on_its_own_and_names_what_it_misses(client, world, tmp_path):
    client.force_login(world.alice)
    response = client.get(reverse("site_agent_kit", args=[world.site.code]))
    assert response.status_code == 200 and response["Content-Type"] == "application/gzip"
    with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:gz") as tar:
        names = set(tar.getnames())
        tar.extractall(tmp_path, filter="data")
    kit = tmp_path / "fxpilot-agent-kit"
    assert {"fxpilot-agent-kit/requirements-agent.txt", "fxpilot-agent-kit/fxpilot-agent.service",
            "fxpilot-agent-kit/INSTALL.sh", "fxpilot-agent-kit/runners/agent/main.py"} <= names
    assert "PyNaCl==" in (kit / "requirements-agent.txt").read_text()
    assert "FXPILOT_AGENT_TOKEN=" in (kit / "agent.env.example").read_text()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    done = subprocess.run([sys.executable, "-m", "runners.agent", "--check"], cwd=kit, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode != 0 and "FXPILOT_AGENT_URL is not set" in done.stderr, (done.returncode, done.stderr)
    probe = subprocess.run([sys.executable, "-c", "import sys, runners.agent.main; print('django' in sys.modules)"],
                           cwd=kit, env=env, capture_output=True, text=True, timeout=600)
    assert probe.returncode == 0 and probe.stdout.strip() == "False", probe.stderr


def test_a_contact_nobody_answers_names_the_queue_and_the_worker_to_start(client, world):
    client.force_login(world.alice)
    node = world.node
    Node.objects.filter(pk=node.pk).update(contact_state="waiting",
                                           contact_requested_at=timezone.now() - timedelta(minutes=2))
    page = client.get(reverse("node", args=[node.code])).content.decode()
    assert 'id="contact-waits"' in page and f"--queues {world.site.queue}" in page
    Node.objects.filter(pk=node.pk).update(contact_requested_at=timezone.now())
    assert 'id="contact-waits"' not in client.get(reverse("node", args=[node.code])).content.decode()
