"""Pilots generated from timestamps, not from the judge's model (issue 25, item 8).

Each request of a closed-loop cell is timed: its client sends it when the cell starts (one request per client,
as the cold-recovery client does), the first token comes after a TTFT drawn around the arm's Table 1 figure,
and the request ends after its decode time, chosen so that the cell streams the arm's Table 1 throughput. On
top of that, what the judge's own model leaves out:

* repetition effects — every arm × level × repetition shares a log-normal factor (the planning spread), which
  moves that repetition's TTFTs and decode times together;
* slow requests — a share of requests decodes `slow_factor` times slower (a straggler, a GC pause);
* clock skew — the second instance of a cell stamps its wall clock `skew_s` ahead;
* session-clustered misses (G2) — a session misses the tier whole in every request it sends;
* omitted and copied repetitions.

Records and phase summaries come out as the workload client writes them (fxpilot.request/1, fxpilot.phase/1)
and are judged by the real `gates.judge.evaluate`, look by look as the orchestration would: the records
of the first look, then of the next while the verdict is marginal.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from gates.judge import synthetic

TABLE_1 = synthetic.TABLE_1
PROMPT, TURN, OUTPUT = 49152, 256, 64
G3_LEVELS = {"fx": (8, 16, 32), "local_nvme": (8, 16, 32), "recompute": (16,)}


@dataclass
class Scenario:
    spread: float = 0.06                  # CV of a repetition's factor
    request_sd: float = 0.10              # log-sd of one request's TTFT and decode time around the repetition's
    slow_share: dict[str, float] = field(default_factory=dict)  # arm → share of slow requests
    slow_factor: float = 8.0
    fx_ttft: dict[int, float] = field(default_factory=dict)     # level → fx TTFT p50 (default Table 1)
    fx_tput: dict[int, float] = field(default_factory=dict)     # level → fx throughput (default Table 1)
    skew_s: float = 0.0                   # the second instance of every local_nvme cell runs this far ahead
    failure_rate: float = 0.0


def _cell(rng: np.random.Generator, arm: str, level: int, rep: int, ttft: float, tput: float, sc: Scenario,
          start: float, *, phase: str = "measure", sessions: list[str] | None = None,
          hits: np.ndarray | None = None) -> tuple[pd.DataFrame, float]:
    n = level
    sigma = math.sqrt(math.log1p(sc.spread ** 2))
    factor = math.exp(sigma * rng.standard_normal())
    latency = level * OUTPUT / tput  # a closed-loop request's whole time at the published throughput
    t_ttft = ttft * factor * np.exp(sc.request_sd * rng.standard_normal(n))
    decode = max(latency - ttft, 0.05 * latency) * factor * np.exp(sc.request_sd * rng.standard_normal(n))
    slow = rng.random(n) < sc.slow_share.get(arm, 0.0)
    decode = np.where(slow, decode * sc.slow_factor, decode)
    t_send = start + 0.002 * rng.random(n)
    t_first = t_send + t_ttft
    t_end = t_first + decode
    failed = rng.random(n) < sc.failure_rate
    two = sc.skew_s and arm == "local_nvme" and n >= 2
    instance = np.where((np.arange(n) % 2 == 1) & bool(two), "node2:8000", "node1:8000")
    anchor = np.where(instance == "node2:8000", synthetic.WALL_ANCHOR + sc.skew_s, synthetic.WALL_ANCHOR)
    names = sessions or [f"{arm}-c{level}-r{rep}-s{i:03d}" for i in range(n)]
    if arm == "recompute":
        cached = np.zeros(n)
    elif hits is not None:
        cached = np.where(hits, PROMPT, 0.0)
    else:
        cached = np.full(n, float(PROMPT))
    frame = pd.DataFrame({
        "schema": "fxpilot.request/1", "run_id": "held-out", "arm": arm, "instance": instance, "phase": phase,
        "concurrency": level, "repetition": rep, "session": names, "prompt_tokens": PROMPT + TURN,
        "cached_tokens": np.where(failed, np.nan, cached), "output_tokens": np.where(failed, 0, OUTPUT),
        "t_send": t_send, "t_first_token": np.where(failed, np.nan, t_first), "t_end": t_end,
        "wall_anchor": anchor, "status": np.where(failed, "error", "ok"),
        "error": np.where(failed, "HTTP 503 Service Unavailable", None), "simulated": True,
        "output_sha256": None, "turn": 2.0, "client_cpu_s": np.nan,
    })
    return frame[synthetic.REQUEST_COLUMNS], float(t_end.max()) + 5.0


def g3_records(rng: np.random.Generator, repetitions: int, sc: Scenario) -> pd.DataFrame:
    frames, start = [], 0.0
    for rep in range(1, repetitions + 1):
        for arm, levels in G3_LEVELS.items():
            for level in levels:
                ttft, tput = TABLE_1[arm][level]
                if arm == "fx":
                    ttft, tput = sc.fx_ttft.get(level, ttft), sc.fx_tput.get(level, tput)
                frame, start = _cell(rng, arm, level, rep, ttft, tput, sc, start)
                frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def g2_records(rng: np.random.Generator, repetitions: int, sc: Scenario, share_hitting: float,
               per_repetition: int = 8) -> pd.DataFrame:
    """G2's cold recovery at concurrency 8: fresh sessions each repetition; a session misses whole with
    probability 1 − share_hitting (its chunks never reached the tier)."""
    frames, start = [], 0.0
    ttft, tput = TABLE_1["fx"][8]
    for rep in range(1, repetitions + 1):
        hits = rng.random(per_repetition) < share_hitting
        names = [f"g2-r{rep}-s{i:03d}" for i in range(per_repetition)]
        frame, start = _cell(rng, "fx", 8, rep, ttft, tput, sc, start, sessions=names, hits=hits)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def files_of(frame: pd.DataFrame, *, probe: bool = False, retrieve: bool = False) -> list:
    frame = frame.copy()
    frame.attrs["name"] = "records.jsonl"
    summary_rows = frame.copy()
    summary_rows["cached_tokens"] = summary_rows["cached_tokens"].fillna(0.0)
    files = [frame, ("records.summary.json", synthetic.jsonl(synthetic.phase_summaries(summary_rows))),
             synthetic.inventory("node1")]
    if probe:
        parts = [synthetic.cell_frame(arm, "probe", 1, 1, ttft_p50=0.4, throughput=80.0, requests=8,
                                      prompt_tokens=4096, output_tokens=32, session_prefix="probe-",
                                      cached_fraction=0.0 if arm == "recompute" else 0.875)
                 for arm in ("fx", "recompute")]
        probe_frame = pd.concat(parts, ignore_index=True)
        probe_frame.attrs["name"] = "probe.jsonl"
        files += [probe_frame, ("probe.summary.json", synthetic.jsonl(synthetic.phase_summaries(probe_frame)))]
    if retrieve:
        files.append(("retrieve.jsonl", synthetic.jsonl(synthetic.retrieve_records())))
    return files


def judged_look_by_look(plan, gate: int, frame: pd.DataFrame, looks: tuple[int, ...], **files) -> dict:
    """Judge the records of each look in turn (the run measures up to a look, then continues while marginal):
    the first decided verdict, or the last look's."""
    from gates.judge import evaluate

    verdict = None
    for reps in looks:
        part = frame[frame["repetition"] <= reps]
        verdict = evaluate(plan, gate, files_of(part, **files))
        if verdict["verdict"] != "marginal":
            break
    return verdict
