"""The procurement report's first page in plain words, in the active language (gettext).

Pure: it reads the context built by context.py and returns sentences. Every figure carries its interval
and says whether it was measured at the customer's concurrency, interpolated between two measured
levels, or measured at another level only.
"""
from __future__ import annotations

from typing import Any

from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from gates.plan import TRACE_GATE
from reports import units
from reports.units import figure

ARM_NAMES = {
    "local_nvme": gettext_lazy("one local NVMe disk"), "recompute": gettext_lazy("full recompute (no stored cache)"),
    "dram": gettext_lazy("host memory only"), "hbm": gettext_lazy("GPU memory only"),
}
SETTING_LABELS = {
    "fs_overhead": gettext_lazy("file-system overhead"), "redundancy": gettext_lazy("redundancy"),
    "headroom": gettext_lazy("headroom"), "chunk_tokens": gettext_lazy("chunk size"),
}
GATE_REASONS = {
    "": gettext_lazy("not evaluated, so its claim is not established."),
    "marginal": gettext_lazy("the result was too close to the bar to decide (marginal), so its claim is not "
                             "established."),
    "fail": gettext_lazy("failed: its claim does not hold on this cluster."),
    "invalid": gettext_lazy("the measurement was not valid, so nothing was decided: its claim is not established."),
}
ACCEPTED_REASON = gettext_lazy("the result was too close to the bar to decide (marginal); both parties accepted it in "
                               "joint review, which is not a bar met: its claim is not established.")


def number(value: float | None, places: int | None = None) -> str:
    if value is None:
        return "—"
    if places is None:
        places = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2
    return units.fixed(value, places)


def percent(value: float | None) -> str:
    return units.percent(value, 1)


def times(value: float | None) -> str:
    return "—" if value is None else units.fixed(value, 1) + "×"


def tera(value: float | None) -> str:
    return "—" if value is None else units.fixed(value / 1e12, 1) + " TB"


def _interval(ci: list | None, unit: str, confidence: float | None) -> str:
    """The interval at the confidence the judge used for it (96 % at a first look, 99.5 % at an extension)."""
    low, high = (list(ci or []) + [None, None])[:2]
    if low is None or high is None:
        return _("no interval")
    args = {"low": figure(low, unit), "high": figure(high, unit)}
    if not confidence:
        return _("interval %(low)s to %(high)s") % args
    return _("%(level)s %% interval %(low)s to %(high)s") % dict(args, level=f"{100 * float(confidence):.4g}")


def arm_name(arm: str, fx_model: str) -> str:
    return fx_model if arm == "fx" else str(ARM_NAMES.get(arm, arm))


UNDETERMINED_FACTOR = 10
"""A ratio whose interval's upper end is more than this many times its lower end is said to be undetermined on the
procurement report's first page, not quoted as a figure (the tables keep the measured value and interval)."""


def gain_sentence(row: dict[str, Any], fx_model: str, concurrency: int) -> str | None:
    """One comparison as a reader says it: what is faster or larger, by how much, against what, and how we know."""
    value, unit = row.get("value"), row.get("unit", "")
    if value is None:
        return None
    args = {"fx": arm_name(row.get("candidate") or "fx", fx_model), "base": arm_name(row.get("baseline") or "", fx_model),
            "value": figure(value, unit), "interval": _interval(row.get("ci"), unit, row.get("confidence")), "n": concurrency}
    metric, comparison = row.get("metric"), row.get("comparison")
    low, high = (list(row.get("ci") or []) + [None, None])[:2]
    if (unit == "×" and isinstance(low, (int, float)) and isinstance(high, (int, float)) and low > 0
            and high / low > UNDETERMINED_FACTOR):
        # an interval this wide says the gain was not determined: its point value is no headline figure
        what = _("the gain of %(fx)s against %(base)s is undetermined: its %(interval)s spans more than a factor of "
                 "%(factor)s, so no figure is quoted") % dict(args, factor=UNDETERMINED_FACTOR)
    elif comparison == "speedup" and metric == "ttft":
        what = _("with %(fx)s the first token arrives %(value)s sooner than with %(base)s (%(interval)s)") % args
    elif comparison == "reduction" and metric == "ttft":
        what = _("with %(fx)s the time to the first token is %(value)s shorter than with %(base)s (%(interval)s)") % args
    elif comparison == "gain" and metric == "throughput":
        what = _("with %(fx)s the servers produce %(value)s more tokens per second than with %(base)s (%(interval)s)") % args
    else:
        what = _("%(fx)s against %(base)s: %(value)s (%(interval)s)") % args
    how = row.get("how")
    if how == "own-traffic":
        return _("On a replay of your own sessions, %(what)s.") % {"what": what}
    if how == "sample-trace":
        return _("On a replay of a generated sample trace — not the customer's traffic — %(what)s.") % {"what": what}
    if how == "measured":
        return _("At %(n)s conversations in flight (measured there), %(what)s.") % dict(args, what=what)
    if how == "interpolated":
        return _("At %(n)s conversations in flight (interpolated between the measured levels %(levels)s; the interval "
                 "spans both levels' intervals), %(what)s.") % dict(
            args, what=what, levels=" – ".join(map(str, _neighbours(row.get("levels") or [], concurrency))))
    if how == "measured-overall":
        return _("Over all measured levels, %(what)s.") % {"what": what}
    return None


def _neighbours(levels: list[int], concurrency: int) -> list[int]:
    below = [x for x in levels if x < concurrency][-1:]
    above = [x for x in levels if x > concurrency][:1]
    return below + above


def recompute_sentence(row: dict[str, Any] | None, fx_model: str) -> str:
    if not row or row.get("value") is None:
        return _("The speed-up against full recompute was not measured.")
    args = {"fx": fx_model, "value": times(row["value"]), "interval": _interval(row.get("ci"), "×", row.get("confidence")),
            "n": row["concurrency"], "at": row.get("at"), "between": " – ".join(map(str, row.get("between") or []))}
    if row["how"] == "measured":
        return _("Against full recompute: at your %(n)s conversations in flight, %(fx)s brings the first token "
                 "%(value)s sooner (%(interval)s), measured at that concurrency.") % args
    if row["how"] == "interpolated":
        return _("Against full recompute: at your %(n)s conversations in flight, about %(value)s sooner "
                 "(%(interval)s) — interpolated between %(between)s, not measured at %(n)s.") % args
    return _("Against full recompute: %(value)s sooner (%(interval)s) at %(at)s conversations in flight, the only "
             "level where recompute was measured; your %(n)s were not measured against recompute, so this is the "
             "nearest evidence, not a projection.") % args


def decision_sentence(context: dict[str, Any], units: int | None) -> str:
    d, pilot = context["decision"], context["pilot"]
    fx = pilot["model_under_test"]
    trace = context.get("trace")
    sample = trace is not None and not trace.get("customer")
    # The outcome's own words (gates/outcome.py: the overview, the API and the demo say the same), then what a
    # purchase may rest on.
    sentence = d["decision"]["zh-hans" if context.get("is_zh") else "en"]
    if d["outcome"] == "proven":
        if units and (context.get("simulated") or sample):  # not measured customer evidence: never said to be
            sentence += " " + _("The %(units)s %(fx)s unit(s) below are sized from these results, but they are not "
                                "measured evidence of the customer's own workload (see below).") % {"fx": fx, "units": units}
        elif units:
            sentence += " " + _("Buying %(units)s %(fx)s unit(s) for this workload rests on measured evidence.") % {
                "fx": fx, "units": units}
    elif d["outcome"] == "accepted":
        sentence += " " + _("A purchase would rest on the joint review's acceptance, not on a bar that was met.")
    elif d["outcome"] in ("not-proven", "halted"):
        sentence += " " + _("The gain is not established and nothing should be bought on this evidence.")
    else:
        sentence += " " + _("The pilot has not proven the gain yet.")
    if units and (context.get("sizing") or {}).get("fx_unit_usable_tb_basis") == "assumed-example":
        sentence += " " + _("The unit count rests on an assumed example capacity of one unit, not a published figure.")
    if context.get("simulated"):
        sentence += " " + _("Simulated — not evidence: these results come from simulated nodes.")
    if sample:
        sentence += " " + _("G4 replayed a generated sample trace — not the customer's traffic.")
    return sentence


def sizing_sentences(s: dict[str, Any], fx: str) -> list[str]:
    """The capacity to buy, step by step, and what is missing to give the number of units."""
    lines = []
    if s.get("kv_bytes_per_token"):
        lines.append(_("Each token of context keeps %(bytes)s bytes of KV cache: 2 × %(layers)s layers × %(heads)s KV "
                       "heads × %(dim)s head dimension × %(dtype_bytes)s byte(s) of %(dtype)s.") % {
            "bytes": f"{s['kv_bytes_per_token']:,}", "layers": s["layers"], "heads": s["kv_heads"], "dim": s["head_dim"],
            "dtype_bytes": s["kv_bytes_per_token"] // (2 * s["layers"] * s["kv_heads"] * s["head_dim"]), "dtype": s["kv_dtype"]})
    sessions = s.get("sessions") or {}
    if s.get("session_tokens"):
        source = {"customer-trace": _("your trace"), "sample-trace": _("a generated sample trace — not your sessions"),
                  "setting": _("the pilot setting session_tokens")}.get(s["session_source"], s["session_source"])
        lines.append(_("Sessions: %(retained)s kept for reuse, each sized at the %(stat)s length of %(tokens)s tokens "
                       "(%(source)s; %(count)s sessions, mean %(mean)s), stored in chunks of %(chunk)s tokens.") % {
            "retained": f"{s['sessions_retained']:,}", "stat": s["session_statistic"],
            "tokens": f"{int(s['session_tokens']):,}", "source": source, "count": sessions.get("sessions") or 1,
            "mean": number(sessions.get("mean"), 0), "chunk": s["chunk_tokens"]})
        if not s.get("customer_sessions"):
            lines.append(_("This sizing is not based on the customer's sessions."))
    reuse = s.get("reuse") if s.get("capacity_basis") == "reuse-curve" else None
    if reuse:
        lines.append(_("Sized from your trace's own reuse: an LRU cache of %(tokens)s tokens captures %(share)s of "
                       "the reuse the trace allows (at most %(ideal)s of its prompt tokens can come from a cache); "
                       "the session-length formula would have said %(formula)s.") % {
            "tokens": f"{reuse['capacity_tokens']:,}", "share": percent(reuse["share"]),
            "ideal": percent(reuse["ideal_hit_fraction"]),
            "formula": tera(s["session_formula_bytes"]) if s.get("session_formula_bytes") else "—"})
        scale = reuse.get("scale") or {}
        if scale.get("sessions"):
            lines.append(_("The trace holds %(sessions)s sessions (%(requests)s requests over %(seconds)s s): this is "
                           "the capacity traffic of that volume needs; more sessions alive at once need more.") % {
                "sessions": f"{scale['sessions']:,}", "requests": f"{scale['requests']:,}",
                "seconds": f"{scale['duration_s']:,.0f}"})
    if s.get("capacity_bytes"):
        lines.append(_("KV cache to keep: %(kv)s; with %(fs)s file-system overhead, redundancy ×%(red)s and %(head)s "
                       "headroom: %(total)s to buy.") % {
            "kv": tera(s["kv_bytes"]), "fs": percent(s["fs_overhead"]), "red": number(s["redundancy"], 1),
            "head": percent(s["headroom"]), "total": tera(s["capacity_bytes"])})
    if s.get("fx_units"):
        lines.append(_("That is %(units)s %(fx)s unit(s) of %(each)s usable each.") % {
            "units": s["fx_units"], "fx": fx, "each": f"{s['fx_unit_usable_tb']:,.1f} TB"})
        if s.get("fx_unit_usable_tb_basis") == "assumed-example":
            lines.append(_("This unit count rests on an assumed example figure for the demo — %(each)s usable per "
                           "unit — not a published one: nothing published states the usable capacity of one %(fx)s.") % {
                "each": f"{s['fx_unit_usable_tb']:,.1f} TB", "fx": fx})
    elif s.get("capacity_bytes"):
        lines.append(_("The number of %(fx)s units cannot be given: the usable capacity of one unit is not published; "
                       "set the sizing setting fx_unit_usable_tb.") % {"fx": fx})
    else:
        lines.append(_("The capacity cannot be computed yet: %(missing)s missing.") % {
            "missing": ", ".join(s.get("missing") or []) or "—"})
    if s.get("settings_error"):
        lines.append(_("The pilot's sizing settings were refused (%(error)s); the defaults were used.") % {
            "error": s["settings_error"]})
    return lines


def sizing_sources(s: dict[str, Any]) -> dict[str, str]:
    dtype = {"setting": _("sizing setting kv_cache_dtype"), "setting-auto": _("sizing setting kv_cache_dtype auto: the model's dtype"),
             "vllm-flag": _("the deployment's --kv-cache-dtype flag"),
             "vllm-default": _("vLLM's default kv-cache dtype auto: the model's activation dtype")}.get(s.get("kv_dtype_source"), "")
    sessions = {"customer-trace": _("the customer's trace replayed by G4"),
                "sample-trace": _("a generated sample trace — not the customer's traffic; this sizing is not based on "
                                  "the customer's sessions"),
                "setting": _("the pilot setting session_tokens")}.get(s.get("session_source"), "")
    detail = s.get("session_detail") or ""
    return {"dtype": dtype, "sessions": f"{sessions} ({detail})" if detail and s.get("session_source") != "setting" else sessions}


def procurement_summary(context: dict[str, Any], is_zh: bool) -> dict[str, Any]:
    """The plain-words first page: the decision, gains, recompute, capacity; proven and not proven."""
    pilot = context["pilot"]
    fx, concurrency = pilot["model_under_test"], pilot["customer_concurrency"]
    trace = context.get("trace")
    sample = trace is not None and not trace.get("customer")
    proven, not_proven = [], []
    for item in context["gates"]:
        gate, evaluation = item["gate"], item["evaluation"]
        name = (gate.get("name_zh") if is_zh else "") or gate["name"]
        verdict = evaluation["verdict"] if evaluation else ""
        proves = (gate.get("proves_zh") if is_zh else "") or gate.get("proves") or gate["label"]
        if gate.get("number") == TRACE_GATE and sample:  # the plan's words claim the customer's traffic
            proves = _("The gain holds on a replay of a generated sample trace — not the customer's traffic — and in "
                       "operation; the customer's own traffic was not tested.")
        entry = {"label": gate["label"], "name": name, "proves": proves, "signed_off": gate["state"] == "signed_off",
                 "history": item.get("history_summary") or {}}
        if verdict == "pass":
            proven.append(entry)
        else:
            accepted = verdict == "marginal" and gate["state"] == "signed_off"
            not_proven.append(dict(entry, reason=str(ACCEPTED_REASON if accepted else GATE_REASONS.get(
                verdict, gettext_lazy("not established.")))))
    # The closed-loop speed-up against recompute has its own sentence (recompute_sentence); a replay's is a gain here.
    rows = [row for row in context["projections"] if row.get("baseline") != "recompute" or row.get("phase") == "replay"]
    gains = [sentence for row in rows if (sentence := gain_sentence(row, fx, concurrency))]
    caveats = [_("The gain comes from stored conversations being reused. Short chats at low concurrency are rarely "
                 "reused and gain little; long contexts, multi-turn chat, agents and coding assistants gain most.")]
    levels = sorted({level for row in context["projections"] for level in row["levels"]})
    if levels and not levels[0] <= concurrency <= levels[-1]:
        caveats.append(_("Your concurrency (%(n)s) lies outside the measured levels (%(levels)s): the gain there was not "
                         "measured.") % {"n": concurrency, "levels": ", ".join(map(str, levels))})
    if context["simulated"]:
        caveats.insert(0, _("Everything in this report comes from simulated nodes: nothing about the real array is proven."))
    sizing = context.get("sizing") or {}
    return {
        "decision": decision_sentence(dict(context, is_zh=is_zh), sizing.get("fx_units")),
        "outcome": context["decision"]["outcome"], "gains": gains,
        "recompute": recompute_sentence(context.get("recompute"), fx), "sizing": sizing_sentences(sizing, fx),
        "units": sizing.get("fx_units"), "sources": sizing_sources(sizing),
        "display": {"fs_overhead": percent(sizing.get("fs_overhead")), "headroom": percent(sizing.get("headroom")),
                    "defaults": "、".join(str(SETTING_LABELS.get(k, k)) for k in sizing.get("defaults_used") or [])
                    if is_zh else ", ".join(str(SETTING_LABELS.get(k, k)) for k in sizing.get("defaults_used") or [])},
        "proven": proven, "not_proven": not_proven, "caveats": caveats,
        "nodes": len(context.get("inventory") or []) or "—",
    }
