"""Signed PDF evidence reports: charts, context, render, sign, verify, service (docs/reports.md)."""
import logging

# WeasyPrint logs every layout step at INFO (some at import time): quiet it before it is imported.
logging.getLogger("weasyprint.progress").setLevel(logging.WARNING)
