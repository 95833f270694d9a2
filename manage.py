#!/usr/bin/env python
"""Django's command-line utility for fxpilot."""
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fxpilot.settings")
    from fxpilot.env import SettingError

    try:
        from django.core.management import execute_from_command_line

        execute_from_command_line(sys.argv)
    except SettingError as error:
        sys.stderr.write(f"fxpilot: configuration error: {error}\n")
        sys.exit(2)


if __name__ == "__main__":
    main()
