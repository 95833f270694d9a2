"""Create the demo organisations, people and pilot. Idempotent: running it twice changes nothing."""
from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from gates import lifecycle
from gates.models import Organisation, Pilot, Role

DEMO_PASSWORD = "fxpilot-demo"
DEMO_PILOT = "FX100 joint test — Example Cloud"
PEOPLE = [
    # username, full name, organisation, roles
    ("alice", "Alice Chen", "FX Storage (demo vendor)", [Role.VENDOR_ENGINEER, Role.VENDOR_LEAD]),
    ("bob", "Bob Wang", "Example Cloud (demo customer)", [Role.CUSTOMER_APPROVER]),
    ("carol", "Carol Li", "Example Cloud (demo customer)", [Role.CUSTOMER_ENGINEER]),
    ("charlie", "Charlie Zhou", "Unrelated Customer Ltd", [Role.CUSTOMER_APPROVER]),
]
ORGS = {
    "FX Storage (demo vendor)": Organisation.Kind.VENDOR,
    "Example Cloud (demo customer)": Organisation.Kind.CUSTOMER,
    "Unrelated Customer Ltd": Organisation.Kind.CUSTOMER,
}


def seed(password: str = DEMO_PASSWORD) -> Pilot:
    User = get_user_model()
    with transaction.atomic():
        orgs = {name: Organisation.objects.get_or_create(name=name, defaults={"kind": kind})[0] for name, kind in ORGS.items()}
        for username, full_name, org, roles in PEOPLE:
            first, last = full_name.split(" ", 1)
            user, created = User.objects.get_or_create(username=username, defaults={
                "first_name": first, "last_name": last, "email": f"{username}@example.test"})
            if created:
                user.set_password(password)
                user.save()
            for role in roles:
                lifecycle.add_member(user, orgs[org], role)
        pilot = Pilot.objects.filter(name=DEMO_PILOT).first()
        if pilot is None:
            pilot = lifecycle.create_pilot(
                name=DEMO_PILOT, customer=orgs["Example Cloud (demo customer)"], vendor=orgs["FX Storage (demo vendor)"],
                who="seed_demo", customer_concurrency=24,
            )
    return pilot


class Command(BaseCommand):
    help = "Create the demo vendor, customers, people (alice, bob, carol, charlie) and a pilot on the default plan."

    def handle(self, *args, **options) -> None:
        pilot = seed()
        self.stdout.write(f"Demo pilot: {pilot.name} ({pilot.code})")
        for username, full_name, org, roles in PEOPLE:
            self.stdout.write(f"  {username:8} / {DEMO_PASSWORD}  {full_name}, {', '.join(str(r.label) for r in roles)} — {org}")
