"""The embedded demo's customer side: a folder OUTSIDE the control plane's data folder that plays the approver's
own machine. The demo's approver makes his key there with the customer-side command's `init`, enrols only the
certificate, and countersigns with the command's signing code (reports.customer_sign) — nothing in
FXPILOT_DATA_DIR can make his signature. Demo and tests only: a real approver runs `fxpilot-countersign` himself.
"""
from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings

from reports import customer_sign, customer_sign_store

FOLDER_ENV = "FXPILOT_DEMO_CUSTOMER_DIR"


def customer_side_root() -> Path:
    """$FXPILOT_DEMO_CUSTOMER_DIR, else `<data folder>-customer-side` next to the data folder (never inside it)."""
    data = Path(settings.DATA_DIR).resolve()
    root = Path(os.environ.get(FOLDER_ENV) or data.parent / f"{data.name}-customer-side").resolve()
    if root == data or data in root.parents:
        raise customer_sign.CustomerSignError(
            f"{FOLDER_ENV}={root} is inside the control plane's data folder {data}: the customer side must not be")
    return root


def approver_folder(user) -> Path:
    return customer_side_root() / user.get_username()


def ensure_enrolled(user, organisation) -> Path:
    """The approver's key and certificate on the customer side (made once), and the certificate enrolled."""
    folder = approver_folder(user)
    if not (folder / customer_sign.KEY_FILE).exists():
        customer_sign.init(folder, user.get_full_name() or user.get_username(), organisation.name)
    pem = (folder / customer_sign.CERT_FILE).read_bytes()
    current = customer_sign_store.enrolled(user)
    if current is None or current.fingerprint != customer_sign.parse_certificate(pem).fingerprint:
        customer_sign_store.enrol(user, organisation, pem, who=user)
    return folder


def countersigned_bytes(data: bytes, user, organisation) -> bytes:
    """`data` countersigned on the customer side, as `fxpilot-countersign sign` does."""
    folder = ensure_enrolled(user, organisation)
    return customer_sign.countersign_bytes(
        data, folder / customer_sign.KEY_FILE, folder / customer_sign.CERT_FILE,
        reason=f"Approved by {user.get_full_name() or user.get_username()} for {organisation.name}",
        location=organisation.name)
