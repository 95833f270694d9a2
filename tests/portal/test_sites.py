"""Sites, nodes and credentials: strict validation, keys never shown back, host keys accepted explicitly."""

from __future__ import annotations

from django.urls import reverse

from gates.models import AuditEvent
from runners.config import default_simulated
from runners.engine import contact_node
from runners.models import Credential, Node, Site
from tests.portal.conftest import private_key_text


def post_node(client, site, **fields):
    data = {"name": "node2", "host": "10.0.0.2", "port": "22", "username": "fx", "role": "gpu", **fields}
    return client.post(
        reverse("node_create", args=[site.code]), {f"n-{site.code}-{k}": v for k, v in data.items()}, follow=True
    )


def test_a_vendor_engineer_adds_a_site(client, world):
    client.force_login(world.alice)
    client.post(reverse("site_create", args=[world.pilot.code]), {"name": "DC 2", "queue": "dc-2"})
    assert Site.objects.filter(pilot=world.pilot, queue="dc-2").exists()


def test_a_site_queue_already_used_is_refused(client, world):
    client.force_login(world.alice)
    response = client.post(
        reverse("site_create", args=[world.pilot.code]), {"name": "Dup", "queue": world.site.queue}, follow=True
    )
    assert "already used" in response.content.decode()


def test_a_node_with_a_valid_address_is_added(client, world):
    client.force_login(world.alice)
    post_node(client, world.site, credential=str(world.credential.pk))
    node = Node.objects.get(site=world.site, name="node2")
    assert node.credential == world.credential and node.host_key_state == Node.HostKeyState.UNKNOWN
    assert AuditEvent.objects.filter(action="node.created").exists()


def test_a_host_that_is_not_a_host_name_is_refused_with_its_value(client, world):
    client.force_login(world.alice)
    response = post_node(client, world.site, host="bad host;rm -rf /")
    assert "bad host;rm -rf /" in response.content.decode()
    assert not Node.objects.filter(name="node2").exists()


def test_a_port_out_of_range_and_a_bad_user_name_are_refused(client, world):
    client.force_login(world.alice)
    page = post_node(client, world.site, port="70000", username="$(id)").content.decode()
    assert "SSH port" in page and "User name" in page
    assert not Node.objects.filter(name="node2").exists()


def test_a_credential_of_another_site_cannot_be_chosen(client, world):
    other = Site.objects.create(pilot=world.pilot, name="Other", queue="other-q")
    client.force_login(world.alice)
    post_node(client, other, credential=str(world.credential.pk))
    assert not Node.objects.filter(site=other).exists()


def test_a_private_key_is_stored_encrypted_and_never_shown_back(client, world):
    client.force_login(world.alice)
    key = private_key_text()
    prefix = f"c-{world.site.code}"
    client.post(
        reverse("credential_create", args=[world.site.code]), {f"{prefix}-name": "second", f"{prefix}-private_key": key}
    )
    credential = Credential.objects.get(name="second")
    body = key.splitlines()[1]
    assert body not in credential.private_key_encrypted
    for name, args in (("sites", [world.pilot.code]), ("audit", [world.pilot.code]), ("node", [world.node.code])):
        page = client.get(reverse(name, args=args)).content.decode()
        assert body not in page and "PRIVATE KEY" not in page
    assert credential.public_fingerprint in client.get(reverse("sites", args=[world.pilot.code])).content.decode()


def test_a_file_that_is_not_a_private_key_is_refused_and_nothing_is_stored(client, world):
    client.force_login(world.alice)
    prefix = f"c-{world.site.code}"
    response = client.post(
        reverse("credential_create", args=[world.site.code]),
        {f"{prefix}-name": "bad", f"{prefix}-private_key": "ssh-ed25519 AAAA public"},
        follow=True,
    )
    assert "not a private key" in response.content.decode()
    assert not Credential.objects.filter(name="bad").exists()


def test_the_waiting_host_key_is_shown_with_its_fingerprint_and_accepted_by_the_engineer(client, world):
    client.force_login(world.alice)
    page = client.get(reverse("node", args=[world.node.code])).content.decode()
    assert "SHA256:examplefingerprint" in page
    client.post(reverse("node_accept_host_key", args=[world.node.code]), {"fingerprint": "SHA256:examplefingerprint"})
    world.node.refresh_from_db()
    assert world.node.host_key_state == Node.HostKeyState.ACCEPTED and world.node.host_key_accepted_by == world.alice
    assert AuditEvent.objects.filter(action="node.host_key_accepted").exists()


def test_a_host_key_other_than_the_one_shown_is_not_accepted(client, world):
    client.force_login(world.alice)
    response = client.post(
        reverse("node_accept_host_key", args=[world.node.code]), {"fingerprint": "SHA256:other"}, follow=True
    )
    world.node.refresh_from_db()
    assert world.node.host_key_state == Node.HostKeyState.PENDING
    assert "SHA256:examplefingerprint" in response.content.decode()


def test_the_node_page_shows_the_inventory_of_the_last_probe(client, world):
    Node.objects.filter(pk=world.node.pk).update(
        inventory={
            "schema": "fxpilot.inventory/1",
            "simulated": True,
            "gpus": {"count": 8, "model": "AMD Instinct MI308X"},
            "rocm": "7.2.1",
            "nics": [{"name": "ens1f0np0", "state": "up", "speed_gbps": 100}],
            "fio": {"fx": {"read_gbps": 21.3}},
        }
    )
    client.force_login(world.carol)
    page = client.get(reverse("node", args=[world.node.code])).content.decode()
    assert "AMD Instinct MI308X" in page and "7.2.1" in page and "100 Gb/s" in page and "21.3" in page


def test_contacting_a_new_node_records_its_host_key_for_acceptance(client, world, simnodes, user_key):
    from runners.credentials import create_credential

    server = simnodes(1)[0]
    credential = create_credential(world.site, "sim key", user_key.text)
    node = Node.objects.create(
        site=world.site,
        name="sim1",
        host="127.0.0.1",
        port=server.port,
        username=server.username,
        credential=credential,
        simulated=True,
    )
    client.force_login(world.alice)
    page = client.post(reverse("node_contact", args=[node.code]), follow=True).content.decode()
    # The portal only asks: the site's worker connects (here, the task's body runs in this process).
    assert "Waiting for the worker of site" in page and server.fingerprint not in page
    assert contact_node(node.pk) == "pending-key"
    page = client.get(reverse("node", args=[node.code])).content.decode()
    node.refresh_from_db()
    assert node.host_key_state == Node.HostKeyState.PENDING
    assert node.pending_host_key_fingerprint == server.fingerprint and server.fingerprint in page
    client.post(reverse("node_accept_host_key", args=[node.code]), {"fingerprint": server.fingerprint})
    client.post(reverse("node_contact", args=[node.code]))
    assert contact_node(node.pk) == "ok"
    page = client.get(reverse("node", args=[node.code])).content.decode()
    assert "answered with its accepted host key" in page


def test_an_unreachable_node_is_reported_by_name(client, world):
    node = Node.objects.create(
        site=world.site, name="gone", host="127.0.0.1", port=1, username="fx", credential=world.credential
    )
    client.force_login(world.alice)
    client.post(reverse("node_contact", args=[node.code]))
    assert contact_node(node.pk) == "error"
    page = client.get(reverse("node", args=[node.code])).content.decode()
    assert "gone" in page and "msg error" in page


# ── A site's queue is never the control tier's (issue 27, item 5) ───────────────────────────


def test_the_control_queue_is_refused_for_a_site_naming_the_field(client, world, settings):
    from django.conf import settings as django_settings

    assert django_settings.CELERY_TASK_DEFAULT_QUEUE == "fxpilot"
    client.force_login(world.alice)
    for queue in ("fxpilot", "FXPILOT", "celery", "unacked"):
        page = client.post(reverse("site_create", args=[world.pilot.code]), {"name": f"Web tier {queue}", "queue": queue},
                           follow=True).content.decode()
        assert "Celery queue:" in page and "a queue of the portal" in page, queue
    assert not Site.objects.filter(name__startswith="Web tier").exists()
    assert not AuditEvent.objects.filter(action="site.created", detail__queue="fxpilot").exists()


def test_the_site_form_and_the_model_refuse_the_control_queue(world, settings):
    import pytest
    from django.core.exceptions import ValidationError

    from portal.forms import SiteForm

    form = SiteForm({"name": "Control", "queue": "fxpilot"})
    assert not form.is_valid() and list(form.errors) == ["queue"]
    site = Site(pilot=world.pilot, name="Control", queue="fxpilot")
    with pytest.raises(ValidationError) as refused:
        site.full_clean()
    assert list(refused.value.message_dict) == ["queue"]
    # the control queue is whatever the settings name, not a literal
    settings.CELERY_TASK_DEFAULT_QUEUE = "control-7"
    assert not SiteForm({"name": "Control", "queue": "control-7"}).is_valid()
    assert SiteForm({"name": "Lab", "queue": "fxpilot-lab"}).is_valid()
    Site(pilot=world.pilot, name="Lab", queue="lab-7").full_clean()


COLD = {"seconds": 11.613, "caches": "empty", "measured_at": "2026-12-01T10:00:00Z", "time_scale": 0.03,
        "model": "Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8", "tensor_parallel_size": 8, "simulated": True}


def node_page(client, world, who=None, **cold) -> str:
    Node.objects.filter(pk=world.node.pk).update(cold_start=cold)
    client.force_login(who or world.carol)
    return client.get(reverse("node", args=[world.node.code])).content.decode()


def start_up_section(page: str) -> str:
    return page.split('id="start-up"', 1)[1].split("</section>", 1)[0]


def test_the_node_page_says_the_cold_start_g1_measured_and_the_health_wait_it_gives(client, world):
    world.pilot.deployment = {}
    world.pilot.save()
    job = world.pilot.jobs.first()
    section = start_up_section(node_page(client, world, **COLD, job=str(job.code)))
    assert "11.6 s from launch to /health, compile caches empty" in section
    assert "Simulated — not evidence" in section and "simulated at time scale ×0.03: 387 s of model time" in section
    assert "Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8, tensor parallel 8" in section and f"/runs/{job.code}/" in section
    # 2 × 11.6 s is less than the floor: the next deploys wait the floor
    assert "<strong>300 s</strong>" in section
    assert "the floor of 300 s, since 2 × the measured cold start (11.6 s) is less" in section


def test_a_real_nodes_measured_cold_start_sets_the_wait_and_before_g1_the_fixed_setting_holds(client, world):
    Node.objects.filter(pk=world.node.pk).update(simulated=False)
    world.pilot.deployment = {**default_simulated(), "health_timeout_s": 1500}
    world.pilot.save()
    section = start_up_section(node_page(client, world, **{**COLD, "seconds": 412.24, "time_scale": None,
                                                             "simulated": False}))
    assert "412.2 s from launch to /health" in section and "Simulated" not in section
    assert "<strong>825 s</strong>" in section and "2 × the measured cold start (412.2 s)" in section
    section = start_up_section(node_page(client, world))
    assert "Not measured yet: G1 measures the cold start" in section
    assert "<strong>1500 s</strong>" in section and "until G1 has measured this node's cold start" in section
    other = {**COLD, "seconds": 412.24, "model": "org/another-model"}
    section = start_up_section(node_page(client, world, **other))
    assert "<strong>1500 s</strong>" in section and "measured for another model" in section


def test_the_start_up_reads_in_chinese(client, world):
    from django.conf import settings

    from gates.models import Profile
    from tests.portal.test_zh_pages import page_sentences

    Profile.objects.update_or_create(user=world.alice, defaults={"language": "zh-hans"})
    client.cookies.load({settings.LANGUAGE_COOKIE_NAME: "zh-hans"})
    for cold in (COLD, {**COLD, "seconds": 2000.0, "time_scale": None, "simulated": False}, {}):
        page = node_page(client, world, world.alice, **cold)
        section = start_up_section(page)
        assert "冷启动" in section, section
        found = page_sentences(section, ["Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8"])
        assert not found, found
