"""A vendor lead creates a pilot in the portal: the lifecycle gives it its plan and four gates; nobody else may."""
from __future__ import annotations

import datetime

import pytest
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


# ── Organisations stay apart wherever a person is chosen (issue 27, item 1) ─────────────────


def _person_fields() -> set[tuple[str, str]]:
    """Every (form, field) of the portal's forms that names a person: a choice over the user model."""
    import inspect

    from django import forms as django_forms
    from django.contrib.auth import get_user_model

    from portal import forms

    found = set()
    for name, form in inspect.getmembers(forms, inspect.isclass):
        if issubclass(form, django_forms.BaseForm) and form.__module__ == forms.__name__:
            for field_name, field in form.base_fields.items():
                queryset = getattr(field, "queryset", None)
                if queryset is not None and queryset.model is get_user_model():
                    found.add((name, field_name))
    return found


def test_every_field_that_names_a_person_is_walked_below():
    # A new form naming a person must join the walk of the next test (and say which organisation its role is of).
    assert _person_fields() == {("NewPilotForm", "customer_engineers"), ("NewPilotForm", "customer_approvers")}


def test_no_form_accepts_a_person_of_another_organisation(demo, client, django_user_model):
    from gates.models import Membership
    from portal.forms import NewPilotForm

    stranger = django_user_model.objects.create_user("nobody", first_name="No", last_name="Body")  # of no organisation
    memberships = set(Membership.objects.values_list("user_id", "organisation_id", "role"))
    client.force_login(demo.alice)
    for form_name, field in sorted(_person_fields()):
        assert form_name == "NewPilotForm" and field in NewPilotForm.PERSON_FIELDS
        for person in (demo.charlie, demo.alice, stranger):  # another customer's approver, the vendor's, nobody's
            response = client.post(reverse("pilot_new"), _form(demo, **{field: [demo.bob.pk, person.pk]}))
            assert response.status_code == 200, (field, person)
            errors = response.context["form"].errors
            assert list(errors) == [field], (field, person, errors)
            page = response.content.decode()
            assert "only people of the chosen customer" in page or "Not a person of Example Cloud" in page
    assert not Pilot.objects.filter(name="Second pilot").exists()
    assert set(Membership.objects.values_list("user_id", "organisation_id", "role")) == memberships


def test_charlie_named_on_an_example_cloud_pilot_is_refused_by_name(demo, client):
    client.force_login(demo.alice)
    response = client.post(reverse("pilot_new"), _form(demo, customer_approvers=[demo.charlie.pk]))
    errors = response.context["form"].errors["customer_approvers"]
    assert errors == ["Not a person of Example Cloud (demo customer): Charlie Zhou (charlie). Only the customer's own "
                      "people may hold its roles."]
    client.force_login(demo.charlie)
    assert client.get(reverse("pilot", args=[demo.pilot.code])).status_code == 404


def test_the_pickers_offer_people_by_name_and_organisation(demo, client):
    import html
    import re

    client.force_login(demo.alice)
    page = client.get(reverse("pilot_new")).content.decode()
    for field in ("customer_engineers", "customer_approvers"):
        select = re.search(rf'<select name="{field}"[^>]*>(.*?)</select>', page, re.S).group(1)
        assert re.findall(r'<optgroup label="([^"]*)">', select) == ["Example Cloud (demo customer)",
                                                                   "Unrelated Customer Ltd"]
        offered = [html.unescape(label) for label in re.findall(r"<option [^>]*>(.*?)</option>", select)]
        # by name and organisation, never a bare user name; the vendor's people hold no customer role
        assert offered == ["Bob Wang (bob) — Example Cloud (demo customer)",
                           "Carol Li (carol) — Example Cloud (demo customer)",
                           "Charlie Zhou (charlie) — Unrelated Customer Ltd"], field


def test_the_lifecycle_gives_a_role_only_to_a_person_of_its_organisation(demo):
    from gates import lifecycle
    from gates.models import Membership, Role

    before = Membership.objects.count()
    for person, role in ((demo.charlie, Role.CUSTOMER_APPROVER), (demo.alice, Role.CUSTOMER_ENGINEER),
                         (demo.bob, Role.VENDOR_LEAD), (demo.carol, Role.VIEWER)):
        with pytest.raises(lifecycle.TransitionRefused) as refused:
            lifecycle.add_pilot_member(demo.pilot, person, role)
        assert refused.value.rule in ("member-organisation", "member-role")
    assert Membership.objects.count() == before
    lifecycle.add_pilot_member(demo.pilot, demo.carol, Role.CUSTOMER_APPROVER)  # her own customer: allowed
    assert Membership.objects.filter(user=demo.carol, organisation=demo.pilot.customer,
                                     role=Role.CUSTOMER_APPROVER).exists()


def test_behind_the_form_the_lifecycle_refuses_too_and_nothing_is_created(demo, client, monkeypatch, django_user_model):
    from gates.models import Membership

    monkeypatch.setattr("portal.forms.people_of", lambda organisation: django_user_model.objects.all())
    client.force_login(demo.alice)
    response = client.post(reverse("pilot_new"), _form(demo, customer_approvers=[demo.bob.pk, demo.charlie.pk]))
    assert response.status_code == 200
    assert "is not a person of Example Cloud" in " ".join(response.context["form"].errors["customer_approvers"])
    assert not Pilot.objects.filter(name="Second pilot").exists()
    assert not Membership.objects.filter(user=demo.charlie, organisation=demo.pilot.customer).exists()


def test_the_refusal_reads_in_chinese_too(demo):
    from django.utils import translation

    from portal.forms import NewPilotForm

    vendor = demo.pilot.vendor
    with translation.override("zh-hans"):
        form = NewPilotForm(vendor, _form(demo, customer_approvers=[demo.charlie.pk]))
        assert not form.is_valid()
        assert form.errors["customer_approvers"] == [
            "不是 Example Cloud (demo customer) 的人员：Charlie Zhou (charlie)。只有该客户自己的人员才能担任其角色。"]
        form = NewPilotForm(vendor, _form(demo, customer_engineers=[demo.alice.pk]))
        assert not form.is_valid() and "只有所选客户组织的人员" in form.errors["customer_engineers"][0]
