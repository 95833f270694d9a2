"""Which tier served a prompt token, measured: HBM, LMCache's DRAM and the disk tier (FX or the local NVMe).

Three counters attribute every hit (issue 43, item 2):

* vLLM's `/metrics`: Δ`vllm:prefix_cache_hits_total` (HBM, the GPU prefix cache) and
  Δ`vllm:external_prefix_cache_hits_total` (the KV connector: LMCache's DRAM *and* its disk tier together);
* the block device that holds the arm's disk tier: the phase summary's `tier_bytes.device_read_bytes` (the workload
  client's delta of `/proc/diskstats` sectors read × 512 over the phase, sampled with every /metrics scrape);
* the KV bytes one token takes on the deployed model (`kv_bytes_per_token`, below).

Disk-served tokens = device bytes ÷ KV bytes per token; DRAM-served = external hits − disk-served. Over a cold
window (phase `measure`, after the eviction emptied HBM and LMCache's DRAM: the summary's `dram_cleared`) every
external hit must come from the disk, so the device bytes must match external hits × KV bytes per token
(`tier-bytes-match`, tolerance `judging.tier_bytes_tolerance`, default [0.8, 1.25]): fewer bytes mean a page cache,
LMCache's DRAM or another reader served hits the device did not read; more bytes mean another reader on the device.
"""
from __future__ import annotations

import math
from dataclasses import replace

from gates import sizing
from gates.judge import counters
from gates.judge.lazy import pd
from gates.judge.words import gettext_noop

TIER_BYTES_TOLERANCE = (0.8, 1.25)   # device bytes ÷ (external hits × KV bytes per token) over a cold window
COLD_PHASES = ("measure",)          # phases right after an eviction (HBM and LMCache's DRAM emptied)
RECOMPUTE_ARM = "recompute"
DRAM_ARM = "dram"                   # LMCache with its DRAM tier only: no disk tier, no device to read
DISK_ARMS = ("local_nvme", "fx")    # LMCache arms with a disk tier on a block device
GB = 1e9


def said(template: str, **values) -> dict:
    """A part of a check's detail (the shape of gates.judge.validity.said, which imports this module)."""
    return {"template": template, "values": {k: str(v) for k, v in values.items()}}


def _check(name: str, problems: list[dict], seen: list[dict]) -> dict:
    parts = problems or seen
    return {"name": name, "ok": not problems, "detail": "; ".join(p["template"] % p["values"] for p in parts),
            "detail_said": parts}


def _positive(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return None
    return float(value)


def kv_bytes_per_token(summary: dict) -> tuple[float | None, str]:
    """(KV bytes one token takes on the deployed model, where the figure came from), from the phase summary:
    `tier_bytes.kv_bytes_per_token`, else `versions.kv_bytes_per_token` (the deploy manifest:
    runners.lmcache.kv_bytes_per_token), else computed from `versions.model` and `versions.kv_cache_dtype` with
    gates.sizing's model configurations (2 × layers × KV heads × head dim × bytes of the dtype)."""
    tier = summary.get("tier_bytes") if isinstance(summary.get("tier_bytes"), dict) else {}
    versions = summary.get("versions") if isinstance(summary.get("versions"), dict) else {}
    for where, value in (("tier_bytes.kv_bytes_per_token", tier.get("kv_bytes_per_token")),
                         ("versions.kv_bytes_per_token", versions.get("kv_bytes_per_token"))):
        found = _positive(value)
        if found is not None:
            return found, where
    config = sizing.MODEL_CONFIGS.get(str(versions.get("model") or ""))
    dtype = str(versions.get("kv_cache_dtype") or "")
    if config and dtype:
        dtype = config["activation_dtype"] if dtype == "auto" else dtype
        if dtype in sizing.DTYPE_BYTES:
            return (float(2 * config["layers"] * config["kv_heads"] * config["head_dim"] * sizing.DTYPE_BYTES[dtype]),
                    "versions.model and versions.kv_cache_dtype")
    return None, ""


def device_bytes(summary: dict) -> tuple[float | None, str | None, str | None]:
    """(device bytes read over the phase, the device's name, why there is no figure) from `tier_bytes`."""
    tier = summary.get("tier_bytes")
    if not isinstance(tier, dict):
        return None, None, "no tier_bytes (the device's read counters) in the phase summary"
    device = tier.get("device")
    if tier.get("error"):
        return None, device, f"the device counter could not be read: {tier['error']}"
    value = tier.get("device_read_bytes")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None, device, f"tier_bytes.device_read_bytes is {value!r}, not a byte count"
    if not device:
        return None, None, "tier_bytes names no device (the deploy's disk_device)"
    return float(value), str(device), None


def _where(summary: dict) -> str:
    instance = summary.get("instance") or summary.get("_source") or "an unnamed instance"
    return f"{summary['arm']}/{summary['phase']}@{summary['concurrency']} rep {summary['repetition']} on {instance}"


def _cold_summaries(gate, inputs, arms: tuple[str, ...] | None) -> list[dict]:
    phases = {s.phase for s in gate.criteria}
    if not phases & (set(COLD_PHASES) | {"any"}):
        return []
    wanted = {a for s in gate.criteria for a in (s.candidate, s.baseline) if a and a != RECOMPUTE_ARM}
    return [s for s in inputs.summaries if s["phase"] in COLD_PHASES and s["arm"] in wanted
            and (arms is None or s["arm"] in arms)]


def tolerance(judging: dict) -> tuple[float, float]:
    value = judging.get("tier_bytes_tolerance")
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return float(value[0]), float(value[1])
    return TIER_BYTES_TOLERANCE


def tier_bytes_match(gate, inputs, judging: dict) -> dict:
    """Over every cold window of an arm with a disk tier (local_nvme, fx), the device bytes read against the
    external hits × KV bytes per token: within the tolerance, or invalid with both figures. A missing or unreadable
    counter is invalid with the reason (never a pass): real and simulated alike (the simulator counts its disk
    tier's reads in the diskstats file it is given)."""
    low, high = tolerance(judging)
    problems, seen = [], []
    for summary in _cold_summaries(gate, inputs, DISK_ARMS):
        where = _where(summary)
        found = counters.external_hits(summary, inputs.summaries)
        if found is None:
            problems.append(said(gettext_noop("%(where)s: cannot be verified: no /metrics external-hit deltas to "
                                              "compare the device's bytes with"), where=where))
            continue
        hits = found[0]
        read, device, why = device_bytes(summary)
        if why:
            problems.append(said(gettext_noop("%(where)s: cannot be verified: %(why)s"), where=where, why=why))
            continue
        per_token, _source = kv_bytes_per_token(summary)
        if per_token is None:
            problems.append(said(gettext_noop("%(where)s: cannot be verified: no KV bytes per token recorded "
                                              "(versions.kv_bytes_per_token from the deploy manifest)"), where=where))
            continue
        expected = hits * per_token
        if expected <= 0:
            seen.append(said(gettext_noop("%(where)s: no external hits; the device %(device)s read %(read)s bytes"),
                             where=where, device=device, read=f"{read:,.0f}"))
            continue
        ratio = read / expected
        values = dict(where=where, device=device, read=f"{read:,.0f}", expected=f"{expected:,.0f}",
                      hits=f"{hits:,.0f}", per_token=f"{per_token:,.0f}", ratio=f"{ratio:.3g}",
                      low=f"{low:g}", high=f"{high:g}")
        if ratio < low - 1e-9:
            problems.append(said(gettext_noop(
                "%(where)s: the device %(device)s read %(read)s bytes, %(ratio)s× the %(expected)s bytes its "
                "%(hits)s external-hit tokens need at %(per_token)s bytes per token (tolerance %(low)s–%(high)s): "
                "a page cache, LMCache's DRAM or another reader served hits the device did not read"), **values))
        elif ratio > high + 1e-9:
            problems.append(said(gettext_noop(
                "%(where)s: the device %(device)s read %(read)s bytes, %(ratio)s× the %(expected)s bytes its "
                "%(hits)s external-hit tokens need at %(per_token)s bytes per token (tolerance %(low)s–%(high)s): "
                "another reader used the device during the window"), **values))
        else:
            seen.append(said(gettext_noop("%(where)s: device %(device)s read %(ratio)s× the bytes of its external "
                                          "hits"), where=where, device=device, ratio=f"{ratio:.3g}"))
    return _check("tier-bytes-match", problems[:10] + ([said(gettext_noop("%(n)s more"), n=len(problems) - 10)]
                                                       if len(problems) > 10 else []),
                  seen[:5] + ([said(gettext_noop("%(n)s more"), n=len(seen) - 5)] if len(seen) > 5 else [])
                  or [said(gettext_noop("no cold window of an arm with a disk tier"))])


def dram_cleared(gate, inputs) -> dict:
    """A cold window of an LMCache arm (dram, local_nvme, fx) starts with LMCache's DRAM emptied (the workload
    client's DELETE …/cache/clear?locations=LocalCPUBackend before the measure: `dram_cleared: true`); otherwise
    the hits it counts may be DRAM's and the window did not start cold."""
    problems, cleared = [], 0
    for summary in _cold_summaries(gate, inputs, None):
        value = summary.get("dram_cleared")
        if value is True:
            cleared += 1
        elif value is False:
            problems.append(said(gettext_noop("%(where)s: LMCache's DRAM was not emptied before the window "
                                              "(dram_cleared: false): the window did not start cold"),
                                 where=_where(summary)))
        else:
            problems.append(said(gettext_noop("%(where)s: cannot be verified: the phase summary does not say LMCache's "
                                              "DRAM was emptied before the window (no dram_cleared)"),
                                 where=_where(summary)))
    seen = [said(gettext_noop("%(n)s cold window(s) began with LMCache's DRAM emptied"), n=cleared)] if cleared else \
        [said(gettext_noop("no cold window of an LMCache arm"))]
    return _check("dram-cleared", problems[:10] + ([said(gettext_noop("%(n)s more"), n=len(problems) - 10)]
                                                   if len(problems) > 10 else []), seen)


def _num(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.6g}") + 0.0


def read_bw_windows(inputs) -> list[dict]:
    """Read bandwidth of every window of an arm with a disk tier: the device bytes read over the window's time
    (tier_bytes.seconds between the device's samples, else window_seconds, else duration_s) when `tier_bytes`
    exists (`source: device`, GB/s = 10⁹ bytes/s, the whole device); otherwise from LMCache's `Retrieved` lines of that arm and instance (`source: lmcache-retrieved`: Σ
    bytes ÷ Σ seconds of the retrievals, per GPU, not per window)."""
    out = []
    retrieves = inputs.retrieves
    for summary in inputs.summaries:
        if summary["arm"] not in DISK_ARMS or summary["phase"] == "populate":
            continue
        row = {"arm": summary["arm"], "phase": summary["phase"], "concurrency": int(summary["concurrency"]),
               "repetition": int(summary["repetition"]), "instance": summary.get("instance")}
        read, device, why = device_bytes(summary)
        # the window's time: between the device's two samples (tier_bytes.seconds), else the soak window's, else
        # the phase's first send to last end
        tier = summary.get("tier_bytes") if isinstance(summary.get("tier_bytes"), dict) else {}
        seconds = next((v for v in (tier.get("seconds"), summary.get("window_seconds"), summary.get("duration_s"))
                        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0), None)
        if read is not None and seconds is not None:
            row.update(source="device", device=device, device_read_bytes=_num(read), seconds=_num(float(seconds)),
                       gbps=_num(read / float(seconds) / GB))
        elif len(retrieves):
            mine = retrieves[retrieves["arm"] == summary["arm"]]
            if summary.get("instance"):   # a summary that names its instance: that instance's retrievals
                mine = mine[mine["instance"].astype(str) == str(summary["instance"])]
            mine = mine[mine["bytes"].notna() & mine["seconds"].notna()]
            total_s = float(mine["seconds"].sum()) if len(mine) else 0.0
            if total_s <= 0:
                continue
            row.update(source="lmcache-retrieved", device=None, device_read_bytes=None, seconds=_num(total_s),
                       gbps=_num(float(mine["bytes"].sum()) / total_s / GB), why=why)
        else:
            continue
        out.append(row)
    return out


def tier_shares(inputs, frame: pd.DataFrame) -> dict:
    """Per arm × phase with /metrics: the share of prompt tokens HBM (vLLM's prefix cache), DRAM (external hits
    − disk-served tokens) and the disk tier (device bytes ÷ KV bytes per token) served, and what was recomputed;
    per stratum (records with `stratum`): each stratum's cached share from its records, split between the tiers in
    the arm × phase's measured proportions (the counters are per window, not per request: an apportionment, and
    the block says so)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for summary in inputs.summaries:
        if summary["phase"] == "populate":
            continue
        groups.setdefault((summary["arm"], summary["phase"]), []).append(summary)
    rows = []
    for (arm, phase), summaries in sorted(groups.items()):
        prompt = hbm = external = disk = 0.0
        windows, disk_known, why = 0, True, None
        for summary in summaries:
            pair = summary.get("phase_metrics")
            if isinstance(pair, dict):   # a label's own scrapes (a soak window, a fault run's cut and recovery)
                before, after = pair.get("before") or {}, pair.get("after") or {}
            elif counters._shares_window(summary, inputs.summaries):
                continue                 # its pair is the whole loop's, shared with other labels: not its own
            else:
                before, after = summary.get("metrics_before") or {}, summary.get("metrics_after") or {}
            p = counters._delta(before, after, counters.PROMPT_TOKENS)
            if p is None:
                continue
            windows += 1
            prompt += p
            hbm += counters._delta(before, after, counters.GPU_HITS) or 0.0
            ext = counters._delta(before, after, counters.EXTERNAL_HITS) or 0.0
            external += ext
            if arm in DISK_ARMS:
                read, _device, reason = device_bytes(summary)
                per_token, _ = kv_bytes_per_token(summary)
                if read is None or per_token is None:
                    disk_known = False
                    why = reason or "no KV bytes per token recorded"
                else:
                    disk += min(read / per_token, ext) if ext > 0 else 0.0
        if windows == 0 or prompt <= 0:
            continue
        if arm not in DISK_ARMS:
            disk_source = "no disk tier" if arm != RECOMPUTE_ARM else "no KV connector"
        else:
            disk_source = "device bytes ÷ KV bytes per token" if disk_known else f"unknown: {why}"
        disk_tokens = disk if arm in DISK_ARMS and disk_known else (0.0 if arm not in DISK_ARMS else None)
        dram_tokens = None if disk_tokens is None else max(external - disk_tokens, 0.0)
        row = {"arm": arm, "phase": phase, "windows": windows, "prompt_tokens": _num(prompt),
               "hbm": _num(hbm / prompt), "external": _num(external / prompt),
               "dram": None if dram_tokens is None else _num(dram_tokens / prompt),
               "disk": None if disk_tokens is None else _num(disk_tokens / prompt),
               "disk_tier": arm if arm in DISK_ARMS else None,
               "recomputed": _num(max(prompt - hbm - external, 0.0) / prompt), "disk_source": disk_source}
        strata = _strata(frame, arm, phase, hbm, dram_tokens, disk_tokens)
        if strata:
            row["strata"] = strata
        rows.append(row)
    return {"basis": "arm × phase: /metrics deltas (HBM: vllm:prefix_cache_hits_total; external: "
                     "vllm:external_prefix_cache_hits_total) and the disk tier's device bytes (tier_bytes) ÷ KV bytes "
                     "per token; DRAM = external − disk. Per stratum: the stratum's cached tokens (records) split in "
                     "the arm × phase's measured proportions",
            "arms": rows}


def _strata(frame: pd.DataFrame, arm: str, phase: str, hbm: float, dram: float | None, disk: float | None) -> dict:
    if frame is None or "stratum" not in frame or not len(frame):
        return {}
    rows = frame[(frame["arm"] == arm) & (frame["phase"] == phase) & frame["ok"] & frame["stratum"].notna()]
    if not len(rows):
        return {}
    served = hbm + (dram or 0.0) + (disk or 0.0)
    out = {}
    for stratum, sub in rows.groupby("stratum", sort=True):
        prompt = float(sub["prompt_tokens"].sum())
        cached = float(sub["cached_tokens"].fillna(0).sum())
        if prompt <= 0:
            continue
        share = cached / prompt
        split = {name: None if part is None or served <= 0 else _num(share * part / served)
                 for name, part in (("hbm", hbm), ("dram", dram), ("disk", disk))}
        out[str(stratum)] = {"requests": int(len(sub)), "prompt_tokens": _num(prompt), "cached": _num(share), **split,
                             "recomputed": _num(1.0 - share)}
    return out


def attribute_retrievals(inputs, judging: dict):
    """(inputs, how each arm's retrievals were attributed). LMCache's `Retrieved` lines name no tier, and with its
    DRAM tier on (every arm fxpilot renders) the configuration attributes nothing (runners.lmcache.retrieval_tier:
    `tier` null). The device counters can: an arm's unattributed retrievals are its disk tier's when every cold
    window of that arm began with LMCache's DRAM emptied (`dram_cleared: true`), its device read the bytes of its
    external hits within the tolerance (as `tier-bytes-match`), and no GPU's retrievals hold more tokens than those
    windows' external hits × the tolerance's upper end (so none came from outside them: a DRAM hit elsewhere would
    add tokens). Otherwise they stay unattributed and `read-bw-measured` says so."""
    retrieves = inputs.retrieves
    if not len(retrieves) or "tier" not in retrieves:
        return inputs, {}
    low, high = tolerance(judging)
    how: dict[str, str] = {}
    tiers = retrieves["tier"].copy()
    for arm in DISK_ARMS:
        open_rows = (retrieves["arm"] == arm) & retrieves["tier"].isna()
        if not open_rows.any():
            continue
        cold = [s for s in inputs.summaries if s["arm"] == arm and s["phase"] in COLD_PHASES]
        reason, hits_total = None, 0.0
        if not cold:
            reason = "no cold window of the arm to attribute them by"
        for summary in cold:
            found = counters.external_hits(summary, inputs.summaries)
            read, _device, why = device_bytes(summary)
            per_token, _ = kv_bytes_per_token(summary)
            if summary.get("dram_cleared") is not True:
                reason = f"{_where(summary)} did not begin with LMCache's DRAM emptied"
            elif found is None or why or per_token is None:
                reason = f"{_where(summary)} has no device bytes or external hits to compare"
            elif found[0] > 0 and not low - 1e-9 <= read / (found[0] * per_token) <= high + 1e-9:
                reason = f"{_where(summary)}: its device bytes do not match its external hits"
            else:
                hits_total += found[0] if found else 0.0
            if reason:
                break
        if reason is None:
            per_gpu = retrieves[open_rows].groupby("gpu")["tokens"].sum()
            if len(per_gpu) and float(per_gpu.max()) > hits_total * high + 1e-9:
                reason = (f"GPU {int(per_gpu.idxmax())} retrieved {float(per_gpu.max()):,.0f} tokens, more than the "
                          f"{hits_total:,.0f} external hits of the cold windows: some came from outside them")
        if reason is None:
            tiers[open_rows] = arm
            how[arm] = (f"{int(open_rows.sum())} retrieval(s) attributed to the {arm} tier by its device counters: "
                        f"{len(cold)} cold window(s) began with LMCache's DRAM emptied and their device bytes match "
                        "their external hits")
        else:
            how[arm] = f"not attributed: {reason}"
    return replace(inputs, retrieves=retrieves.assign(tier=tiers)), how
