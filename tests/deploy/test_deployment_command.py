"""manage.py deployment: settings are validated before they are saved; a bad file names itself and the field."""
from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command

from runners.config import default_simulated


def test_a_settings_file_is_validated_and_saved(pilot, tmp_path, capsys):
    path = tmp_path / "site.yaml"
    path.write_text("model: /models/qwen3-coder\nfx_target:\n  address: 10.20.0.5\n  nqn: nqn.2026-01.com.fx:pool0\n")
    call_command("deployment", pilot.name, "--set", str(path))
    pilot.refresh_from_db()
    assert pilot.deployment["model"] == "/models/qwen3-coder"
    assert pilot.deployment["ports"] == {"base": 8000, "arms": {}}
    assert "settings saved" in capsys.readouterr().out


def test_a_bad_file_is_refused_naming_the_file_and_field_and_nothing_changes(pilot, tmp_path):
    before = dict(pilot.deployment)
    path = tmp_path / "site.yaml"
    path.write_text(json.dumps(default_simulated() | {"tensor_parallel_size": 9000}))
    with pytest.raises(CommandError, match=rf"{path}: deployment.tensor_parallel_size: 9000 is outside"):
        call_command("deployment", pilot.name, "--set", str(path))
    pilot.refresh_from_db()
    assert pilot.deployment == before


def test_a_file_that_is_not_yaml_names_its_line(pilot, tmp_path):
    path = tmp_path / "site.yaml"
    path.write_text("model: a/b\nfx_target: [unclosed\n")
    with pytest.raises(CommandError, match=r"site.yaml, line \d+: not valid YAML"):
        call_command("deployment", pilot.name, "--set", str(path))


def test_check_saves_nothing(pilot, capsys):
    pilot.deployment = {}
    pilot.save()
    call_command("deployment", pilot.name, "--simulated", "--check")
    pilot.refresh_from_db()
    assert pilot.deployment == {}
    assert '"tensor_parallel_size": 8' in capsys.readouterr().out
