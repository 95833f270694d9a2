"""Cache hits the engine cannot fake: the records' `cached_tokens` reconciled with the server's /metrics.

Two sources say how many prompt tokens were served from cache. `/metrics` counters (deltas between the
phase summary's `metrics_before` and `metrics_after`) are authoritative: vLLM counts every scheduled token
there, GPU prefix-cache hits (`vllm:prefix_cache_hits_total`) and KV-connector hits
(`vllm:external_prefix_cache_hits_total`) apart. The records' `cached_tokens` come from each response's
`usage.prompt_tokens_details.cached_tokens`, which is what makes a per-request statistic possible.

vLLM 0.20.1 run with `--enable-prompt-tokens-details` leaves `prompt_tokens_details` out entirely when
nothing was cached (newer versions send 0), so a miss arrives as `cached_tokens: null`. Dropping those
rows would make a cell where half the requests missed look like a cell of hits. So:

* in a cell where some successful request reported a number, a successful request without one is a 0
  (the server was reporting, and it reports nothing only for a miss);
* in a measured window where none reported and /metrics counted no hit, every request is a 0;
* where both sources have figures, they must agree to within `TOLERANCE` of the window's prompt tokens,
  or the run is `invalid`, and the check names the cell, the two figures and the records' instance.
* a phase summary that counted requests and carries /metrics deltas but matches no request record at all (by run
  id, instance and cell) makes the run `invalid` too, naming it: its counters would vouch for nothing, and the
  records it should have checked would go unchecked while the check said "agree".

`reconcile` returns the inputs with the nulls filled as above and the check; the judge calls it before
it derives anything from the records.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from gates.judge.lazy import pd
from gates.judge.records import Inputs
from gates.judge.words import gettext_noop

GPU_HITS = "vllm:prefix_cache_hits_total"
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
TOLERANCE = 0.01          # of the window's prompt tokens: counters and usage come from the same scheduler
CELL_KEYS = ["arm", "phase", "concurrency", "repetition"]
CHECK_NAME = "hit-counters-agree"


def _delta(before: dict, after: dict, name: str) -> float | None:
    """Counter increase over a window; a counter that went down was reset by a restart and counts from 0."""
    if name not in after:
        return None
    start = float(before.get(name, 0.0))
    end = float(after[name])
    return end - start if end >= start else end


def metrics_hits(summary: dict) -> float | None:
    """Prompt tokens served from any cache in a summary's window, by /metrics; None when it has no counters."""
    before, after = summary.get("metrics_before") or {}, summary.get("metrics_after") or {}
    parts = [_delta(before, after, name) for name in (GPU_HITS, EXTERNAL_HITS)]
    if all(part is None for part in parts):
        return None
    return float(sum(part for part in parts if part is not None))


EXTERNAL_QUERIES = "vllm:external_prefix_cache_queries_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"


def _shares_window(summary: dict, summaries: list[dict]) -> bool:
    window = summary.get("metrics_window")
    if not window:
        return False
    key = (summary.get("run_id"), summary.get("instance"), window)
    return sum(1 for s in summaries if (s.get("run_id"), s.get("instance"), s.get("metrics_window")) == key) > 1


def external_hits(summary: dict, summaries: list[dict]) -> tuple[float, float] | None:
    """(prompt tokens the external tier — the KV connector, LMCache — served, prompt tokens the GPU prefix cache
    did not serve) over one phase, by /metrics; None when its counters cannot say.

    The phase's own scrapes are its `phase_metrics` pair (a loop that writes several phase labels takes one where
    a label starts or ends: a fault run's cut and recovery), else its summary's pair when no other phase label
    shares that window. The denominator is Δ`vllm:external_prefix_cache_queries_total` (vLLM asks the connector
    only for what HBM missed), else Δprompt − ΔGPU hits: HBM hits of sessions sent again are neither."""
    pair = summary.get("phase_metrics")
    if isinstance(pair, dict):
        before, after = pair.get("before") or {}, pair.get("after") or {}
    elif _shares_window(summary, summaries):
        return None
    else:
        before, after = summary.get("metrics_before") or {}, summary.get("metrics_after") or {}
    hits = _delta(before, after, EXTERNAL_HITS)
    queries = _delta(before, after, EXTERNAL_QUERIES)
    if queries is None:
        prompt, gpu = _delta(before, after, PROMPT_TOKENS), _delta(before, after, GPU_HITS)
        queries = prompt - gpu if prompt is not None and gpu is not None else None
    if hits is None or queries is None or queries <= 0:
        return None
    return hits, queries


def cell_name(arm: str, phase: str, concurrency: int, repetition: int) -> str:
    return f"{arm}/{phase}@{concurrency} rep {repetition}"


def _windows(summaries: list[dict]) -> list[list[dict]]:
    """Summaries grouped by the /metrics window they share: one closed loop that writes several phase labels
    (a fault run's measure/fault/recovery, a soak's windows) names its scrape pair in `metrics_window`."""
    groups: dict[object, list[dict]] = {}
    for position, summary in enumerate(summaries):
        if metrics_hits(summary) is None:
            continue
        window = summary.get("metrics_window")
        key = (summary.get("run_id"), summary.get("instance"), window) if window else position
        groups.setdefault(key, []).append(summary)
    return list(groups.values())


def _rows_of(requests: pd.DataFrame, window: list[dict], *, successful: bool = True) -> np.ndarray:
    """Positions of the (successful) records a window's counters saw: same cells, run and instance."""
    mask = np.zeros(len(requests), dtype=bool)
    ok = (requests["status"] == "ok").to_numpy() if successful else np.ones(len(requests), dtype=bool)
    for summary in window:
        rows = ok.copy()
        for key in CELL_KEYS:
            rows &= (requests[key] == summary[key]).to_numpy()
        if summary.get("instance"):
            rows &= (requests["instance"] == summary["instance"]).to_numpy()
        if summary.get("run_id"):
            rows &= (requests["run_id"] == summary["run_id"]).to_numpy()
        mask |= rows
    return np.nonzero(mask)[0]


def fill_reported_misses(requests: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """A successful request without cached_tokens in a cell where others reported one is a miss (0)."""
    if len(requests) == 0:
        return requests, 0
    cached = requests["cached_tokens"].to_numpy(dtype=np.float64).copy()
    ok = (requests["status"] == "ok").to_numpy()
    missing = ok & np.isnan(cached)
    if not missing.any():
        return requests, 0
    reported = pd.Series(ok & ~np.isnan(cached), index=requests.index)
    any_reported = reported.groupby([requests[k] for k in CELL_KEYS], observed=True).transform("any").to_numpy()
    fill = missing & any_reported
    cached[fill] = 0.0
    return requests.assign(cached_tokens=cached), int(fill.sum())


def reconcile(inputs: Inputs) -> tuple[Inputs, dict]:
    """The inputs with unreported misses made 0, and the check that records and /metrics agree per cell."""
    requests, filled = fill_reported_misses(inputs.requests)
    cached = requests["cached_tokens"].to_numpy(dtype=np.float64).copy() if len(requests) else np.array([])
    prompt = requests["prompt_tokens"].to_numpy(dtype=np.float64) if len(requests) else np.array([])
    problems: list[dict] = []
    agreed: list[str] = []
    unverifiable: list[str] = []
    unmatched: list[str] = []
    for window in _windows(inputs.summaries):
        rows = _rows_of(requests, window)
        if len(rows) == 0:
            # A summary that counted requests and scraped /metrics, but whose run id, instance and cell match no
            # record at all: its counters vouch for nothing given, and the records it should check go unchecked.
            if (metrics_hits(window[0]) is not None and any((s.get("requests") or 0) > 0 for s in window)
                    and len(_rows_of(requests, window, successful=False)) == 0):
                unmatched += [f"{cell_name(s['arm'], s['phase'], s['concurrency'], s['repetition'])} (run "
                              f"{s.get('run_id') or '—'}, instance {s.get('instance') or '—'})" for s in window]
            continue
        names = ", ".join(cell_name(s["arm"], s["phase"], s["concurrency"], s["repetition"]) for s in window)
        where = f"{names} ({window[0]['instance']})" if window[0].get("instance") else names
        from_metrics = float(metrics_hits(window[0]))  # the summaries of one window share its deltas
        tokens = float(prompt[rows].sum())
        values = cached[rows]
        if np.isnan(values).all():
            if from_metrics == 0:
                cached[rows] = 0.0
                filled += len(rows)
            else:
                unverifiable.append({"where": where, "n": f"{from_metrics:.0f}"})
            continue
        from_records = float(np.nansum(values))
        if abs(from_records - from_metrics) > TOLERANCE * max(tokens, 1.0):
            problems.append(_said(gettext_noop("%(where)s: the records say %(records)s of %(tokens)s prompt tokens were "
                                               "cached (%(records_share)s), the server's /metrics %(metrics)s "
                                               "(%(metrics_share)s)"), where=where, records=f"{from_records:.0f}",
                                  tokens=f"{tokens:.0f}", records_share=f"{from_records / max(tokens, 1.0):.1%}",
                                  metrics=f"{from_metrics:.0f}", metrics_share=f"{from_metrics / max(tokens, 1.0):.1%}"))
        else:
            agreed.append(where)
    if filled:
        requests = requests.assign(cached_tokens=cached)
    # the detail as catalogue sentences and values (gates.judge.validity's detail_said), English joined by "; "
    detail_parts = []
    if agreed:
        detail_parts.append(_said(gettext_noop("records and /metrics agree on cached tokens in %(n)s window(s)"),
                                  n=len(agreed)))
    if filled:
        detail_parts.append(_said(gettext_noop("%(n)s successful request(s) without cached_tokens counted as misses "
                                               "(0)"), n=filled))
    for i, unverified in enumerate(unverifiable):
        detail_parts.append(_said(gettext_noop("not cross-checked: %(where)s: no record reports cached_tokens; "
                                               "/metrics counted %(n)s cached tokens") if i == 0 else
                                  gettext_noop("%(where)s: no record reports cached_tokens; /metrics counted %(n)s "
                                               "cached tokens"), **unverified))
    if unmatched:
        listed = ", ".join(unmatched[:5]) + (f" and {len(unmatched) - 5} more" if len(unmatched) > 5 else "")
        problems.append(_said(gettext_noop("1 phase summary with /metrics matches no request record by run id, "
                                           "instance and cell: %(listed)s") if len(unmatched) == 1 else
                              gettext_noop("%(n)s phase summaries with /metrics match no request record by run id, "
                                           "instance and cell: %(listed)s"), n=len(unmatched), listed=listed))
    if not problems:
        detail_parts = detail_parts or [_said(gettext_noop("no phase summary with /metrics deltas"))]
    parts = problems or detail_parts
    check = {"name": CHECK_NAME, "ok": not problems, "detail": "; ".join(p["template"] % p["values"] for p in parts),
             "detail_said": parts}
    return replace(inputs, requests=requests), check


def _said(template: str, **values) -> dict:
    """A part of the check's detail as it is made (the shape of gates.judge.validity.said, which imports this)."""
    return {"template": template, "values": {k: str(v) for k, v in values.items()}}
