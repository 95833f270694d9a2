"""Words for verdicts, in English and Simplified Chinese: every verdict says its value, bar, interval,
n, what was compared and the rule that decided."""
from __future__ import annotations

from gates.plan import INVENTORY_METRICS

OPS_ZH = {">=": "≥", "<=": "≤", ">": ">", "<": "<", "==": "="}
OPS_EN = {">=": "≥", "<=": "≤", ">": ">", "<": "<", "==": "="}
VERDICT_ZH = {"pass": "通过", "marginal": "临界", "fail": "未通过", "invalid": "无效"}
METRIC_EN = {"capacity_agreement": "distance between the capped tier's external-hit share and the oracle's",
             "goodput": "goodput (share of requests meeting the TTFT and inter-token objectives)", "ttft": "TTFT", "throughput": "throughput", "error_rate": "failed-request rate", "hit_ratio": "hit ratio",
             "external_hit_ratio": "external-tier share of the prompt tokens HBM missed (/metrics)",
             "read_bw": "cold-read bandwidth per GPU", "output_match": "share of sessions with identical outputs",
             "gpu_count": "GPU count", "gpu_model_match": "GPU model match", "rocm_version": "ROCm version",
             "versions_recorded": "versions recorded", "link_speed_gbps": "slowest RDMA link speed",
             "fx_mounted_writable": "FX mounted writable", "fio_read_gbps": "fio sequential read"}
METRIC_ZH = {"capacity_agreement": "限容层级外部命中比例与预测值之差",
             "goodput": "有效吞吐（满足 TTFT 与词元间隔目标的请求比例）", "ttft": "TTFT", "throughput": "吞吐量", "error_rate": "失败请求率", "hit_ratio": "命中率",
             "external_hit_ratio": "HBM 未命中的提示词元中由外部层级提供的比例（/metrics）",
             "read_bw": "每 GPU 冷读带宽", "output_match": "输出一致的会话比例", "gpu_count": "GPU 数量",
             "gpu_model_match": "GPU 型号匹配", "rocm_version": "ROCm 版本", "versions_recorded": "版本已记录",
             "link_speed_gbps": "最慢 RDMA 链路速率", "fx_mounted_writable": "FX 已可写挂载",
             "fio_read_gbps": "fio 顺序读"}
STAT_EN = {"p50": "p50", "p90": "p90", "p99": "p99", "mean": "mean", "value": "", "min": "minimum", "max": "maximum",
           "cv": "coefficient of variation across repetitions", "count": "(observed count)"}
STAT_ZH = {"p50": "p50", "p90": "p90", "p99": "p99", "mean": "均值", "value": "", "min": "最小值", "max": "最大值",
           "cv": "各次重复间的变异系数", "count": "（观测计数）"}
COMPARISON_EN = {"speedup": "speed-up", "reduction": "reduction", "gain": "gain", "drift": "drift", "absolute": ""}
COMPARISON_ZH = {"speedup": "加速比", "reduction": "降低", "gain": "提升", "drift": "漂移", "absolute": ""}


def value_unit(spec, metric_unit: str) -> str:
    """The unit of a criterion's compared value: the plan's, else what the comparison yields."""
    return spec.unit or {"speedup": "×", "reduction": "fraction", "gain": "fraction", "drift": "fraction"}.get(
        spec.comparison, metric_unit)


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "fraction":
        percent = value * 100
        return f"{percent:.1f} %" if percent == 0 or abs(percent) >= 1 else f"{percent:.2g} %"
    if unit == "×":
        return f"{value:.2f}×"
    if unit == "version":
        return f"{value:g}"
    if unit == "requests":
        return f"{value:g}"
    return f"{value:.4g} {unit}".strip()


def number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def rule(verdict: str, op: str, threshold: float, ci: list | None, confidence: float, *,
         exact: bool = False) -> tuple[str, str]:
    """The sentence of the rule that decided, (English, Chinese). `exact`: a recorded fact, no interval."""
    level = f"{confidence * 100:g} %"
    bar = f"{OPS_EN[op]} {number(threshold)}"
    span = f"[{number(ci[0])}, {number(ci[1])}]" if ci and None not in ci else "[n/a]"
    if exact and verdict in ("pass", "fail"):
        value = number(ci[0]) if ci else "n/a"
        if verdict == "pass":
            return f"pass: {value} clears {bar} on every node", f"通过：每个节点的 {value} 均满足 {bar}"
        return f"fail: {value} does not clear {bar}", f"未通过：{value} 不满足 {bar}"
    if verdict == "pass":
        return (f"pass: the whole {level} interval {span} clears {bar}",
                f"通过：{level} 置信区间 {span} 整体满足 {bar}")
    if verdict == "fail":
        return (f"fail: no part of the {level} interval {span} clears {bar}",
                f"未通过：{level} 置信区间 {span} 没有任何部分满足 {bar}")
    if verdict == "marginal":
        return (f"marginal: the {level} interval {span} straddles {bar}; more repetitions or a joint review decide",
                f"临界：{level} 置信区间 {span} 跨越门槛 {bar}；需增加重复次数或由双方联合评审决定")
    return ("invalid: the run did not pass its validity checks, so no bar is judged",
            "无效：本次运行未通过有效性检查，不判定任何门槛")


SHORT_EN = {"pass": "pass: the whole interval clears the bar", "fail": "fail: no part of the interval clears the bar",
            "marginal": "marginal: the interval straddles the bar; more repetitions or a joint review decide",
            "invalid": "invalid: the run did not pass its validity checks"}
SHORT_ZH = {"pass": "通过：整个区间满足门槛", "fail": "未通过：区间没有任何部分满足门槛",
            "marginal": "临界：区间跨越门槛；需增加重复次数或由双方联合评审决定", "invalid": "无效：本次运行未通过有效性检查"}


def _zh(*parts: str) -> str:
    """Chinese runs together; a space where Latin letters or digits meet anything else (fx 的 TTFT p50 为)."""
    out = ""
    for part in filter(None, parts):
        if out and (out[-1].isascii() and out[-1].isalnum() or part[0].isascii() and part[0].isalnum()):
            out += " "
        out += part
    return out


def subject(spec, language: str) -> str:
    metric = (METRIC_EN if language == "en" else METRIC_ZH)[spec.metric]
    stat = (STAT_EN if language == "en" else STAT_ZH)[spec.statistic]
    if spec.metric == "fio_read_gbps":
        metric += f" ({spec.candidate or 'fx'})" if language == "en" else f"（{spec.candidate or 'fx'}）"
    return f"{metric} {stat}".strip() if language == "en" else _zh(metric, stat)


def where(cell: dict, spec, language: str) -> str:
    level = cell.get("concurrency")
    if spec.metric == "read_bw":
        return "From the LMCache retrieval log" if language == "en" else "根据 LMCache 读取日志"
    flight = cell.get("in_flight")
    if isinstance(flight, dict) and flight.get("max") is not None:
        # an open-loop phase: the concurrency measured in flight, not the client's cap (issue 44, item 5)
        mean = flight.get("mean")
        if language == "en":
            said = f"With at most {fmt(flight['max'], '')} requests in flight"
            said += f" (mean {fmt(mean, '')}" if mean is not None else " ("
            said += f"{'; ' if mean is not None else ''}the client's cap {level}), phase {spec.phase}"
            return said
        said = f"在途请求最多 {fmt(flight['max'], '')}"
        said += f"（平均 {fmt(mean, '')}；" if mean is not None else "（"
        return said + f"客户端上限 {level}）、{spec.phase} 阶段"
    if language == "en":
        phase = "all phases" if spec.phase == "any" else f"phase {spec.phase}"
        return f"At concurrency {level}, {phase}" if level is not None else f"In {phase}"
    phase = "所有阶段" if spec.phase == "any" else f"{spec.phase} 阶段"
    return f"在并发 {level}、{phase}" if level is not None else f"在 {phase}" if spec.phase != "any" else "在所有阶段"


def explain(spec, cell: dict, cells: list[dict], verdict: str, confidence: float, metric_unit: str,
            invalid_reasons: list[str]) -> tuple[str, str]:
    """The criterion's explanation (English, Chinese), built around its worst cell."""
    unit = value_unit(spec, metric_unit)
    level = f"{confidence * 100:g} %"
    ci = cell.get("ci") or [None, None]
    span_en = f"{level} interval {fmt(ci[0], unit)} – {fmt(ci[1], unit)}"
    span_zh = f"{level} 置信区间 {fmt(ci[0], unit)} – {fmt(ci[1], unit)}"
    bar_en = f"bar {OPS_EN[spec.op]} {fmt(spec.threshold, unit)}"
    bar_zh = f"门槛 {OPS_ZH[spec.op]} {fmt(spec.threshold, unit)}"
    value = fmt(cell.get("value"), unit)
    if spec.metric == "capacity_agreement":
        en, zh = capacity_words(cell, spec)
        rule_en, rule_zh = CAPACITY_RULE_EN[verdict], CAPACITY_RULE_ZH[verdict]
        return f"{en} {rule_en}", f"{zh}{rule_zh}"
    if spec.metric in INVENTORY_METRICS:
        nodes = ", ".join(f"{c['node']} {fmt(c['value'], unit)}" for c in cells)
        en = (f"Across {len(cells)} node(s) ({nodes}): {subject(spec, 'en')} = {value}; {bar_en}.")
        zh = (f"共 {len(cells)} 个节点（{nodes}）：{subject(spec, 'zh')} = {value}；{bar_zh}。")
    elif spec.comparison == "drift":
        early, late = cell.get("early_windows") or [], cell.get("late_windows") or []
        span_w = lambda w: f"{w[0]}–{w[-1]}" if w else "none"  # noqa: E731
        used = cell.get("statistic_used") or spec.statistic
        en = (f"{where(cell, spec, 'en')}: {spec.candidate} TTFT {used} went from "
              f"{fmt(cell.get('first_value'), metric_unit)} in the early steady windows ({span_w(early)}) to "
              f"{fmt(cell.get('last_value'), metric_unit)} in the late ones ({span_w(late)}), "
              f"{cell.get('warmup_windows')} warm-up window(s) left out: drift {value} ({span_en}; n = "
              f"{cell.get('n_first')} + {cell.get('n_last')} requests); {bar_en}.")
        zh = (f"{where(cell, spec, 'zh')}，{spec.candidate} 的 TTFT {used} 从前段稳定窗口（{span_w(early)}）的 "
              f"{fmt(cell.get('first_value'), metric_unit)} 变为后段稳定窗口（{span_w(late)}）的 "
              f"{fmt(cell.get('last_value'), metric_unit)}，不计 {cell.get('warmup_windows')} 个预热窗口："
              f"漂移 {value}（{span_zh}；n = {cell.get('n_first')} + {cell.get('n_last')} 个请求）；{bar_zh}。")
    elif spec.metric == "error_rate" and cell.get("method") == "exact count":
        en = (f"{where(cell, spec, 'en')}: {spec.candidate} had {cell.get('failures')} failed request(s) of "
              f"{cell.get('n_candidate')} (an observed count, no interval); {bar_en}.")
        zh = (f"{where(cell, spec, 'zh')}，{spec.candidate} 在 {cell.get('n_candidate')} 个请求中有 "
              f"{cell.get('failures')} 个失败（观测计数，无区间）；{bar_zh}。")
    elif spec.baseline and spec.comparison != "absolute":
        what_en, what_zh = COMPARISON_EN[spec.comparison], COMPARISON_ZH[spec.comparison]
        count = "repetitions" if spec.metric == "throughput" else "requests"
        en = (f"{where(cell, spec, 'en')}: {spec.candidate} {subject(spec, 'en')} "
              f"{fmt(cell.get('candidate_value'), metric_unit)} vs {spec.baseline} {fmt(cell.get('baseline_value'), metric_unit)}"
              f": {what_en} {value} ({span_en}; n = {cell.get('n_candidate')} + {cell.get('n_baseline')} {count}); {bar_en}.")
        count_zh = "次重复" if spec.metric == "throughput" else "个请求"
        zh = (f"{where(cell, spec, 'zh')}，{_zh(spec.candidate + ' 的', subject(spec, 'zh'), '为')} "
              f"{fmt(cell.get('candidate_value'), metric_unit)}，{spec.baseline} 为 {fmt(cell.get('baseline_value'), metric_unit)}"
              f"：{what_zh} {value}（{span_zh}；n = {cell.get('n_candidate')} + {cell.get('n_baseline')} {count_zh}）；{bar_zh}。")
    else:
        against_en = f" (sessions compared with {spec.baseline})" if spec.baseline else ""
        against_zh = f"（与 {spec.baseline} 逐会话比较）" if spec.baseline else ""
        arm = spec.candidate or "all arms"
        count = {"output_match": "sessions", "read_bw": "retrievals", "throughput": "repetitions",
                 "external_hit_ratio": "prompt tokens HBM missed"}.get(spec.metric, "requests")
        count_zh = {"output_match": "个会话", "read_bw": "次读取", "throughput": "次重复",
                    "external_hit_ratio": "个 HBM 未命中的提示词元"}.get(spec.metric, "个请求")
        en = (f"{where(cell, spec, 'en')}: {arm} {subject(spec, 'en')}{against_en} = {value} ({span_en}; "
              f"n = {cell.get('n_candidate')} {count}); {bar_en}.")
        zh = (f"{where(cell, spec, 'zh')}，{_zh((spec.candidate or '所有配置') + ' 的', subject(spec, 'zh'))}{against_zh} = {value}"
              f"（{span_zh}；n = {cell.get('n_candidate')} {count_zh}）；{bar_zh}。")
    if (spec.metric in INVENTORY_METRICS or cell.get("method") == "exact count" or cell.get("exact")) \
            and verdict in ("pass", "fail"):
        rule_en, rule_zh = rule(verdict, spec.op, spec.threshold, cell.get("ci"), confidence, exact=True)
    else:
        rule_en, rule_zh = SHORT_EN[verdict], SHORT_ZH[verdict]
    en, zh = f"{en} {rule_en[0].upper()}{rule_en[1:]}.", f"{zh}{rule_zh}。"
    if cell.get("strata"):
        strata_en, strata_zh = strata_words(cell)
        en, zh = f"{en} {strata_en}", f"{zh}{strata_zh}"
    levels = [c.get("concurrency") for c in cells if c.get("concurrency") is not None]
    if len(levels) > 1:
        tally = ", ".join(f"{c['concurrency']}: {c['verdict']}" for c in cells)
        tally_zh = "，".join(f"{c['concurrency']}：{VERDICT_ZH.get(c['verdict'], c['verdict'])}" for c in cells)
        en += f" Each of {len(levels)} concurrency levels must pass ({tally}); the worst is shown."
        zh += f"{len(levels)} 个并发级别均须通过（{tally_zh}）；此处显示最差者。"
    if verdict == "invalid" and invalid_reasons:
        en += " Not judged because the run is invalid: " + "; ".join(invalid_reasons) + "."
        zh += " 因运行无效而未判定：" + "；".join(invalid_reasons) + "。"
    return en, zh


CAPACITY_RULE_EN = {
    "pass": "Pass: within the tolerance, so the capacity curve the sizing rests on holds on the tier.",
    "marginal": "Marginal: not within the tolerance, but not clearly below the prediction either (or the check "
                "cannot be made on this traffic); a joint review decides.",
    "fail": "Fail: the tier served clearly less (more than twice the tolerance) than a cache of its configured "
            "size must; capacity bought from the curve would under-deliver.",
    "invalid": "Invalid: the run did not pass its validity checks."}
CAPACITY_RULE_ZH = {
    "pass": "通过：在容差之内，容量规划所依据的容量曲线在该层级上成立。",
    "marginal": "临界：不在容差之内，但也未明显低于预测值（或此流量无法进行该检查）；由双方联合评审决定。",
    "fail": "未通过：该层级提供的命中明显少于（超过两倍容差）其配置容量的缓存应提供的命中；按曲线采购的容量将达不到预期。",
    "invalid": "无效：本次运行未通过有效性检查。"}


def capacity_words(cell: dict, spec) -> tuple[str, str]:
    """The capacity check in words: the cap, the measured and predicted shares, their difference, the tolerance."""
    tolerance = fmt(spec.threshold, "fraction")
    if not cell.get("applicable"):
        if cell.get("reason") == "little-reuse":
            share = fmt(cell.get("ideal_hit_fraction"), "fraction")
            return (f"Capacity check not made: this traffic has little reuse (at most {share} of its prompt tokens "
                    f"could ever come from a cache), so a capped tier has nothing to show; this is the traffic, not "
                    f"an FX failure.",
                    f"未进行容量检查：此流量的复用很少（其提示词元中最多 {share} 可能来自缓存），限容层级无从体现；"
                    f"这是流量本身的特点，而非 FX 的失败。")
        return ("Capacity check not made: the reuse of the replayed traffic is unknown (its format carries no block "
                "ids), so no capacity can be predicted for it.",
                "未进行容量检查：所回放流量的复用情况未知（其格式不含块标识），无法为其预测容量。")
    tokens, needed = f"{cell.get('capacity_tokens'):,}", f"{cell.get('capacity_for_share_tokens'):,}"
    fraction, share = fmt(cell.get("fraction"), "fraction"), fmt(cell.get("share"), "fraction")
    predicted = fmt(cell.get("predicted"), "fraction")
    if cell.get("measured") is None:
        return (f"With the FX tier capped at {tokens} tokens (what captures {fraction} of the sample's reuse; {needed} "
                f"capture {share}) the oracle predicts {predicted} of the prompt tokens from the tier; no /metrics "
                f"of the capped replay were recorded.",
                f"FX 层级限容为 {tokens} 个词元（可捕获样本 {fraction} 复用的容量；捕获 {share} 需 {needed} 个词元）时，"
                f"预测 {predicted} 的提示词元来自该层级；未记录限容回放的 /metrics。")
    measured, difference = fmt(cell.get("measured"), "fraction"), cell.get("difference") or 0.0
    points = f"{difference * 100:+.1f} points"
    return (f"With the FX tier capped at {tokens} tokens (what captures {fraction} of the sample's reuse; {needed} "
            f"capture {share}) the tier served {measured} of the prompt tokens (/metrics, n = {cell.get('n_candidate')} "
            f"tokens); the oracle predicts {predicted} for that capacity: difference {points}, tolerance ± {tolerance}.",
            f"FX 层级限容为 {tokens} 个词元（可捕获样本 {fraction} 复用的容量；捕获 {share} 需 {needed} 个词元）时，"
            f"该层级提供了 {measured} 的提示词元（/metrics，n = {cell.get('n_candidate')} 个词元）；"
            f"预测该容量下为 {predicted}：相差 {difference * 100:+.1f} 个百分点，容差 ± {tolerance}。")


def little_reuse(english: str, chinese: str, ideal: float) -> tuple[str, str]:
    """A replay criterion on traffic with little reuse says so first: the traffic, never an FX failure."""
    share = fmt(ideal, "fraction")
    return (f"This traffic has little reuse: at most {share} of its prompt tokens could ever come from a cache, so "
            f"the replay cannot show a cache tier's benefit — this is the traffic, not an FX failure (a joint review "
            f"decides). {english}",
            f"此流量的复用很少：其提示词元中最多 {share} 可能来自缓存，因此回放无法体现缓存层级的收益 — "
            f"这是流量本身的特点，而非 FX 的失败（由双方联合评审决定）。{chinese}")


def fits_above_fx(english: str, chinese: str, sizing: dict) -> tuple[str, str]:
    """A replay criterion on a sample whose working set fits in the caches above FX says so first: the sample, never
    an FX failure (issue 44: a sample that fits in HBM measures HBM, not FX)."""
    ws, above = sizing.get("working_set_tokens"), sizing.get("above_fx_tokens")
    if isinstance(ws, (int, float)) and isinstance(above, (int, float)):
        en = f"its working set ({int(ws):,} tokens) fits in what sits above FX (HBM + DRAM: {int(above):,} tokens)"
        zh = f"其工作集（{int(ws):,} 个词元）可全部容纳于 FX 之上的缓存（HBM + DRAM：{int(above):,} 个词元）"
    else:
        en, zh = "its working set fits in what sits above FX (HBM + DRAM)", "其工作集可全部容纳于 FX 之上的缓存（HBM + DRAM）"
    return (f"The replayed sample does not need the FX tier: {en}, so its returns are served above FX and the replay "
            f"cannot show what FX adds — this is the sample, not an FX failure (a joint review decides; a larger "
            f"sample of the trace, or the whole trace, would need the tier). {english}",
            f"回放样本不需要 FX 层：{zh}，因此回访请求由 FX 之上的缓存提供，回放无法体现 FX 的增益 — "
            f"这是样本的问题，而非 FX 的失败（由双方联合评审决定；更大的样本或完整轨迹才会需要该层）。{chinese}")


def strata_words(cell: dict) -> tuple[str, str]:
    """Which strata a replay criterion judged, and the mix the replay sent."""
    names_en = {"first": "first turns", "shared_prefix": "first turns sharing a prefix across sessions",
                "returning": "returning turns", "unstratified": "unstratified"}
    names_zh = {"first": "首轮请求", "shared_prefix": "与其他会话共享前缀的首轮请求", "returning": "回访请求",
                "unstratified": "未分层"}
    judged = cell.get("strata") or []
    mix = cell.get("mix") or {}
    mix_en = ", ".join(f"{names_en.get(k, k)} {v}" for k, v in mix.items())
    mix_zh = "，".join(f"{names_zh.get(k, k)} {v}" for k, v in mix.items())
    return (f"Judged on {' and '.join(names_en.get(s, s) for s in judged)} (where the tier can help); the replay "
            f"sent {mix_en}.",
            f"按{'与'.join(names_zh.get(s, s) for s in judged)}判定（层级能起作用之处）；回放发送了{mix_zh}。")


def gate_explanation(label: str, verdict: str, criteria: list[dict], failed_checks: list[dict]) -> tuple[str, str]:
    if verdict == "invalid":
        reasons = "; ".join(f"{c['name']}: {c['detail']}" for c in failed_checks)
        return (f"{label} invalid — the run cannot be judged until it is valid: {reasons}.",
                f"{label} 无效 — 运行有效之前无法判定：{reasons}。")
    reported = [c for c in criteria if c.get("gating") is False]
    criteria = [c for c in criteria if c.get("gating") is not False]
    counts = {v: [c["key"] for c in criteria if c["verdict"] == v] for v in ("pass", "marginal", "fail")}
    en = f"{label} {verdict}: {len(counts['pass'])} of {len(criteria)} criteria pass"
    zh = f"{label} {VERDICT_ZH[verdict]}：{len(criteria)} 项标准中 {len(counts['pass'])} 项通过"
    if reported:
        en += f" (reported beside them, not deciding: {', '.join(c['key'] + ' ' + c['verdict'] for c in reported)})"
        zh += f"（另列而不决定关卡：{', '.join(c['key'] + ' ' + VERDICT_ZH.get(c['verdict'], c['verdict']) for c in reported)}）"
    if counts["fail"]:
        en += f"; failed: {', '.join(counts['fail'])}"
        zh += f"；未通过：{', '.join(counts['fail'])}"
    if counts["marginal"]:
        en += f"; marginal: {', '.join(counts['marginal'])}"
        zh += f"；临界：{', '.join(counts['marginal'])}"
    return en + ".", zh + "。"
