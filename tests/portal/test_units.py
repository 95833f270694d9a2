"""One formatter for figures (reports.units): the gate page and the signed gate report write each figure alike."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.urls import reverse
from django.utils import translation

from reports import units
from reports.render import criterion_rows


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_the_gate_page_and_the_gate_report_write_each_figure_alike(client, world, language):
    client.force_login(world.carol)
    client.cookies.load({settings.LANGUAGE_COOKIE_NAME: language})
    page = client.get(reverse("gate", args=[world.pilot.code, 1])).content.decode()
    with translation.override(language):
        rows = criterion_rows(world.evaluation.result, language)
    (row,) = rows
    for text in (row["value"], row["ci"], row["bar"].split(" ", 1)[1], row["cells"][0]["value"], row["cells"][0]["ci"]):
        assert text in page, f"the report writes {text!r}, the page does not"
    assert row["value"] == "4 %" and row["ci"] == "[3 %, 5 %]"


def test_each_unit_reads_as_a_person_reads_it():
    assert units.figure(0.9, "fraction") == "90 %" and units.figure(0.934, "fraction") == "93.4 %" and units.figure(0.001, "fraction") == "0.100 %"
    assert units.figure(8.6, "×") == "8.60×" and units.figure(12.34, "×") == "12.3×"
    assert units.figure(12000, "requests") == "12,000 requests" and units.figure(5.25, "GB/s") == "5.25 GB/s"
    assert units.figure(None, "×") == "—" and units.interval([None, 1]) == "—"
    assert units.interval([0.5, 0.75], "fraction") == "[50 %, 75 %]"
