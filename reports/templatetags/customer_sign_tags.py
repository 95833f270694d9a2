"""The countersign card's view of the approver's enrolled certificate (reports.customer_sign_store)."""
from __future__ import annotations

from django import template

from reports import customer_sign_store

register = template.Library()


@register.simple_tag(takes_context=True)
def countersign_enrolment(context):
    """The certificate in force for the person reading the page, or None."""
    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    return customer_sign_store.enrolled(user)
