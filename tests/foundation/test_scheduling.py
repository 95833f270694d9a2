"""The parallel sessions' schedule (tests/conftest.py): the groups it sends out first must exist, or a renamed file
would silently fall back to the end of the run."""
from __future__ import annotations

from pathlib import Path

from tests.conftest import FIRST, LONG, SHARED_SET_UP

ROOT = Path(__file__).resolve().parents[2]


def test_every_group_sent_out_first_is_a_test_file_or_shared_directory_of_the_suite():
    for name in FIRST:
        assert (ROOT / "tests" / name).is_dir() and name in SHARED_SET_UP, name
    for path in LONG:
        assert (ROOT / path).is_file() and Path(path).name.startswith("test_"), path
    assert len(set(LONG)) == len(LONG)
