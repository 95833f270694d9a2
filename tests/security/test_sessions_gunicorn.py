"""Sessions every web process shares: a real gunicorn with two workers and the production cache (Redis).

The portal, its database (SQLite in a private folder) and its users are set up by the project's own
commands in a subprocess; the test talks HTTP to gunicorn only. Each check is repeated 100 times, so a
worker keeping its own copy of a session would show up (two workers take the requests in turn).
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "fxpilot-demo"
pytestmark = pytest.mark.services
PORTAL_ENV: dict[str, str] = {}
TIMEOUT = 600  # seconds per request; CI machines are loaded


def _redis_url() -> str:
    broker = os.environ.get("CELERY_BROKER_URL", "")
    url = broker if broker.startswith("redis://") else "redis://127.0.0.1:6379/0"
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
    except redis.exceptions.ConnectionError:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no Redis at {url}")
    return url


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def portal(tmp_path_factory):
    data = tmp_path_factory.mktemp("gunicorn-portal")
    prefix = f"fxpilot-test-{uuid.uuid4().hex[:12]}"
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")},
        "FXPILOT_ENV": "test",
        "FXPILOT_DATA_DIR": str(data),
        "DATABASE_URL": f"sqlite:///{data / 'portal.sqlite3'}",
        "FXPILOT_CACHE_URL": _redis_url(),
        "FXPILOT_CACHE_PREFIX": prefix,
        "DJANGO_SETTINGS_MODULE": "fxpilot.settings",
    }
    PORTAL_ENV.clear()
    PORTAL_ENV.update(env)
    python = sys.executable
    subprocess.run([python, "manage.py", "migrate", "-v", "0"], cwd=REPO, env=env, check=True, timeout=600)
    subprocess.run([python, "manage.py", "seed_demo"], cwd=REPO, env=env, check=True, timeout=600,
                   stdout=subprocess.DEVNULL)
    port = _free_port()
    log = (data / "gunicorn.log").open("w")
    server = subprocess.Popen(
        [str(Path(python).with_name("gunicorn")), "fxpilot.wsgi", "-b", f"127.0.0.1:{port}", "-w", "2",
         "--access-logfile", "-"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while True:
        try:
            if requests.get(f"{base}/accounts/login/", timeout=10).status_code == 200:
                break
        except requests.RequestException:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise AssertionError("gunicorn did not start: " + (data / "gunicorn.log").read_text()[-2000:])
        time.sleep(0.2)
    try:
        yield base
    finally:
        server.terminate()
        server.wait(timeout=600)
        log.close()
        import redis

        client = redis.Redis.from_url(env["FXPILOT_CACHE_URL"])
        keys = list(client.scan_iter(match=f"{prefix}:*"))
        if keys:
            client.delete(*keys)


def _csrf(session: requests.Session, base: str, path: str = "/accounts/login/") -> str:
    page = session.get(base + path, timeout=TIMEOUT).text
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)


def _login(base: str, username: str, password: str = PASSWORD) -> requests.Session:
    session = requests.Session()
    token = _csrf(session, base)
    response = session.post(base + "/accounts/login/", data={"username": username, "password": password,
                            "csrfmiddlewaretoken": token}, headers={"Referer": base + "/accounts/login/"},
                            allow_redirects=False, timeout=TIMEOUT)
    assert response.status_code == 302, response.text[:500]
    return session


def _pages(session: requests.Session, base: str) -> list[str]:
    home = session.get(base + "/", timeout=TIMEOUT).text
    pilot = re.search(r'href="(/pilots/[0-9a-f-]{36}/)"', home).group(1)
    return ["/", pilot, pilot + "plan/", pilot + "gates/1/", pilot + "reports/", pilot + "audit/", pilot + "sites/",
            "/reports/verify/"]


def test_after_logout_the_old_cookie_is_refused_on_100_of_100_requests(portal):
    session = _login(portal, "alice")
    cookie = session.cookies.get("sessionid")
    pages = _pages(session, portal)
    # Every worker serves the session before the logout (and would keep a copy, were the cache per process).
    before = [session.get(portal + pages[n % len(pages)], allow_redirects=False, timeout=TIMEOUT).status_code
              for n in range(40)]
    assert before == [200] * 40
    token = session.cookies.get("csrftoken")
    out = session.post(portal + "/accounts/logout/", data={"csrfmiddlewaretoken": token},
                       headers={"Referer": portal + "/"}, allow_redirects=False, timeout=TIMEOUT)
    assert out.status_code == 302
    stale = requests.Session()
    stale.cookies.set("sessionid", cookie)
    after = [stale.get(portal + pages[n % len(pages)], allow_redirects=False, timeout=TIMEOUT) for n in range(100)]
    statuses = [r.status_code for r in after]
    assert statuses == [302] * 100, statuses
    assert all("/accounts/login/" in r.headers["Location"] for r in after)


def test_a_password_change_ends_every_session_of_that_person_at_once(portal):
    first = _login(portal, "carol")
    second = _login(portal, "carol")
    assert first.get(portal + "/", allow_redirects=False, timeout=TIMEOUT).status_code == 200
    assert second.get(portal + "/", allow_redirects=False, timeout=TIMEOUT).status_code == 200
    # Changed elsewhere (admin, changepassword, a reset): no web process is told; the sessions still end.
    subprocess.run([sys.executable, "manage.py", "shell", "-c",
                    "from django.contrib.auth.models import User; u = User.objects.get(username='carol'); "
                    "u.set_password('a-new-long-passphrase-9'); u.save()"],
                   cwd=REPO, env=PORTAL_ENV, check=True, timeout=600)
    for session in (first, second):
        statuses = [session.get(portal + "/", allow_redirects=False, timeout=TIMEOUT).status_code for _ in range(50)]
        assert statuses == [302] * 50
    assert _login(portal, "carol", "a-new-long-passphrase-9").get(portal + "/", timeout=TIMEOUT).status_code == 200


def test_the_chosen_language_holds_on_every_page_and_every_worker(portal):
    session = _login(portal, "bob")
    pages = _pages(session, portal)
    token = session.cookies.get("csrftoken")
    chosen = session.post(portal + "/language/", data={"csrfmiddlewaretoken": token, "language": "zh-hans",
                          "next": "/"}, headers={"Referer": portal + "/"}, allow_redirects=False, timeout=TIMEOUT)
    assert chosen.status_code == 302
    # Without the language cookie: the choice must come from the shared session, not the browser.
    session.cookies.set("django_language", None)
    wrong = []
    for n in range(100):
        response = session.get(portal + pages[n % len(pages)], allow_redirects=False, timeout=TIMEOUT,
                               headers={"Accept-Language": "en"})
        if response.status_code != 200 or response.headers.get("Content-Language") != "zh-hans":
            wrong.append((pages[n % len(pages)], response.status_code, response.headers.get("Content-Language")))
    assert wrong == []


def test_five_failures_lock_a_name_out_whichever_worker_counts_them(portal):
    attempts = []
    for _ in range(7):
        session = requests.Session()
        token = _csrf(session, portal)
        response = session.post(portal + "/accounts/login/", allow_redirects=False, timeout=TIMEOUT,
                                headers={"Referer": portal + "/accounts/login/"},
                                data={"csrfmiddlewaretoken": token, "username": "charlie", "password": "wrong"})
        attempts.append(response.status_code)
    assert attempts == [200, 200, 200, 200, 429, 429, 429]
    session = requests.Session()
    token = _csrf(session, portal)
    right = session.post(portal + "/accounts/login/", allow_redirects=False, timeout=TIMEOUT,
                         headers={"Referer": portal + "/accounts/login/"},
                         data={"csrfmiddlewaretoken": token, "username": "charlie", "password": PASSWORD})
    assert right.status_code == 429
