"""A process that never judges does not pay for pandas and scipy (gates.judge.lazy)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from django.conf import settings

from gates.judge import intervals
from gates.judge.lazy import LazyModule

PROBE = ("import json, sys, django; django.setup(); import gates.judge, runners.steps; "
         "print(json.dumps({m: m in sys.modules for m in ('pandas', 'scipy', 'scipy.stats', 'runners.steps')}))")


def test_a_django_process_starts_without_importing_pandas_or_scipy():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "fxpilot.settings"}
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=settings.BASE_DIR, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == {"pandas": False, "scipy": False, "scipy.stats": False, "runners.steps": True}


def test_the_judge_imports_them_on_first_use_and_computes_as_before():
    import numpy as np
    from scipy import stats

    assert LazyModule("scipy.stats").t.ppf(0.975, 4) == stats.t.ppf(0.975, 4)
    values = np.array([10.0, 10.5, 9.5, 10.2])
    mean, low, high = intervals.linear_t(values, 0.95)
    half = stats.t.ppf(0.975, 3) * values.std(ddof=1) / 2
    assert np.isclose(low, values.mean() - half) and np.isclose(high, values.mean() + half)
