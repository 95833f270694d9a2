"""A worker that is handed what is not a usable message logs it, drops or rejects it, and goes on."""
from __future__ import annotations

import base64
import json
import uuid


def _envelope(task: str, body: bytes, content_type: str = "application/json", args_repr: str = "()") -> bytes:
    task_id = str(uuid.uuid4())
    return json.dumps({
        "body": base64.b64encode(body).decode(), "content-encoding": "utf-8", "content-type": content_type,
        "headers": {"lang": "py", "task": task, "id": task_id, "root_id": task_id, "parent_id": None, "group": None,
                    "argsrepr": args_repr, "kwargsrepr": "{}", "retries": 0, "eta": None, "expires": None},
        "properties": {"correlation_id": task_id, "delivery_mode": 2, "priority": 0, "body_encoding": "base64",
                       "delivery_tag": str(uuid.uuid4()), "reply_to": "",
                       "delivery_info": {"exchange": "", "routing_key": "bad-q"}},
    }).encode()


def test_a_worker_rejects_bad_messages_and_goes_on(procs, redis_server):
    worker = procs.worker("w1", "bad-q")
    client = redis_server.client()
    good_body = json.dumps([["ok-1"], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]).encode()
    bad = [
        b"",                                            # empty: what the filesystem broker handed out
        b"not json at all \xff",                        # bytes that are not JSON
        b'{"no": "envelope"}',                          # JSON, not a message
        b"[1, 2, 3]",
        b'{"body": "x", "properties": "not a dict"}',
        _envelope("tests.broker.no_such_task", good_body),                          # unregistered task
        _envelope("tests.broker.record", b"\x80\x04garbage", "application/x-python-serialize"),  # not accepted
        _envelope("tests.broker.record", b"{not json"),                             # undecodable body
        _envelope("tests.broker.record", json.dumps([[], {}, {}]).encode()),          # missing argument
    ]
    for payload in bad:
        client.lpush("bad-q", payload)
    client.lpush("bad-q", _envelope("tests.broker.record", good_body))
    seen = procs.wait_deliveries({"ok-1"}, 600)
    log = worker.log.read_text(errors="replace")
    assert seen == {"ok-1": 1}, log[-4000:]
    assert worker.poll() is None and "Unrecoverable error" not in log, log[-4000:]
    assert log.count("dropped a message") >= 5, log[-4000:]
    assert "no_such_task" in log and "unregistered task" in log.lower(), log[-4000:]
    # And it keeps working: a message sent normally afterwards runs.
    procs.producer("p", "bad-q", ["ok-2"]).wait(600)
    assert procs.wait_deliveries({"ok-1", "ok-2"}, 600) == {"ok-1": 1, "ok-2": 1}
    assert client.llen("bad-q") == 0
