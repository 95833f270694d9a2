"""A day of traffic through the portal's upload (issue 44, item 7): past the old 16 MiB cap and past Django's
in-memory upload size, the trace is streamed from its temporary file to the evidence store (never read whole into
the web process), kept byte for byte, and refused above the trace limit with the sizes named."""
from __future__ import annotations

import hashlib
import json

from django.test import Client
from django.urls import reverse

from gates.models import CustomerTrace
from runners import traces as runner_traces
from runners.artifacts import get_bytes


def _day(requests: int) -> bytes:
    return "".join(json.dumps({"timestamp": 40 * i, "input_length": 1536, "output_length": 2,
                               "hash_ids": [0, 1 + i % 5000, 7 + i]}) + "\n" for i in range(requests)).encode()


def test_a_trace_past_the_memory_size_is_streamed_from_its_temporary_file_and_kept_whole(signed_pilot, settings,
                                                                                          tmp_path, monkeypatch):
    settings.FILE_UPLOAD_MAX_MEMORY_SIZE = 1 << 20        # Django spools anything larger to a temporary file
    data = _day(420_000)
    assert len(data) > 25 << 20                          # over the old cap and the default in-memory size
    streamed: list = []
    real = runner_traces.receive_file
    monkeypatch.setattr(runner_traces, "receive_file",
                        lambda *args, **kwargs: streamed.append(args[1]) or real(*args, **kwargs))
    monkeypatch.setattr(runner_traces, "receive", lambda *a, **k: (_ for _ in ()).throw(AssertionError("read whole")))
    path = tmp_path / "day-of-traffic.jsonl"
    path.write_bytes(data)
    client = Client()
    client.force_login(signed_pilot.bob)
    with path.open("rb") as handle:
        response = client.post(reverse("pilot_trace_upload", args=[signed_pilot.pilot.code]), {"trace": handle})
    assert response.status_code == 302, response.content[:500]
    assert len(streamed) == 1                            # the temporary file's path, not its bytes
    row = CustomerTrace.objects.get(pilot=signed_pilot.pilot)
    assert row.name == "day-of-traffic.jsonl" and row.size == len(data)
    assert row.sha256 == hashlib.sha256(data).hexdigest()
    assert hashlib.sha256(get_bytes(row.path, row.sha256)).hexdigest() == row.sha256   # re-hashed on read


def test_a_trace_over_the_limit_is_refused_with_both_sizes_and_nothing_is_kept(signed_pilot, settings, tmp_path):
    settings.FILE_UPLOAD_MAX_MEMORY_SIZE = 1 << 20
    settings.FXPILOT_TRACE_MAX_BYTES = 2 << 20
    data = _day(30_000)
    assert len(data) > 2 << 20
    path = tmp_path / "too-big.jsonl"
    path.write_bytes(data)
    client = Client()
    client.force_login(signed_pilot.bob)
    with path.open("rb") as handle:
        response = client.post(reverse("pilot_trace_upload", args=[signed_pilot.pilot.code]), {"trace": handle},
                               follow=True)
    page = response.content.decode()
    assert f"{len(data)} bytes" in page and f"{2 << 20} bytes" in page
    assert not CustomerTrace.objects.filter(pilot=signed_pilot.pilot).exists()


def test_the_request_limit_admits_a_trace_upload_past_128_mb_and_nothing_else(settings):
    settings.FXPILOT_TRACE_MAX_BYTES = 1 << 30
    code = "0" * 8 + "-0000-0000-0000-" + "0" * 12
    big = str(200 << 20)
    client = Client()
    # the size check comes first: 413 before anything else looks at the request
    assert client.post("/accounts/login/", CONTENT_LENGTH=big, content_type="text/plain", data="").status_code == 413
    trace = client.post(f"/pilots/{code}/traces/upload/", CONTENT_LENGTH=big, content_type="text/plain", data="")
    assert trace.status_code != 413
    over = client.post(f"/pilots/{code}/traces/upload/", CONTENT_LENGTH=str((1 << 30) + (2 << 20)),
                       content_type="text/plain", data="")
    assert over.status_code == 413
