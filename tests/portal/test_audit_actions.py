"""The audit log's actions: one enumeration, every member with words in English and Chinese, nothing else written."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from django.conf import settings
from django.urls import reverse
from django.utils import translation

from gates import lifecycle
from gates.models import AuditAction, AuditEvent

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gates", "runners", "reports", "portal", "infra", "fxpilot")
WRITERS = {"audit", "_set_state"}  # gates.lifecycle's two writers of audit events


def test_every_audit_action_has_words_in_both_languages():
    for action in AuditAction:
        english = str(action.label)
        assert english and english != action.value, f"{action.value} has no words"
        with translation.override("zh-hans"):
            chinese = str(action.label)
        assert chinese != english, f"{action.value} ({english!r}) has no Chinese words in locale/zh_Hans"


def test_an_action_outside_the_enumeration_is_refused_by_name(demo):
    with pytest.raises(ValueError, match="'pilot.renamed' is not an audit action"):
        lifecycle.audit(demo.pilot, demo.alice, "pilot.renamed", demo.pilot)
    assert not AuditEvent.objects.filter(action="pilot.renamed").exists()


def _written_actions() -> list[tuple[str, int, str]]:
    """(file, line, the action argument as written) of every call of an audit writer in the project's code."""
    found = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name not in WRITERS or len(node.args) < 3:
                    continue
                argument = node.args[2] if name == "audit" else node.args[3]
                found.append((str(path.relative_to(ROOT)), node.lineno, ast.unparse(argument)))
    return found


def test_every_action_the_code_writes_is_a_member_of_the_enumeration():
    members = {f"AuditAction.{a.name}" for a in AuditAction} | {repr(a.value) for a in AuditAction}
    written = _written_actions()
    assert len(written) > 20  # the walk found the writers
    # The lifecycle's own two tables of decisions are members too.
    allowed = members | {"_PLAN_DECISION[decision]", "_GATE_DECISION[decision]", "action"}
    strangers = [f"{file}:{line}: {argument}" for file, line, argument in written if argument not in allowed]
    assert not strangers, "audit actions outside gates.models.AuditAction:\n" + "\n".join(strangers)
    assert set(lifecycle._PLAN_DECISION.values()) | set(lifecycle._GATE_DECISION.values()) <= set(AuditAction)


def test_the_audit_page_shows_every_action_in_words_in_chinese(client, demo):
    for action in AuditAction:
        lifecycle.audit(demo.pilot, demo.alice, action, demo.pilot)
    client.force_login(demo.carol)
    client.cookies.load({settings.LANGUAGE_COOKIE_NAME: "zh-hans"})
    with translation.override("zh-hans"):
        labels = {a: str(a.label) for a in AuditAction}
    html = client.get(reverse("audit", args=[demo.pilot.code])).content.decode()
    assert 'lang="zh-hans"' in html.lower()
    for action, words in labels.items():
        assert f"{words} <code>{action.value}</code>" in html, f"{action.value} is shown without its Chinese words"
