"""Each page of a report names only the forms it draws (reports.render.own_page_resources).

WeasyPrint gives every page one resources dictionary naming every form of the document; pyHanko's check of what
changed after a signature (run on every countersigned report) walks every path to every object, P pages × F forms
of them. The same report rendered as WeasyPrint leaves it is the comparison here: the pages must look the same, the
signatures must verify the same, and the paths pyHanko walks must fall.
"""
from __future__ import annotations

import re
import subprocess
from io import BytesIO
from pathlib import Path

import pytest
from pyhanko.pdf_utils.reader import PdfFileReader

from reports import render, sign
from reports.verify import verify_pdf
from tests.reports.verdicts import gate_context, table1_verdict

DRAWN = re.compile(rb"/([^\s/\[\]()<>{}%]+) Do\b")


@pytest.fixture(scope="module")
def renderings() -> dict[str, bytes]:
    """A simulated G3 report (charts, a watermark on every page) with each page's own resources, and as WeasyPrint
    leaves it."""
    context = gate_context(table1_verdict())
    own = render.render_pdf(context, "en")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(render, "own_page_resources", lambda document, pdf: None)
        shared = render.render_pdf(context, "en")
    return {"own": own, "shared": shared}


def _pages(data: bytes) -> list[tuple[set[str], set[str]]]:
    """Per page: the forms its resources name, the forms its content stream draws."""
    reader = PdfFileReader(BytesIO(data), strict=False)
    pages = []
    for ref in reader.root["/Pages"]["/Kids"]:
        page = ref.get_object()
        named = {str(name).lstrip("/") for name in page["/Resources"].get("/XObject", {})}
        drawn = {name.decode() for name in DRAWN.findall(page["/Contents"].get_object().data)}
        pages.append((named, drawn))
    return pages


def test_each_page_names_the_forms_it_draws_and_no_other_pages(renderings):
    shared, own = _pages(renderings["shared"]), _pages(renderings["own"])
    assert len(own) == len(shared) >= 3
    every = set().union(*(named for named, _ in shared))
    # what the change is about: as WeasyPrint leaves it, every page names every form, many more than it draws
    assert all(named == every for named, _ in shared) and len(every) > 2 * len(shared)
    for number, (named, drawn) in enumerate(own, start=1):
        assert drawn and named == drawn, (number, sorted(named ^ drawn))
    assert sum(len(named) for named, _ in own) == len(set().union(*(named for named, _ in own)))  # each form once
    assert [drawn for _, drawn in own] == [drawn for _, drawn in shared]


def test_the_pages_look_exactly_as_before(renderings, tmp_path):
    images = {}
    for name, data in renderings.items():
        (tmp_path / f"{name}.pdf").write_bytes(data)
        subprocess.run(["pdftoppm", "-r", "40", "-png", str(tmp_path / f"{name}.pdf"), str(tmp_path / name)],
                       check=True, capture_output=True, timeout=600)
        images[name] = [path.read_bytes() for path in sorted(tmp_path.glob(f"{name}-*.png"))]
    assert len(images["own"]) == len(_pages(renderings["own"]))
    assert images["own"] == images["shared"]


def _paths_walked(data: bytes) -> int:
    """The paths pyHanko's difference analysis records from the catalogue to every object of the last revision
    (its reverse cross-reference cache: a private part of pyHanko, pinned in requirements.txt)."""
    reader = PdfFileReader(BytesIO(data), strict=False)
    resolver = reader.get_historical_resolver(reader.xrefs.total_revisions - 1)
    resolver._load_reverse_xref_cache()
    return sum(len(paths) for paths in resolver._indirect_object_access_cache.values())


def test_a_countersigned_report_verifies_and_its_check_walks_far_fewer_paths(renderings, vendor_signer, ca: Path):
    key, cert, _ = sign.setup_approver(ca, "carol", "Carol Li", "Example Cloud")
    approver = sign.load_signer(key, cert, [ca / "root-cert.pem"])
    walked = {}
    for name, data in renderings.items():
        signed = sign.sign_pdf(data, vendor_signer, field_name=sign.VENDOR_FIELD, reason="test", certify=True)
        twice = sign.sign_pdf(signed, approver, field_name=sign.next_approver_field(signed), reason="approve")
        result = verify_pdf(twice, [ca / "root-cert.pem"])
        assert result.ok, (name, result.reasons)
        assert [s.modification for s in result.signatures] == ["FORM_FILLING", "NONE"], name
        walked[name] = _paths_walked(twice)
    pages = len(_pages(renderings["own"]))
    assert walked["own"] * pages / 4 < walked["shared"], walked
