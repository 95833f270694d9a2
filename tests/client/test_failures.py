"""A misbehaving server: every failed request is a record with status error and the reason in words,
and the run goes on."""
from __future__ import annotations

import socket

import pytest

from runners.remote import workload
from tests.client.conftest import read_jsonl


def _phase(url: str, out, model: str, sessions: int = 3, timeout: float = 600, concurrency: int = 2) -> list[dict]:
    workload.run_phase(url, model=model, arm="fx", phase="measure", concurrency=concurrency, repetition=1,
                       sessions=workload.make_sessions(sessions, 64, prefix=model), output_tokens=8, turn_tokens=4,
                       run_id="t", instance="node1", out_path=str(out), simulated=True, timeout=timeout)
    return [r for r in read_jsonl(out) if r["session"].startswith(model)]


@pytest.mark.parametrize("model, reason", [
    ("http-500", "HTTP 500 Internal Server Error: the engine is on fire"),
    ("close-mid-stream", "the server closed the connection mid-stream after 2 tokens"),
    ("malformed-sse", "malformed SSE data in event 2: b'{this is not json'"),
    ("no-token", "the stream carried no token"),
    ("not-streaming", "the server did not stream (Content-Type application/json)"),
    ("error-event", "the server reported an error mid-stream: engine died"),
    ("no-done", "the stream ended without 'data: [DONE]' after 8 tokens"),
])
def test_each_misbehaviour_is_an_error_record_with_its_reason(server_url, tmp_path, model, reason):
    records = _phase(server_url, tmp_path / "r.jsonl", model)
    assert len(records) == 3
    for record in records:
        assert record["status"] == "error"
        assert record["error"].startswith(reason), record["error"]
        assert record["t_end"] >= record["t_send"]


def test_a_server_that_never_sends_a_token_times_out_with_a_reason(start_server, tmp_path):
    url = start_server()
    records = _phase(url, tmp_path / "r.jsonl", "hang", sessions=2, timeout=0.5)
    assert [r["status"] for r in records] == ["error", "error"]
    assert records[0]["error"] == "timed out after 0.5 s before any token"
    assert records[0]["t_first_token"] is None


def test_the_run_goes_on_after_requests_fail(start_server, tmp_path):
    url = start_server("--hang-after", "2")
    records = _phase(url, tmp_path / "r.jsonl", "mock", sessions=5, timeout=5, concurrency=1)
    assert [r["status"] for r in records] == ["ok", "ok", "error", "error", "error"]
    url = start_server()
    assert all(r["status"] == "ok" for r in _phase(url, tmp_path / "r2.jsonl", "mock", sessions=2))


def test_connection_refused_is_recorded_not_raised(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    records = _phase(f"http://127.0.0.1:{port}", tmp_path / "r.jsonl", "mock", sessions=2)
    assert [r["status"] for r in records] == ["error", "error"]
    assert records[0]["error"] == f"cannot connect to 127.0.0.1:{port}: Connection refused"
    assert records[0]["output_tokens"] == 0


def test_a_slow_path_stream_with_crlf_lines_and_comments_parses_like_the_fast_one():
    events = [b'{"id":"c","choices":[{"index":0,"text":" a\\u00e9"}]}', b'{"id":"c","choices":[{"text":"b"}]}',
              b'{"id":"c","choices":[],"usage":{"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":7}}}']
    lf = b"".join(b"data: " + e + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    crlf = b": keep-alive\r\n\r\n" + b"".join(b"event: x\r\ndata: " + e + b"\r\n\r\n" for e in events) + b"data: [DONE]\r\n\r\n"
    fast, slow = workload.parse_stream(lf), workload.parse_stream(crlf)
    assert fast.error is None and slow.error is None
    assert (fast.sha256, fast.tokens, fast.cached, fast.request_id) == (slow.sha256, slow.tokens, slow.cached, "c")
    assert fast.sha256 == workload.hashlib.sha256(" aéb".encode()).hexdigest()


def test_a_line_that_is_not_an_sse_field_is_named():
    parsed = workload.parse_stream(b'data: {"choices":[{"text":"a"}]}\n\ngarbage here\n\ndata: [DONE]\n\n')
    assert parsed.error == "malformed SSE line b'garbage here' (expected 'data: ...')"


class _Scripted:
    """A raw HTTP server that answers every request with the same bytes, to test framing."""

    def __init__(self, response: bytes):
        import socketserver
        import threading

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                self.request.recv(65536)
                self.request.sendall(response)

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _chunked(*pieces: bytes, trailer: bytes = b"") -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    return head + b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n" + trailer + b"\r\n"


def test_crlf_events_split_across_chunks_with_extensions_and_trailers_are_read(tmp_path):
    stream = (b'data: {"id":"c","choices":[{"text":"a"}]}\r\n\r\ndata: {"id":"c","choices":[{"text":"b"}]}\r\n\r\n'
              b"data: [DONE]\r\n\r\n")
    server = _Scripted(_chunked(stream[:30], stream[30:77], stream[77:], trailer=b"X-Trailer: 1\r\n"))
    try:
        records = _phase(server.url, tmp_path / "r.jsonl", "mock", sessions=2)
    finally:
        server.close()
    assert [r["status"] for r in records] == ["ok", "ok"]
    assert records[0]["output_sha256"] == workload.hashlib.sha256(b"ab").hexdigest()
    assert records[0]["output_tokens"] == 2


def test_broken_chunk_framing_is_named(tmp_path):
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    server = _Scripted(head + b"zz\r\ndata: x\n\n\r\n0\r\n\r\n")
    try:
        records = _phase(server.url, tmp_path / "r.jsonl", "mock", sessions=1)
    finally:
        server.close()
    assert records[0]["status"] == "error"
    assert records[0]["error"].startswith("malformed chunked encoding: chunk size b'zz'"), records[0]["error"]


def test_a_server_that_never_reads_the_request_times_out_and_the_run_goes_on(tmp_path):
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    held = []

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            if conn.recv(4).startswith(b"GET"):  # /metrics: answered; a completion: never read further
                conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                conn.close()
            else:
                held.append(conn)

    threading.Thread(target=serve, daemon=True).start()
    # 4 M tokens: far more than the socket buffers hold, so the send itself blocks
    big = workload.Session("big", "k", 4_000_000, b"1000," * 3_999_999 + b"1000")
    try:
        workload.run_phase(f"http://127.0.0.1:{listener.getsockname()[1]}", model="mock", arm="fx", phase="populate",
                           concurrency=1, repetition=1, sessions=[big, big], output_tokens=4, run_id="t",
                           instance="n", out_path=str(tmp_path / "r.jsonl"), simulated=False, timeout=1.0)
    finally:
        listener.close()
    records = read_jsonl(tmp_path / "r.jsonl")
    assert [r["status"] for r in records] == ["error", "error"]
    assert records[0]["error"] == "timed out after 1 s before the server answered"
