#!/usr/bin/env python3
"""A minimal OpenAI-compatible streaming server with no delays (standard library only).

Serves `POST /v1/completions` (stream or not; prompt as text or token ids), `GET /v1/models`,
`GET /health`, `GET /metrics`, `POST /reset_prefix_cache`, and for the benchmark `GET /stats`
(counters and requests in flight) and `GET /stamps` (per request: wall-clock time the request was
read, the first token written, the last token written). `/tokenize` is deliberately absent so that
`vllm bench serve` skips its prompt re-alignment (research/peer-clients.md).

Tokens are produced in decode steps like a batching engine: every step writes one SSE event to every
running stream, then yields to the event loop; there is no sleep anywhere.

For tests, the model name selects a misbehaviour: `http-500`, `close-mid-stream`, `malformed-sse`,
`no-token`, `hang`, `not-streaming`, `error-event`, `no-done`, `cached` (reports every prompt token as
cached, in usage and as GPU prefix-cache hits in /metrics: a cache still hot in HBM). Any other model
name behaves. `--hang-after N` makes every request after the N-th hang.

For the client's tier attribution, `--diskstats PATH --sectors-per-request N` keeps a file in /proc/diskstats
format whose device `vdb` (`--disk-device`) has read N more 512-byte sectors for every completion request received,
as a disk tier serving each prompt would have.

    python3 stream_server.py --port 8020 [--host 127.0.0.1] [--simulated] [--hang-after N] [--no-metrics]
                             [--diskstats PATH --sectors-per-request N [--disk-device vdb]]
    (--port 0 picks a free port; the first line printed says which)
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

MISBEHAVIOURS = {"http-500", "close-mid-stream", "malformed-sse", "no-token", "hang", "not-streaming", "error-event",
                 "no-done", "cached"}


class Stats:
    def __init__(self) -> None:
        self.started = self.done = self.tokens = self.in_flight = self.resets = 0
        self.prompt_tokens = self.cached_tokens = 0
        self.stamps: list[tuple] = []


class Stream:
    __slots__ = ("conn", "rid", "model", "left", "sent", "ids", "t_recv", "t_first", "usage", "prompt", "misbehave",
                 "created")

    def __init__(self, conn: Connection, rid: str, model: str, tokens: int, ids: bool, usage: bool, prompt: int):
        self.conn, self.rid, self.model, self.left, self.sent = conn, rid, model, tokens, 0
        self.ids, self.usage, self.prompt = ids, usage, prompt
        self.t_recv, self.t_first = time.time(), 0.0
        self.created = int(self.t_recv)
        self.misbehave = model if model in MISBEHAVIOURS else ""


class Disk:
    """A /proc/diskstats-format file: a device that reads `per_request` sectors for every request."""

    def __init__(self, path: str, device: str, per_request: int):
        self.path, self.device, self.per_request, self.sectors = path, device, per_request, 0
        self.write()

    def read_for_request(self) -> None:
        self.sectors += self.per_request
        self.write()

    def write(self) -> None:
        reads = self.sectors // 8
        text = ("   7       0 loop0 5 0 40 1 0 0 0 0 0 1 1\n"
                f" 252      16 {self.device} {reads} 0 {self.sectors} 3 7 1 64 2 0 5 5 0 0 0 0\n")
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.path)  # a reader sees the old or the new file, never half of one


class Engine:
    """Decode steps over all running streams; one SSE event per stream per step."""

    def __init__(self, simulated: bool, hang_after: int = 0, metrics: bool = True, disk: Disk | None = None):
        self.disk = disk
        self.hang_after = hang_after
        self.metrics = metrics
        self.running: list[Stream] = []
        self.stats = Stats()
        self.simulated = simulated
        self.wake = asyncio.Event()
        self.seq = 0

    async def run(self) -> None:
        while True:
            if not self.running:
                self.wake.clear()
                await self.wake.wait()
            self.step()
            await asyncio.sleep(0)

    def add(self, stream: Stream) -> None:
        self.running.append(stream)
        self.stats.started += 1
        self.stats.in_flight += 1
        self.wake.set()

    def step(self) -> None:
        keep = []
        now = time.time()
        for s in self.running:
            if s.conn.closed:
                self._finish(s, now)
                continue
            if s.misbehave == "hang":
                continue  # headers sent, then silence: the stream is dropped from the batch, never ended
            if s.misbehave == "no-token" or (s.misbehave == "error-event" and s.sent == 1):
                if s.misbehave == "error-event":
                    s.conn.chunk(b'data: {"error": {"message": "engine died", "type": "InternalServerError"}}\n\n')
                self._end(s, now)
                continue
            if s.misbehave == "close-mid-stream" and s.sent == 2:
                s.conn.transport.close()
                self._finish(s, now)
                continue
            if s.misbehave == "malformed-sse" and s.sent == 1:
                s.conn.chunk(b"data: {this is not json\n\n")
            token = 1000 + (s.sent * 7919) % 30000
            s.sent += 1
            s.left -= 1
            last = s.left <= 0
            choice = {"index": 0, "text": f" t{token}", "logprobs": None, "finish_reason": "length" if last else None,
                      "stop_reason": None}
            if s.ids:
                choice["token_ids"] = [token]
            # serialised per chunk, as real servers do (vLLM: one pydantic model_dump_json per chunk)
            s.conn.chunk(b"data: " + json.dumps({"id": s.rid, "object": "text_completion", "created": s.created,
                                                 "model": s.model, "choices": [choice], "usage": None},
                                                separators=(",", ":")).encode() + b"\n\n")
            if s.sent == 1:
                s.t_first = time.time()
            self.stats.tokens += 1
            if last:
                self._end(s, time.time())
            else:
                keep.append(s)
        self.running = keep

    def _end(self, s: Stream, now: float) -> None:
        if s.usage:
            cached = s.prompt if s.misbehave == "cached" else 0
            s.conn.chunk(b'data: {"id":"%s","object":"text_completion","model":"%s","choices":[],"usage":'
                         b'{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,'
                         b'"prompt_tokens_details":{"cached_tokens":%d}}}\n\n'
                         % (s.rid.encode(), s.model.encode(), s.prompt, s.sent, s.prompt + s.sent, cached))
        if s.misbehave != "no-done":
            s.conn.chunk(b"data: [DONE]\n\n")
        s.conn.chunk(b"")
        self._finish(s, now)
        s.conn.busy = False

    def _finish(self, s: Stream, now: float) -> None:
        self.stats.done += 1
        self.stats.in_flight -= 1
        self.stats.stamps.append((s.rid, s.t_recv, s.t_first or None, now, s.sent))


class Connection(asyncio.Protocol):
    def __init__(self, engine: Engine):
        self.engine = engine
        self.buf = bytearray()
        self.closed = False
        self.busy = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True

    def chunk(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(b"%x\r\n%s\r\n" % (len(data), data))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while not self.busy:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
            length = 0
            for line in head[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            if len(self.buf) < end + 4 + length:
                return
            body = bytes(self.buf[end + 4:end + 4 + length])
            del self.buf[:end + 4 + length]
            method, path = (head[0].split(" ") + ["", ""])[:2]
            self.handle(method, path.split("?")[0], body)

    def reply(self, status: str, body: bytes, ctype: str = "application/json") -> None:
        self.transport.write(b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"
                             % (status.encode(), ctype.encode(), len(body), body))

    def handle(self, method: str, path: str, body: bytes) -> None:
        engine = self.engine
        if path == "/v1/completions" and method == "POST":
            self.complete(body)
        elif path == "/health":
            self.reply("200 OK", b"")
        elif path == "/v1/models":
            self.reply("200 OK", b'{"object":"list","data":[{"id":"mock","object":"model"}]}')
        elif path == "/stats":
            s = engine.stats
            self.reply("200 OK", json.dumps({"started": s.started, "done": s.done, "tokens": s.tokens,
                                             "in_flight": s.in_flight, "resets": s.resets}).encode())
        elif path == "/stamps":
            self.reply("200 OK", json.dumps(engine.stats.stamps).encode())
            engine.stats.stamps = []
        elif path == "/metrics" and engine.metrics:
            s = engine.stats
            sim = "# fxpilot simulated server\n" if engine.simulated else ""
            text = (f"{sim}vllm:prompt_tokens_total{{model_name=\"mock\"}} {s.prompt_tokens}\n"
                    f"vllm:generation_tokens_total{{model_name=\"mock\"}} {s.tokens}\n"
                    f"vllm:prefix_cache_queries_total{{model_name=\"mock\"}} {s.prompt_tokens}\n"
                    f"vllm:prefix_cache_hits_total{{model_name=\"mock\"}} {s.cached_tokens}\n"
                    f"vllm:external_prefix_cache_queries_total{{model_name=\"mock\"}} {s.prompt_tokens}\n"
                    "vllm:external_prefix_cache_hits_total{model_name=\"mock\"} 0\n")
            self.reply("200 OK", text.encode(), "text/plain; version=0.0.4")
        elif path == "/reset_prefix_cache" and method == "POST":
            engine.stats.resets += 1
            self.reply("200 OK", b"")
        else:
            self.reply("404 Not Found", b'{"detail":"Not Found"}')

    def complete(self, body: bytes) -> None:
        engine = self.engine
        try:
            req = json.loads(body)
            prompt = req["prompt"]
            tokens = int(req.get("max_tokens") or 16)
        except (ValueError, KeyError, TypeError) as error:
            self.reply("400 Bad Request", json.dumps({"error": {"message": f"bad request: {error}"}}).encode())
            return
        model = str(req.get("model", "mock"))
        if engine.disk is not None:
            engine.disk.read_for_request()
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            prompt = prompt[0]
        n_prompt = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        engine.stats.prompt_tokens += n_prompt
        if model == "cached":
            engine.stats.cached_tokens += n_prompt
        if model == "http-500":
            self.reply("500 Internal Server Error", b'{"error":{"message":"the engine is on fire"}}')
            return
        engine.seq += 1
        rid = f"cmpl-{engine.seq}"
        if engine.hang_after and engine.seq > engine.hang_after:
            model = "hang"
        if not req.get("stream") or model == "not-streaming":
            text = "".join(f" t{1000 + (i * 7919) % 30000}" for i in range(tokens))
            self.reply("200 OK", json.dumps({"id": rid, "object": "text_completion", "model": model,
                                             "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                                             "usage": {"prompt_tokens": n_prompt, "completion_tokens": tokens,
                                                       "total_tokens": n_prompt + tokens}}).encode())
            return
        self.busy = True
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n")
        usage = bool((req.get("stream_options") or {}).get("include_usage"))
        engine.add(Stream(self, rid, model, tokens, bool(req.get("return_token_ids")), usage, n_prompt))


async def serve(host: str, port: int, simulated: bool = False, hang_after: int = 0, metrics: bool = True,
                disk: Disk | None = None) -> None:
    engine = Engine(simulated, hang_after, metrics, disk)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(engine), host, port, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(f"listening on http://{host}:{port}", flush=True)
    async with server:
        await engine.run()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8020)
    p.add_argument("--simulated", action="store_true", help="say so in /metrics")
    p.add_argument("--hang-after", type=int, default=0, help="requests after this many hang (0: never)")
    p.add_argument("--no-metrics", action="store_true", help="answer 404 on /metrics (a server without them)")
    p.add_argument("--diskstats", help="keep this /proc/diskstats-format file: the device reads for every request")
    p.add_argument("--disk-device", default="vdb")
    p.add_argument("--sectors-per-request", type=int, default=0)
    a = p.parse_args()
    disk = Disk(a.diskstats, a.disk_device, a.sectors_per_request) if a.diskstats else None
    try:
        asyncio.run(serve(a.host, a.port, a.simulated, a.hang_after, not a.no_metrics, disk))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
