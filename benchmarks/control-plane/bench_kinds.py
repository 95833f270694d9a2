"""The benchmark's step kind: sleeps, and notes each execution (to count steps run twice)."""
from __future__ import annotations

import os
import time
from pathlib import Path

from runners.kinds import StepContext, StepKind, register_kind


def _sleep(ctx: StepContext) -> dict:
    marks = Path(os.environ["FXPILOT_BENCH_MARKS"])
    with open(marks, "a") as handle:  # one short O_APPEND write per execution
        handle.write(f"{ctx.step.pk}\n")
    time.sleep(float(ctx.step.params.get("seconds", 1.0)))
    return {}


register_kind(StepKind("b_sleep", run=_sleep, soft_time_limit=120))
