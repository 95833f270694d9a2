"""Fixtures of the site agent's control-plane side: an enrolled agent (token and X25519 key, its hello done), a
node of its site, and a responder: a stand-in for the remote end of the protocol that answers calls through the
real HTTP API (Django's test client), so the control plane's waiting rules meet a real exchange."""
from __future__ import annotations

import base64
import hashlib
import threading
import time
import uuid
from types import SimpleNamespace

import pytest
from django.db import connection
from django.test import Client

from tests.runners.conftest import credential, job, pilot, site, user_key  # noqa: F401  (shared fixtures)

API = "/agent/v1"


def agent_client(token: str) -> Client:
    return Client(headers={"authorization": f"Bearer {token}"})


def post(client: Client, url: str, data: dict | None = None):
    return client.post(f"{API}/{url}", data=data or {}, content_type="application/json")


def enrol(where, *, hello: bool = True) -> SimpleNamespace:
    """A fresh agent credential for site `where` and the agent's own key pair; its hello done unless told not."""
    from runners import agents, sealing

    agent, token = agents.create_agent(where)
    private, public = sealing.new_keypair()
    client = agent_client(token)
    enrolled = SimpleNamespace(agent=agent, token=token, private=private, public=public, client=client, site=where)
    if hello:
        answer = post(client, "hello", {"public_key": public, "version": "test"})
        assert answer.status_code == 200, answer.content
        enrolled.hello = answer.json()
        agent.refresh_from_db()
    return enrolled


@pytest.fixture
def enrolled(site, credential):  # noqa: F811  (fixture parameters)
    return enrol(site)


@pytest.fixture
def fake_host_key():
    from runners.simnode.server import generate_ed25519

    def make(tmp_path, name="host"):
        return generate_ed25519(tmp_path / f"{name}-{uuid.uuid4().hex[:6]}")

    return make


@pytest.fixture
def agent_node(site, credential, tmp_path, fake_host_key):  # noqa: F811  (fixture parameters)
    """A node of the site with an accepted host key (nobody listens there: only the agent would connect)."""
    from runners.models import Node

    key = fake_host_key(tmp_path)
    return Node.objects.create(site=site, name="gpu1", host="10.0.0.5", port=22, username="fx", credential=credential,
                               host_key_state=Node.HostKeyState.ACCEPTED, host_key_type=key.get_name(),
                               host_key=key.get_base64(), host_key_fingerprint=key.fingerprint)


def other_site(name="Other site"):
    """A site of another pilot (another customer), with a credential and a node of its own."""
    import tempfile
    from pathlib import Path

    from gates.models import Organisation, Pilot
    from runners.config import default_simulated
    from runners.credentials import create_credential
    from runners.models import Node, Site
    from runners.simnode.server import generate_ed25519

    suffix = uuid.uuid4().hex[:6]
    vendor = Organisation.objects.create(name=f"Vendor B {suffix}", kind=Organisation.Kind.VENDOR)
    customer = Organisation.objects.create(name=f"Customer B {suffix}", kind=Organisation.Kind.CUSTOMER)
    theirs = Pilot.objects.create(name=f"Pilot B {suffix}", vendor=vendor, customer=customer,
                                  deployment=default_simulated())
    place = Site.objects.create(pilot=theirs, name=name, queue=f"site-b-{suffix}")
    folder = Path(tempfile.mkdtemp())
    generate_ed25519(folder / "id", comment="site-b")
    cred = create_credential(place, "b key", (folder / "id").read_text())
    node = Node.objects.create(site=place, name="b-gpu1", host="10.9.0.5", username="fx", credential=cred)
    return SimpleNamespace(site=place, credential=cred, node=node, key_text=(folder / "id").read_text())


class Responder:
    """The remote end of the protocol, in a thread: long-polls /work and answers each call with `handle(call)`,
    which returns the /done body (or None to leave the call unanswered). Talks HTTP through the test client only."""

    def __init__(self, token: str, handle) -> None:
        self.client = agent_client(token)
        self.handle = handle
        self.stop = threading.Event()
        self.seen: list[dict] = []
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Responder:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=600)
        if self.errors:
            raise self.errors[0]

    def _loop(self) -> None:
        try:
            while not self.stop.is_set():
                answer = post(self.client, "work", {"slots": 4, "wait": 0.5})
                assert answer.status_code == 200, answer.content
                for call in answer.json()["calls"]:
                    self.seen.append(call)
                    body = self.handle(self, call)
                    if body is not None:
                        self.done(call, body)
        except BaseException as exc:  # noqa: BLE001 — reported by __exit__ in the test's thread
            self.errors.append(exc)
        finally:
            connection.close()

    def output(self, call, stdout: bytes = b"", stderr: bytes = b""):
        return post(self.client, f"calls/{call['id']}/output",
                    {"stdout": base64.b64encode(stdout).decode(), "stderr": base64.b64encode(stderr).decode()})

    def done(self, call, body: dict):
        return post(self.client, f"calls/{call['id']}/done", body)

    def upload(self, call, data: bytes):
        return self.client.put(f"{API}/calls/{call['id']}/file", data=data, content_type="application/octet-stream")

    def payload(self, call) -> bytes:
        answer = self.client.get(f"{API}/calls/{call['id']}/payload")
        assert answer.status_code == 200, answer.content
        return answer.content


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def wait_until(predicate, timeout: float = 600, what: str = "") -> None:
    """Wait for `predicate()`; `timeout` is a hang bound, not an expectation of speed."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"hung: no {what or getattr(predicate, '__name__', 'condition')} after {timeout:g} s")
