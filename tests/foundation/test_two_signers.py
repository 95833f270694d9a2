"""One person never signs for both parties (issue 27, item 5): the lifecycle refuses it where the signature is
recorded, for a plan version and for a gate's evidence, whatever order or party is asked; the pages do not offer it."""
from __future__ import annotations

import pytest
from django.urls import reverse

from gates import lifecycle
from gates.lifecycle import TransitionRefused
from gates.models import Evaluation, Gate, Organisation, Party, Pilot, PlanVersion, Role, SignOff
from gates.policy import Act


def _both_parties(demo):
    """alice, vendor lead, made an approver of the customer too: the model allows a person both signing roles."""
    customer = Organisation.objects.get(pk=demo.pilot.customer_id)
    lifecycle.add_member(demo.alice, customer, Role.CUSTOMER_APPROVER)
    return demo.alice


def _pass(gate: Gate) -> Evaluation:
    evaluation = Evaluation.objects.create(gate=gate, plan_version=gate.pilot.signed_plan, verdict="pass",
                                           result={"verdict": "pass", "criteria": [{"key": "k", "verdict": "pass"}]})
    lifecycle.record_verdict(gate, evaluation)
    gate.refresh_from_db()
    return evaluation


@pytest.mark.parametrize("first", [None, Party.VENDOR, Party.CUSTOMER])
def test_a_person_holding_both_signing_roles_signs_a_plan_for_one_party_only(demo, first):
    alice = _both_parties(demo)
    version = demo.pilot.latest_plan
    signed = lifecycle.sign_plan(version, alice, party=first)
    other = Party.CUSTOMER if signed.party == Party.VENDOR else Party.VENDOR
    for party in (None, other):
        with pytest.raises(TransitionRefused) as refused:
            lifecycle.sign_plan(version, alice, party=party)
        assert refused.value.rule == "two-signers"
        assert f"for the {signed.party} party" in refused.value.message and "another person" in refused.value.message
    version.refresh_from_db()
    assert version.state == PlanVersion.State.DRAFT
    assert list(version.signoffs.values_list("person__username", "party")) == [("alice", signed.party)]
    # the other party signs through another person: the plan is signed
    lifecycle.sign_plan(version, demo.bob if other == Party.CUSTOMER else _vendor_lead(demo), party=other)
    version.refresh_from_db()
    assert version.state == PlanVersion.State.SIGNED


def _vendor_lead(demo):
    from django.contrib.auth import get_user_model

    erin = get_user_model().objects.create_user("erin", first_name="Erin", last_name="Ma")
    lifecycle.add_member(erin, Organisation.objects.get(pk=demo.pilot.vendor_id), Role.VENDOR_LEAD)
    return erin


def test_a_rejected_plan_does_not_let_the_same_person_sign_for_the_other_party(demo):
    alice = _both_parties(demo)
    version = demo.pilot.latest_plan
    lifecycle.sign_plan(version, alice, party=Party.CUSTOMER, decision=SignOff.Decision.REJECT, comment="no")
    with pytest.raises(TransitionRefused) as refused:
        lifecycle.sign_plan(version, alice, party=Party.VENDOR)
    assert refused.value.rule == "two-signers"
    lifecycle.sign_plan(version, alice, party=Party.CUSTOMER)  # the same party again: her own word, allowed


@pytest.mark.parametrize("first", [None, Party.VENDOR, Party.CUSTOMER])
def test_a_person_holding_both_signing_roles_signs_off_a_gate_for_one_party_only(signed_pilot, first):
    demo = signed_pilot
    alice = _both_parties(demo)
    gate = demo.pilot.gate(1)
    evaluation = _pass(gate)
    signed = lifecycle.sign_off_gate(gate, alice, decision="approve", party=first)
    other = Party.CUSTOMER if signed.party == Party.VENDOR else Party.VENDOR
    for party in (None, other):
        with pytest.raises(TransitionRefused) as refused:
            lifecycle.sign_off_gate(gate, alice, decision="approve", party=party)
        assert refused.value.rule == "two-signers" and "G1" in refused.value.message
    gate.refresh_from_db()
    assert gate.state == Gate.State.AWAITING_SIGNOFF
    assert list(gate.signoffs.filter(evaluation=evaluation).values_list("person__username", "party")) == [
        ("alice", signed.party)]
    lifecycle.sign_off_gate(gate, demo.bob if other == Party.CUSTOMER else _vendor_lead(demo), decision="approve")
    gate.refresh_from_db()
    assert gate.state == Gate.State.SIGNED_OFF and Pilot.objects.get(pk=demo.pilot.pk).current_gate == 2


def test_the_pages_do_not_offer_the_second_party_and_its_post_is_refused(demo, client):
    from portal import access

    alice = _both_parties(demo)
    version = demo.pilot.latest_plan
    assert access.offers(demo.pilot, alice, Act.SIGN_PLAN, version)
    client.force_login(alice)
    client.post(reverse("plan_sign", args=[demo.pilot.code]), {"comment": "vendor"})
    assert list(version.signoffs.values_list("party", flat=True)) == [Party.VENDOR]
    pilot = Pilot.objects.get(pk=demo.pilot.pk)
    assert not access.offers(pilot, alice, Act.SIGN_PLAN, pilot.latest_plan)
    page = client.post(reverse("plan_sign", args=[demo.pilot.code]), {"comment": "customer"}, follow=True)
    assert "another person" in page.content.decode()
    assert list(version.signoffs.values_list("party", flat=True)) == [Party.VENDOR]
    assert access.offers(pilot, demo.bob, Act.SIGN_PLAN, pilot.latest_plan)
