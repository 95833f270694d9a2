"""A vendor lead creates a pilot in the portal: the lifecycle gives it its plan and four gates; nobody else may."""
from __future__ import annotations

import datetime

from django.urls import reverse

from gates.models import AuditEvent, Organisation, Pilot


def _form(demo, **changes) -> dict:
    customer = Organisation.objects.get(name="Example Cloud (demo customer)")
    return {"name": "Second pilot", "customer": customer.pk, "plan": "default", "start_date": "2027-01-04",
            "customer_engineers": [demo.carol.pk], "customer_approvers": [demo.bob.pk], **changes}


def test_a_vendor_lead_creates_a_pilot_with_its_plan_and_four_gates(demo, client):
    client.force_login(demo.alice)  # vendor engineer and lead
    assert reverse("pilot_new") in client.get(reverse("home")).content.decode()
    page = client.get(reverse("pilot_new")).content.decode()
    assert "Unrelated Customer Ltd" in page and 'value="default"' in page
    response = client.post(reverse("pilot_new"), _form(demo))
    pilot = Pilot.objects.get(name="Second pilot")
    assert response.status_code == 302 and response.url == reverse("pilot", args=[pilot.code])
    assert pilot.vendor == demo.pilot.vendor and pilot.start_date == datetime.date(2027, 1, 4)
    assert pilot.state == Pilot.State.DRAFT and pilot.latest_plan.number == 1 and pilot.latest_plan.criteria.exists()
    assert sorted(pilot.gates.values_list("number", flat=True)) == [1, 2, 3, 4]
    assert AuditEvent.objects.filter(action="pilot.created", object_id=str(pilot.pk)).exists()
    for name in ("pilot", "plan"):
        assert client.get(reverse(name, args=[pilot.code])).status_code == 200
    assert client.get(reverse("gate", args=[pilot.code, 4])).status_code == 200
    client.force_login(demo.bob)  # added as the customer's approver
    assert client.get(reverse("plan", args=[pilot.code])).status_code == 200
    client.force_login(demo.charlie)  # approver of an unrelated customer
    for url in (reverse("pilot", args=[pilot.code]), reverse("plan", args=[pilot.code]),
                reverse("gate", args=[pilot.code, 1])):
        assert client.get(url).status_code == 404


def test_a_bad_form_names_the_field_and_creates_nothing(demo, client):
    client.force_login(demo.alice)
    page = client.post(reverse("pilot_new"), _form(demo, plan="../../etc/passwd", start_date="soon")).content.decode()
    assert "Select a valid choice" in page and "Enter a valid date" in page
    assert not Pilot.objects.filter(name="Second pilot").exists()


def test_only_a_vendor_lead_may_create_a_pilot(demo, client):
    for person in (demo.bob, demo.carol, demo.charlie):
        client.force_login(person)
        assert client.get(reverse("pilot_new")).status_code == 403
        assert client.post(reverse("pilot_new"), _form(demo)).status_code == 403
        assert reverse("pilot_new") not in client.get(reverse("home")).content.decode()
    assert not Pilot.objects.filter(name="Second pilot").exists()


def test_the_admin_offers_no_add_pilot(demo, client, django_user_model):
    admin = django_user_model.objects.create_superuser("root", "root@example.test", "x")
    client.force_login(admin)
    assert client.get(reverse("admin:gates_pilot_add")).status_code == 403
    assert reverse("admin:gates_pilot_add") not in client.get(reverse("admin:gates_pilot_changelist")).content.decode()
