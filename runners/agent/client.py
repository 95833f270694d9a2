"""HTTP to the control plane's agent API (``/agent/v1/``): the standard library's http.client, one connection per request.

Every answer falls in one of four cases, which is all the rest of the agent looks at:

* 2xx: the answer (parsed JSON, or raw bytes for a payload);
* ``Gone`` (410): the call is no longer the agent's to answer (expired, canceled, done): drop it;
* ``Refused`` (any other 4xx; ``Unauthorized`` for 401): retrying will not help;
* ``Unavailable``: no answer, a 5xx, a proxy's 502/503/504 — the control plane is away for now: retry later.

The token is sent in the Authorization header and appears in no message or log line.
"""
from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
from urllib.parse import urlsplit

from runners.agent import VERSION
from runners.agent.config import Config

MAX_ERROR_TEXT = 300
BLOCK = 256 * 1024  # what a streamed upload reads at a time


class ClientError(Exception):
    pass


class Unavailable(ClientError):
    """The control plane did not answer, or answered that it cannot now (5xx)."""


class Refused(ClientError):
    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(f"{status}: {message}")


class Unauthorized(Refused):
    pass


class Gone(Refused):
    pass


def _error_text(raw: bytes) -> str:
    try:
        body = json.loads(raw)
        if isinstance(body, dict) and body.get("error"):
            return str(body["error"])[:MAX_ERROR_TEXT]
    except ValueError:
        pass
    return raw[:MAX_ERROR_TEXT].decode("utf-8", "replace").strip() or "(no text)"


class ControlPlane:
    """The agent API of one control plane, with one token. Thread-safe (each request has its connection)."""

    def __init__(self, config: Config, *, timeout: float = 30.0) -> None:
        parts = urlsplit(config.api)
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.base = parts.path.rstrip("/")
        self.timeout = timeout
        self._token = config.token
        self._ssl = None
        if self.https:
            self._ssl = ssl.create_default_context(cafile=str(config.ca) if config.ca else None)
        self._open: dict[int, http.client.HTTPConnection] = {}
        self._lock = threading.Lock()
        self.user_agent = f"fxpilot-agent/{VERSION}"

    def __repr__(self) -> str:
        return f"ControlPlane({'https' if self.https else 'http'}://{self.host}:{self.port}{self.base})"

    # --- the API ---

    def hello(self, public_key: str, *, starting: bool = False) -> dict:
        """`starting`: this process has just started and holds no call; what the token's agent held before (a process
        that died) is given up at once rather than when it falls silent."""
        return self.json("POST", "/hello", {"public_key": public_key, "version": VERSION, "starting": starting})

    def work(self, slots: int, wait: float) -> list[dict]:
        answer = self.json("POST", "/work", {"slots": slots, "wait": wait}, timeout=wait + self.timeout)
        calls = answer.get("calls") if isinstance(answer, dict) else None
        return calls if isinstance(calls, list) else []

    def output(self, call_id, body: dict) -> dict:
        return self.json("POST", f"/calls/{call_id}/output", body)

    def payload(self, call_id) -> http.client.HTTPResponse:
        """The put's bytes as an open response (read it, then close it)."""
        return self.request("GET", f"/calls/{call_id}/payload", stream=True, timeout=max(self.timeout, 120.0))

    def upload_file(self, call_id, handle, size: int) -> dict:
        return self._decode(self.request("PUT", f"/calls/{call_id}/file", handle, length=size,
                                         content_type="application/octet-stream", timeout=max(self.timeout, 300.0)))

    def done(self, call_id, body: dict) -> dict:
        return self.json("POST", f"/calls/{call_id}/done", body)

    def abort(self) -> None:
        """Cut every request under way (at shutdown: a long poll must not hold the exit up)."""
        with self._lock:
            connections = list(self._open.values())
        for conn in connections:
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    # --- plumbing ---

    def json(self, method: str, path: str, body: dict | None = None, *, timeout: float | None = None):
        data = json.dumps(body if body is not None else {}).encode()
        return self._decode(self.request(method, path, data, content_type="application/json", timeout=timeout))

    @staticmethod
    def _decode(raw: bytes):
        if not raw.strip():
            return {}
        try:
            return json.loads(raw)
        except ValueError:
            raise Unavailable(f"the control plane answered something that is not JSON: {_error_text(raw)}") from None

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.https:
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=self._ssl,
                                               blocksize=BLOCK)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout, blocksize=BLOCK)

    def request(self, method: str, path: str, body=None, *, length: int | None = None,
                content_type: str | None = None, stream: bool = False, timeout: float | None = None):
        """Bytes of a 2xx answer (or the open response when ``stream``); raises Gone/Refused/Unavailable."""
        conn = self._connection(timeout or self.timeout)
        headers = {"Authorization": f"Bearer {self._token}", "User-Agent": self.user_agent,
                   "Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        if body is not None:
            headers["Content-Length"] = str(len(body) if length is None else length)
        key = id(conn)
        with self._lock:
            self._open[key] = conn
        keep_open = False
        try:
            conn.request(method, self.base + path, body=body, headers=headers)
            response = conn.getresponse()
            if 200 <= response.status < 300:
                if stream:
                    keep_open = True
                    return _Response(response, conn, self._forget(key))
                return response.read()
            raw = response.read(64 * 1024)
            text = _error_text(raw)
            if response.status == 410:
                raise Gone(410, text)
            if response.status == 401:
                raise Unauthorized(401, text)
            if 400 <= response.status < 500 and response.status not in (408, 429):
                raise Refused(response.status, text)
            raise Unavailable(f"{method} {path}: the control plane answered {response.status} ({text})")
        except ssl.SSLCertVerificationError as exc:
            raise Unavailable(f"{method} {path}: the control plane's certificate is not trusted ({exc.verify_message}); "
                              "set FXPILOT_AGENT_CA to its CA bundle") from None
        except (OSError, http.client.HTTPException) as exc:
            raise Unavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from None
        finally:
            if not keep_open:
                self._forget(key)()
                conn.close()

    def _forget(self, key: int):
        def forget() -> None:
            with self._lock:
                self._open.pop(key, None)
        return forget


class _Response:
    """A streamed 2xx answer; ``read`` turns a broken connection into Unavailable."""

    def __init__(self, response: http.client.HTTPResponse, conn, forget) -> None:
        self._response = response
        self._conn = conn
        self._forget = forget
        self.length = response.length

    def read(self, size: int = -1) -> bytes:
        try:
            return self._response.read(size)
        except (OSError, http.client.HTTPException) as exc:
            raise Unavailable(f"the payload was cut off ({type(exc).__name__}: {exc})") from None

    def close(self) -> None:
        self._forget()
        self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
