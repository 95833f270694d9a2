"""The demo runs G4 again with a longer soak only when the judge found too few requests to decide a rate bar or the
drift's windows."""
from portal.management.commands.demo import shortfall_of

SHORT = {"name": "enough-requests-for-rates", "ok": False,
         "detail": "g4-soak-failures: too few requests to show ≤ 0.1 % at fx/soak@16; needs ≥ 3,911 error-free "
                   "requests (has 934)"}


def _result(*checks):
    return {"validity": {"valid": False, "checks": [{"name": "repetitions", "ok": True, "detail": "3"}, *checks]}}


def test_too_few_soak_requests_give_how_many_times_more_are_needed():
    assert round(shortfall_of(_result(SHORT)), 2) == 4.19


def test_any_other_invalidity_or_a_judged_run_is_not_retried():
    other = {"name": "min-requests-per-cell", "ok": False, "detail": "a cell has 3 successful requests"}
    assert shortfall_of(_result(SHORT, other)) is None
    assert shortfall_of(_result({**SHORT, "ok": True})) is None
    assert shortfall_of(None) is None and shortfall_of({"verdict": "pass"}) is None


def test_drift_windows_short_of_their_quantiles_requests_are_a_shortfall_too():
    windows = {"name": "repetitions", "ok": False,
               "detail": "g4-soak-drift: fx at concurrency 16: a p90 needs at least 36 successful requests per steady "
                         "window to be estimated from the window's own requests (window 2: 27, window 3: 32, window 4: "
                         "32): the soak is too short for its criterion's statistic"}
    assert round(shortfall_of({"validity": {"checks": [windows]}}), 2) == round(36 / 27, 2)
    assert round(shortfall_of({"validity": {"checks": [windows, SHORT]}}), 2) == 4.19
    other_repetitions = {"name": "repetitions", "ok": False, "detail": "look 1 needs 4 repetitions; fx@8 lacks 4"}
    assert shortfall_of({"validity": {"checks": [other_repetitions, SHORT]}}) is None
