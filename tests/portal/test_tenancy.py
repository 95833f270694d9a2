"""A person of another customer gets 404 on every URL that takes an id — found by walking the resolver,
so a new page cannot forget it — and every POST refuses a request without a CSRF token."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse

# Which object a route's `code` names, by the route's first segment.
CODE_OF = {
    "pilots": lambda w: w.pilot.code,
    "runs": lambda w: w.job.code,
    "artifacts": lambda w: w.artifact.code,
    "sites": lambda w: w.site.code,
    "nodes": lambda w: w.node.code,
    "reports": lambda w: w.report.code,
}
# admin is staff-only; the API has its own tenancy tests, and so has the site agents' API (a site's token, not a
# person: tests/agent); a password-reset link names a person by a signed token, not an organisation's object
# (tests/portal/test_accounts.py)
SKIP = ("admin/", "api/", "agent/", "accounts/reset/")


def _walk(patterns, prefix=""):
    for entry in patterns:
        route = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            yield from _walk(entry.url_patterns, route)
        elif isinstance(entry, URLPattern):
            yield route, entry


def id_taking_patterns() -> list[tuple[str, URLPattern]]:
    return [
        (route, p)
        for route, p in _walk(get_resolver().url_patterns)
        if p.pattern.converters and not route.startswith(SKIP)
    ]


def _kwargs(route: str, pattern: URLPattern, world) -> dict:
    kwargs = {}
    for name in pattern.pattern.converters:
        if name == "code" and route.startswith("reports/verify/"):
            kwargs[name] = world.verification.code  # alice's upload: only she may see it
        elif name == "code" and route.startswith("reports/jobs/"):
            kwargs[name] = world.report_job.code  # a countersignature's job: the pilot's people only
        elif name == "code":
            first = route.split("/", 1)[0]
            assert first in CODE_OF, f"{route}: add its object to CODE_OF so the tenancy walk covers it"
            kwargs[name] = CODE_OF[first](world)
        elif name == "number":
            kwargs[name] = 4 if "trace" in pattern.pattern.converters else 1
        elif name == "trace":
            kwargs[name] = world.trace.pk  # the customer's G4 trace: only the pilot's people may fetch it
        elif name == "key":
            kwargs[name] = "g1-gpu-count"
        elif name == "pk" and route.startswith("accounts/tokens/"):
            kwargs[name] = world.token.pk  # alice's API token: anyone else revoking it gets 404
        else:
            raise AssertionError(f"{route}: unknown URL parameter {name!r}; teach the tenancy walk about it")
    return kwargs


def test_the_walk_finds_the_portals_id_taking_pages():
    names = {p.name for _, p in id_taking_patterns()}
    assert {"pilot", "gate", "run", "run_log", "artifact_download", "report_download", "node", "gate_signoff"} <= names


def test_every_id_taking_url_answers_404_to_a_person_of_another_customer(client, world):
    client.force_login(world.charlie)
    checked = 0
    for route, pattern in id_taking_patterns():
        url = reverse(pattern.name, kwargs=_kwargs(route, pattern, world))
        got = client.get(url)
        if got.status_code == 405:  # a POST-only view: the POST must not find the object either
            got = client.post(url, {"decision": "approve", "comment": "x", "fingerprint": "x"})
        assert got.status_code == 404, f"{url} answered {got.status_code} to charlie"
        checked += 1
    assert checked >= 15


def test_the_same_urls_work_for_a_member(client, world):
    """The walk above proves something only if the ids are real: the vendor engineer reaches each one."""
    client.force_login(world.alice)
    for route, pattern in id_taking_patterns():
        url = reverse(pattern.name, kwargs=_kwargs(route, pattern, world))
        assert client.get(url).status_code in (200, 405), url


def post_urls(world) -> list[str]:
    urls = [reverse("set_language"), reverse("notifications_read"), reverse("logout"), reverse("login")]
    for route, pattern in id_taking_patterns():
        url = reverse(pattern.name, kwargs=_kwargs(route, pattern, world))
        urls.append(url)
    urls.append(reverse("report_verify"))
    return urls


@pytest.mark.parametrize("person", ["alice", "bob"])
def test_every_post_without_a_csrf_token_is_refused(world, person):
    client = Client(enforce_csrf_checks=True)
    client.force_login(getattr(world, person))
    for url in post_urls(world):
        response = client.post(url, {"decision": "approve", "comment": "x", "language": "zh-hans"})
        assert response.status_code in (403, 405), f"{url} accepted a POST without a CSRF token"
        if response.status_code == 403:
            assert b"CSRF" in response.content, url


def test_a_post_with_the_csrf_token_is_accepted(world):
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.bob)
    client.get(reverse("gate", args=[world.pilot.code, 1]))
    token = client.cookies["csrftoken"].value
    response = client.post(
        reverse("gate_signoff", args=[world.pilot.code, 1]),
        {"decision": "approve", "comment": "", "csrfmiddlewaretoken": token},
    )
    assert response.status_code == 302
