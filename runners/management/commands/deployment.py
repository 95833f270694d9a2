"""`python manage.py deployment PILOT [--set FILE | --simulated] [--check]`: show, check or set a pilot's deployment settings.

The settings (runners.config) are validated before they are saved; a bad file is refused with the
file and the field named, and the pilot keeps the settings it had.
"""
from __future__ import annotations

import json
from pathlib import Path

import yaml
from django.core.management.base import BaseCommand, CommandError

from gates.management.lookup import find_pilot
from runners.config import DeploymentSettingsError, default_simulated, validate_deployment


class Command(BaseCommand):
    help = "Show, check or set a pilot's deployment settings (model, ports, paths, sizes, FX target)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("pilot", help="the pilot's name or the start of its code")
        group = parser.add_mutually_exclusive_group()
        group.add_argument("--set", metavar="FILE", help="a YAML or JSON file of settings (docs/deployment.md)")
        group.add_argument("--simulated", action="store_true", help="the settings for a simulated site")
        parser.add_argument("--check", action="store_true", help="validate only; save nothing")

    def handle(self, *args, **options) -> None:
        pilot = find_pilot(options["pilot"])
        if options["set"]:
            data, where = _read(Path(options["set"])), options["set"]
        elif options["simulated"]:
            data, where = default_simulated(), "the simulated defaults"
        else:
            data, where = pilot.deployment, f"pilot {pilot.name}"
        try:
            settings = validate_deployment(data)
        except DeploymentSettingsError as exc:
            raise CommandError(f"{where}: {exc}") from None
        if (options["set"] or options["simulated"]) and not options["check"]:
            pilot.deployment = settings.to_dict()
            pilot.save(update_fields=["deployment"])
            self.stdout.write(f"pilot {pilot.name}: deployment settings saved from {where}")
        self.stdout.write(json.dumps(settings.to_dict(), indent=2))


def _read(path: Path) -> dict:
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise CommandError(f"{path}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise CommandError(f"{path}: not UTF-8 text (byte {exc.start} is 0x{exc.object[exc.start]:02x}); "
                           "save it as UTF-8") from None
    try:
        return yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f", line {mark.line + 1}" if mark else ""
        raise CommandError(f"{path}{line}: not valid YAML or JSON ({getattr(exc, 'problem', exc)})") from None
