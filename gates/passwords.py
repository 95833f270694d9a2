"""A person's API tokens end with the password they were made under (issue 49, item 4): whenever a person's
password changes — the account page's change, a reset by e-mail, an operator's `changepassword` or the admin — every
token of theirs still usable is revoked, so a token taken from someone who then resets a stolen password stops
working at once (401, "revoked"). The revocation imports gates.models inside the function: this module is
imported from GatesConfig.ready(), and the models are not loaded at import time."""
from __future__ import annotations

import logging

from django.conf import settings
from django.db.models.signals import post_save, pre_save
from django.utils import timezone

logger = logging.getLogger(__name__)


def _remember_change(sender, instance, raw=False, **kwargs) -> None:
    instance._fxpilot_password_changed = False
    if raw or instance.pk is None:
        return
    before = sender.objects.filter(pk=instance.pk).values_list("password", flat=True).first()
    instance._fxpilot_password_changed = before is not None and before != instance.password


def _revoke_tokens(sender, instance, created=False, raw=False, **kwargs) -> None:
    if raw or created or not getattr(instance, "_fxpilot_password_changed", False):
        return
    instance._fxpilot_password_changed = False
    from gates.models import ApiToken

    revoked = ApiToken.objects.filter(user=instance, revoked=False).update(revoked=True, revoked_at=timezone.now())
    if revoked:
        logger.info("password of %s changed: %d API token(s) revoked", instance.get_username(), revoked)


def connect() -> None:
    pre_save.connect(_remember_change, sender=settings.AUTH_USER_MODEL, dispatch_uid="fxpilot-password-before")
    post_save.connect(_revoke_tokens, sender=settings.AUTH_USER_MODEL, dispatch_uid="fxpilot-password-tokens")
