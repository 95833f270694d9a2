#!/usr/bin/env python3
"""Verifying a countersigned report: each page with its own resources against WeasyPrint's shared dictionary.

The G3 report of bench_report.py (12 charts, simulated: a watermark on every page), rendered twice in one run:
as reports.render makes it (each page names the forms it draws: `own_page_resources`) and as WeasyPrint leaves
it (every page names every form). Each is signed by the vendor and countersigned by an approver, as a report is
when a customer approver signs it off; then `verify_pdf` checks each, alternating, and the process CPU time of
each check is taken (pyHanko's check of what changed after the vendor's signature is the cost).

    .venv/bin/python benchmarks/reports/bench_countersigned.py [--repeat 5] [--language en|zh-hans]

Results: benchmarks/out/countersigned-<UTC time>.json and a line on stdout (copied to benchmarks/README.md).
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from io import BytesIO
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_report import OUT, TABLE, arguments, authority  # noqa: E402 — sets up Django
from pyhanko.pdf_utils.reader import PdfFileReader  # noqa: E402

from gates.judge import verdicts  # noqa: E402
from gates.plan import load_plan  # noqa: E402
from reports import render, sign  # noqa: E402
from reports.verify import verify_pdf  # noqa: E402
from tests.reports.verdicts import g3_inputs, gate_context  # noqa: E402


def countersigned(context: dict, language: str, vendor, approver, *, own: bool) -> bytes:
    finisher = render.own_page_resources
    if not own:
        render.own_page_resources = lambda document, pdf: None
    try:
        pdf = render.render_pdf(context, language)
    finally:
        render.own_page_resources = finisher
    signed = sign.sign_pdf(pdf, vendor, field_name=sign.VENDOR_FIELD, reason="benchmark", certify=True)
    return sign.sign_pdf(signed, approver, field_name=sign.next_approver_field(signed), reason="approve")


def main() -> None:
    args = arguments(__doc__, 5)
    folder, vendor = authority()
    roots = [folder / "root-cert.pem"]
    key, cert, _ = sign.setup_approver(folder, "bob", "Bob Wang", "Example Cloud")
    approver = sign.load_signer(key, cert, roots)
    context = gate_context(verdicts.evaluate(load_plan(), 3, g3_inputs(table=TABLE)))
    files = {label: countersigned(context, args.language, vendor, approver, own=label == "own")
             for label in ("own", "shared")}
    pages = len(PdfFileReader(BytesIO(files["own"]), strict=False).root["/Pages"]["/Kids"])
    cpu: dict[str, list[float]] = {label: [] for label in files}
    for _ in range(args.repeat):
        for label, data in files.items():
            started = time.process_time()
            result = verify_pdf(data, roots)
            cpu[label].append(time.process_time() - started)
            assert result.ok, (label, result.reasons)
    medians = {label: statistics.median(times) for label, times in cpu.items()}
    ratio = medians["own"] / medians["shared"]
    load = os.getloadavg()[0]
    print(f"countersigned G3 report, {pages} pages, language {args.language}, median of {args.repeat}, load {load:.1f}: "
          f"verify CPU {medians['shared']:.2f} s with WeasyPrint's shared resources, {medians['own']:.2f} s with "
          f"each page's own (ratio {ratio:.3f})")
    OUT.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    (OUT / f"countersigned-{stamp}.json").write_text(json.dumps(
        {"language": args.language, "pages": pages, "repeat": args.repeat, "cpu_s": cpu, "median_s": medians,
         "ratio": ratio, "load": load}, indent=1))


if __name__ == "__main__":
    main()
