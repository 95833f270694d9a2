"""The agent's loop: hello, one long-polling thread, a pool of call runners, results delivered until taken.

* **hello**: registers the agent's public key (the first time) and says who the site is; while the control plane
  cannot be reached it is tried again with back-off (1 s doubling to 15 s, forever), logged once per minute.
* **the poller**: one thread asks ``/work`` for as many calls as there are free slots (``FXPILOT_AGENT_SLOTS``),
  waiting up to 20 s for one; each call goes to the pool.
* **a call**: run, put, get or contact on its node (runners.agent.nodes); a run's output is posted every 0.5 s
  (an empty keep-alive every 5 s); ``{"cancel": true}`` or 410 stops the command. Its result is posted with the same
  back-off until the control plane answers 2xx (taken) or 410 (no longer wanted; dropped, logged): a network cut or
  a restart of the control plane loses nothing the control plane still waits for.
* **SIGTERM / SIGINT**: no new work; the running calls get 30 s to finish and post; exit 0.
"""
from __future__ import annotations

import argparse
import base64
import logging
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from runners import sealing
from runners.agent import VERSION
from runners.agent import config as agent_config
from runners.agent.client import ControlPlane, Gone, Refused, Unauthorized, Unavailable
from runners.agent.nodes import AgentError, Connections, NodeSpec, Stopped

log = logging.getLogger("fxpilot.agent")

POLL_WAIT = 20.0
OUTPUT_EVERY = 0.5
KEEPALIVE_EVERY = 5.0
GRACE = 30.0
BACKOFF_FIRST, BACKOFF_MAX = 1.0, 15.0
AWAY_LOG_EVERY = 60.0
OUTPUT_POST_MAX = 256 * 1024  # bytes of one stream per post (base64 keeps a post under the API's 1 MiB)
OUTPUT_HELD_MAX = 8 << 20  # output held while the control plane is away, per stream


class Fatal(Exception):
    """The control plane refuses this agent for good (revoked token, another key): stop."""


class _Dropped(Exception):
    """The control plane no longer wants this call (410, or it is not this agent's): stop working on it."""


def backoff():
    delay = BACKOFF_FIRST
    while True:
        yield delay
        delay = min(delay * 2, BACKOFF_MAX)


class Away:
    """Whether the control plane answers; says so when it goes away, once a minute while away, and when it is back."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.since: float | None = None
        self._logged = 0.0

    def failed(self, exc: Exception) -> None:
        now = time.monotonic()
        with self._lock:
            if self.since is None:
                self.since = self._logged = now
                log.warning("the control plane cannot be reached (%s); trying again", exc)
            elif now - self._logged >= AWAY_LOG_EVERY:
                self._logged = now
                log.warning("the control plane still cannot be reached after %.0f s (%s); trying again",
                            now - self.since, exc)

    def back(self) -> None:
        with self._lock:
            if self.since is not None:
                log.info("the control plane answers again after %.0f s", time.monotonic() - self.since)
                self.since = None


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Agent:
    def __init__(self, config: agent_config.Config, private_key: str, *, client: ControlPlane | None = None,
                 connections: Connections | None = None) -> None:
        self.config = config
        self.private_key = private_key
        self.public_key = sealing.public_of(private_key)
        self.client = client or ControlPlane(config)
        self.connections = connections or Connections(private_key, policy=config.policy)
        self.stopping = threading.Event()  # take no new work
        self.forced = threading.Event()  # the grace is over: give up what is still retrying
        self.away = Away()
        self.fatal: str | None = None
        self.site: dict = {}
        self._busy = 0
        self._slots = threading.Condition()
        self._pool = ThreadPoolExecutor(max_workers=config.slots, thread_name_prefix="call")

    # --- the life of the process ---

    def stop(self, why: str = "") -> None:
        if self.stopping.is_set() and why:
            log.warning("%s again: leaving now, without waiting for the running calls", why)
            self.forced.set()
            with self._slots:
                self._slots.notify_all()
            return
        if not self.stopping.is_set():
            if why:
                log.info("%s: taking no new work; the request for work under way and %d call(s) running get up "
                         "to %.0f s", why, self.busy, GRACE)
            self.stopping.set()
            with self._slots:
                self._slots.notify_all()

    def fail(self, message: str) -> None:
        self.fatal = message
        log.error("%s", message)
        self.stop()

    @property
    def busy(self) -> int:
        with self._slots:
            return self._busy

    def run(self) -> int:
        log.info("fxpilot site agent %s: control plane %s, agent key %s, %d slot(s); connects to %s", VERSION,
                 self.config.url, sealing.fingerprint(self.public_key), self.config.slots,
                 self.config.policy.describe())
        if self.config.insecure_transport():
            log.warning("FXPILOT_AGENT_URL is plain http to another machine: the token crosses the network in clear")
        if not self.hello_until_answered(starting=True):
            return self._finish()
        poller = threading.Thread(target=self.poll_loop, name="poller", daemon=True)
        poller.start()
        while not self.stopping.wait(1.0):
            pass
        deadline = time.monotonic() + GRACE
        # The request for work under way is waited for (up to its 20 s): the control plane takes calls for it as
        # they come, and a call taken for an agent that has gone would only be given up when it falls silent.
        # What it brings is run within the grace.
        while poller.is_alive() and time.monotonic() < deadline and not self.forced.is_set():
            poller.join(0.25)
        if poller.is_alive():
            self.client.abort()
        return self._finish(deadline)

    def _finish(self, deadline: float | None = None) -> int:
        deadline = deadline or time.monotonic() + GRACE
        with self._slots:
            while self._busy and time.monotonic() < deadline and not self.forced.is_set():
                self._slots.wait(min(1.0, max(0.0, deadline - time.monotonic())))
            left = self._busy
        self.forced.set()
        if left:
            log.warning("%d call(s) still running after %.0f s; leaving them (the control plane will see them "
                        "fall silent)", left, GRACE)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.connections.close_all()
        if self.fatal:
            return 1
        log.info("stopped")
        return 0

    def hello(self, *, starting: bool = False) -> dict:
        try:
            answer = self.client.hello(self.public_key, starting=starting)
        except Unauthorized as exc:
            raise Fatal(f"the control plane refuses this agent's token ({exc}); was it revoked? Make a new one "
                        "with `python manage.py site_agent SITE --print-env`") from None
        except Gone as exc:
            raise Fatal(f"the control plane refuses this agent ({exc})") from None
        except Refused as exc:
            if exc.status == 409:
                raise Fatal(f"the control plane has another key for this token ({exc}); the state folder "
                            f"{self.config.state} is not the one this token was enrolled with") from None
            raise Fatal(f"the control plane refuses the hello ({exc})") from None
        self.site = answer if isinstance(answer, dict) else {}
        return self.site

    def hello_until_answered(self, *, starting: bool = False) -> bool:
        delays = backoff()
        while not self.stopping.is_set():
            try:
                site = self.hello(starting=starting)
            except Unavailable as exc:
                self.away.failed(exc)
                self.stopping.wait(next(delays))
                continue
            except Fatal as exc:
                self.fail(str(exc))
                return False
            self.away.back()
            resealed = site.get("resealed") or 0
            log.info("serving site %s%s", site.get("site", "?"),
                     f"; the control plane sealed {resealed} key(s) to this agent" if resealed else "")
            return True
        return False

    # --- taking work ---

    def poll_loop(self) -> None:
        delays = backoff()
        while not self.stopping.is_set():
            self.connections.reap()
            with self._slots:
                while self._busy >= self.config.slots and not self.stopping.is_set():
                    self._slots.wait(1.0)
                    self.connections.reap()
                free = self.config.slots - self._busy
            if self.stopping.is_set():
                break
            try:
                calls = self.client.work(free, POLL_WAIT)
            except Unavailable as exc:
                if self.stopping.is_set():
                    break
                self.away.failed(exc)
                self.stopping.wait(next(delays))
                continue
            except Unauthorized as exc:
                self.fail(f"the control plane refuses this agent's token ({exc}); was it revoked?")
                break
            except Refused as exc:
                if exc.status == 409 and self.hello_until_answered():  # it forgot the key: say hello again
                    continue
                log.warning("the control plane refused the request for work (%s); trying again", exc)
                self.stopping.wait(next(delays))
                continue
            self.away.back()
            delays = backoff()
            for call in calls[:free]:
                self.submit(call)

    def submit(self, call: dict) -> None:
        with self._slots:
            self._busy += 1
        try:
            self._pool.submit(self._run_call, call)
        except RuntimeError:  # the pool is shut down: the grace is over
            self._release()

    def _release(self) -> None:
        with self._slots:
            self._busy -= 1
            self._slots.notify_all()

    def _run_call(self, call: dict) -> None:
        try:
            self.handle(call)
        except Exception:  # noqa: BLE001 — one call's bug must not take a slot away for good
            log.exception("call %s failed in the agent", call.get("id") if isinstance(call, dict) else call)
        finally:
            self._release()

    # --- one call ---

    def handle(self, call: dict) -> None:
        call_id = call.get("id") if isinstance(call, dict) else None
        if call_id is None:
            log.warning("the control plane sent a call without an id; ignored")
            return
        op = call.get("op")
        started = time.monotonic()
        node_name = (call.get("node") or {}).get("name", "?") if isinstance(call.get("node"), dict) else "?"
        args = call.get("args") if isinstance(call.get("args"), dict) else {}
        log.info("call %s: %s on %s%s", call_id, op, node_name,
                 f": `{_short(args.get('command', ''))}`" if op == "run" else
                 f": {_short(args.get('path', ''))}" if op in ("put", "get") else "")
        # Every call says it is alive every 5 s while it lasts (a handshake, a transfer): the control plane gives
        # up on a taken call that falls silent. A run's output goes the same way.
        pump = OutputPump(self, call_id)
        pump.start()
        try:
            try:
                spec = NodeSpec.parse(call.get("node"))
                if op == "run":
                    result = self.do_run(call_id, spec, args, pump)
                elif op == "put":
                    result = self.do_put(call_id, spec, args)
                elif op == "get":
                    result = self.do_get(call_id, spec, args)
                elif op == "contact":
                    self.connections.call(spec, lambda conn: None)
                    result = {}
                else:
                    raise AgentError("invalid", f"this agent does not know the operation {op!r} "
                                                f"(agent version {VERSION})")
            finally:
                pump.finish()  # the output before the result: the log stays in order
        except AgentError as exc:
            result = exc.report()
        except Stopped as exc:
            result = {"error": {"kind": "connection-lost", "message": f"{exc} at the control plane's request"}}
        except _Dropped as exc:
            log.info("call %s: dropped (%s)", call_id, exc)
            return
        except Exception as exc:  # noqa: BLE001 — reported, so the control plane is not left waiting
            log.exception("call %s: the agent failed", call_id)
            result = {"error": {"kind": "io", "message": f"the site agent failed: {type(exc).__name__}: {exc}"}}
        took = time.monotonic() - started
        if "error" in result:
            log.info("call %s: %s after %.1f s: %s", call_id, result["error"]["kind"], took,
                     _short(result["error"]["message"], 300))
        else:
            log.info("call %s: done in %.1f s%s", call_id, took,
                     f", exit {result['exit_code']}" if "exit_code" in result else "")
        self.deliver(call_id, "done", lambda: self.client.done(call_id, result))

    def deliver(self, call_id, what: str, send) -> bool:
        """``send()`` until the control plane takes it (True) or does not want it (410 or refused: False).

        While the control plane is away it is tried again with back-off, until the grace after a stop is over."""
        delays = backoff()
        while True:
            try:
                send()
                self.away.back()
                return True
            except Gone as exc:
                log.info("call %s: the control plane no longer waits for its %s (%s); dropped", call_id, what, exc)
                return False
            except Unauthorized as exc:
                self.fail(f"the control plane refuses this agent's token ({exc}); was it revoked?")
                return False
            except Refused as exc:
                log.warning("call %s: the control plane refused its %s (%s); dropped", call_id, what, exc)
                return False
            except Unavailable as exc:
                self.away.failed(exc)
            if self.forced.wait(next(delays)):
                log.warning("call %s: its %s could not be delivered before the agent stopped", call_id, what)
                return False

    def persist(self, call_id, attempt):
        """``attempt()`` again while the control plane is away (fetching a payload, uploading a file)."""
        delays = backoff()
        while True:
            try:
                return attempt()
            except Gone as exc:
                raise _Dropped(f"410: {exc}") from None
            except Unauthorized as exc:
                self.fail(f"the control plane refuses this agent's token ({exc}); was it revoked?")
                raise _Dropped(str(exc)) from None
            except Unavailable as exc:
                self.away.failed(exc)
            if self.forced.wait(next(delays)):
                raise _Dropped("the agent stopped before the control plane could be reached")

    def do_run(self, call_id, spec: NodeSpec, args: dict, pump: OutputPump) -> dict:
        command = args.get("command")
        timeout = args.get("timeout")
        try:
            timeout = float(timeout) if timeout else None
        except (TypeError, ValueError):
            raise AgentError("invalid", f"the run's timeout {timeout!r} is not a number") from None
        code = self.connections.call(spec, lambda conn: conn.run(command, timeout=timeout, output=pump.add,
                                                                  stop=pump.stop))
        pump.finish()
        if pump.gone:
            raise _Dropped("the control plane no longer waits for the command (410)")
        return {"exit_code": code}

    def do_put(self, call_id, spec: NodeSpec, args: dict) -> dict:
        path = args.get("path")
        mode = args.get("mode")
        if isinstance(mode, str):
            try:
                mode = int(mode, 8)
            except ValueError:
                raise AgentError("invalid", f"the put's mode {mode!r} is not an octal number") from None
        size = args.get("size")

        def attempt():
            def work(conn):
                with self.client.payload(call_id) as payload:
                    return conn.put(payload, path, sha256=args.get("sha256"), mode=mode,
                                    size=int(size) if size is not None else None)
            return self.connections.call(spec, work)

        return {"sha256": self.persist(call_id, attempt)}

    def do_get(self, call_id, spec: NodeSpec, args: dict) -> dict:
        path = args.get("path")

        def attempt():
            def work(conn):
                with conn.reader(path) as remote:
                    try:
                        return self.client.upload_file(call_id, remote, remote.size)
                    except Refused as exc:
                        if isinstance(exc, (Gone, Unauthorized)):
                            raise
                        raise AgentError("io", f"the control plane refused {path} ({remote.size} bytes): {exc}") from None
            return self.connections.call(spec, work)

        self.persist(call_id, attempt)
        return {}


class OutputPump(threading.Thread):
    """Posts a running command's output every 0.5 s (an empty keep-alive every 5 s); sets ``stop`` when told to."""

    def __init__(self, agent: Agent, call_id) -> None:
        super().__init__(name=f"output-{call_id}", daemon=True)
        self.agent = agent
        self.call_id = call_id
        self.stop = threading.Event()
        self.gone = False
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._held = {"stdout": bytearray(), "stderr": bytearray()}
        self._dropped = {"stdout": 0, "stderr": 0}

    def add(self, stream: str, data: bytes) -> None:
        with self._lock:
            held = self._held[stream]
            held.extend(data)
            if len(held) > OUTPUT_HELD_MAX:
                cut = len(held) - OUTPUT_HELD_MAX
                del held[:cut]
                self._dropped[stream] += cut

    def _take(self) -> dict:
        body = {}
        with self._lock:
            for stream, held in self._held.items():
                if self._dropped[stream]:
                    note = (f"\n[fxpilot agent: {self._dropped[stream]} bytes of {stream} dropped while the control "
                            "plane could not be reached]\n").encode()
                    held[:0] = note
                    self._dropped[stream] = 0
                if held:
                    body[stream] = bytes(held[:OUTPUT_POST_MAX])
                    del held[:OUTPUT_POST_MAX]
        return body

    def _put_back(self, body: dict) -> None:
        with self._lock:
            for stream, data in body.items():
                self._held[stream][:0] = data

    def _pending(self) -> bool:
        with self._lock:
            return any(self._held.values())

    def _post(self, body: dict) -> None:
        answer = self.agent.client.output(self.call_id, {k: base64.b64encode(v).decode() for k, v in body.items()})
        if isinstance(answer, dict) and answer.get("cancel"):
            if not self.stop.is_set():
                log.info("call %s: the control plane asks to stop the command", self.call_id)
            self.stop.set()

    def run(self) -> None:
        last = time.monotonic()
        delays = None
        wait = OUTPUT_EVERY
        while not self._done.wait(0.1):
            now = time.monotonic()
            if now - last < wait or (not self._pending() and now - last < KEEPALIVE_EVERY):
                continue
            body = self._take()
            last = now
            try:
                self._post(body)
            except Gone:
                self.gone = True
                self.stop.set()
                return
            except Unauthorized as exc:
                self.agent.fail(f"the control plane refuses this agent's token ({exc}); was it revoked?")
                self.gone = True
                self.stop.set()
                return
            except Refused as exc:
                log.warning("call %s: the control plane refused its output (%s); stopping the command", self.call_id, exc)
                self.gone = True
                self.stop.set()
                return
            except Unavailable as exc:
                self._put_back(body)
                self.agent.away.failed(exc)
                delays = delays or backoff()
                wait = next(delays)
                continue
            self.agent.away.back()
            delays, wait = None, OUTPUT_EVERY
            if self._pending():
                last = 0.0  # more than one post's worth is waiting: send it now

    def finish(self) -> None:
        """Stop the thread, then deliver what it had not posted (before the result: the log stays in order)."""
        self._done.set()
        if self.is_alive():
            self.join()
        if self.gone:
            return
        while self._pending():
            body = self._take()
            if not self.agent.deliver(self.call_id, "output", lambda b=body: self._post(b)):
                self.gone = self.gone or not self.agent.forced.is_set()
                return


# --- the command line -------------------------------------------------------------------------

def setup_logging() -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("paramiko").setLevel(logging.WARNING)


def check(config: agent_config.Config) -> int:
    """--check: the configuration, the key, one hello; prints the site and the key's fingerprint."""
    try:
        private_key, made = agent_config.load_or_make_key(config)
    except agent_config.ConfigError as exc:
        print(f"fxpilot agent: {exc}", file=sys.stderr)
        return 1
    public = sealing.public_of(private_key)
    agent = Agent(config, private_key, client=ControlPlane(config, timeout=15.0))
    try:
        site = agent.hello()
    except (Fatal, Unavailable) as exc:
        print(f"fxpilot agent: {config.url} did not accept the hello: {exc}", file=sys.stderr)
        return 1
    finally:
        agent._pool.shutdown(wait=False)
    print(f"site: {site.get('site', '?')}" + (f" ({site['site_code']})" if site.get("site_code") else ""))
    print(f"agent key: {sealing.fingerprint(public)}" + (" (made now)" if made else ""))
    print(f"control plane: {config.url}")
    if config.insecure_transport():
        print("warning: plain http to another machine: the token crosses the network in clear")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runners.agent",
        description="The fxpilot site agent: performs its site's calls on the site's nodes over SSH. Configured only "
                    "by FXPILOT_AGENT_URL, FXPILOT_AGENT_TOKEN, FXPILOT_AGENT_STATE, optionally FXPILOT_AGENT_CA "
                    "and FXPILOT_AGENT_SLOTS.")
    parser.add_argument("--check", action="store_true",
                        help="check the configuration, reach /hello once, print the site and the key; exit 0 or 1")
    args = parser.parse_args(argv)
    try:
        config = agent_config.load()
    except agent_config.ConfigError as exc:
        print(f"fxpilot agent: {exc}", file=sys.stderr)
        return 1 if args.check else 2
    if args.check:
        return check(config)
    setup_logging()
    try:
        private_key, made = agent_config.load_or_make_key(config)
    except agent_config.ConfigError as exc:
        log.error("%s", exc)
        return 2
    if made:
        log.info("made the agent's key in %s", config.key_path)
    agent = Agent(config, private_key)

    def on_signal(signum, frame) -> None:
        agent.stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return agent.run()
