"""SVG charts of a verdict (fxpilot.verdict/1), shared by the PDF reports and the portal.

`line_chart` and `cdf_chart` are pure (numbers and labels in, SVG text out). `gate_charts` picks
the standard set for one verdict and takes its labels from the active language (gettext).
"""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from django.utils import translation
from django.utils.translation import gettext as _

FONT_STACK = "'DejaVu Sans', 'Noto Sans CJK SC', sans-serif"
# WeasyPrint's SVG text takes the first family that exists and falls back through fontconfig, which prefers the
# Japanese CJK face: a Chinese chart names the Simplified-Chinese face first.
FONT_STACK_ZH = "'Noto Sans CJK SC', 'DejaVu Sans', sans-serif"


def font_stack() -> str:
    return FONT_STACK_ZH if (translation.get_language() or "").lower().startswith("zh") else FONT_STACK
ARM_COLOURS = {"fx": "#0f766e", "local_nvme": "#c2410c", "recompute": "#6b7280", "dram": "#7c3aed", "hbm": "#2563eb"}
EXTRA_COLOURS = ["#b91c1c", "#ca8a04", "#0369a1", "#be185d", "#4d7c0f"]
BAR_COLOUR = "#dc2626"
WIDTH, HEIGHT = 640, 300
LEFT, RIGHT, TOP, BOTTOM = 64, 150, 34, 46


@dataclass(frozen=True)
class Chart:
    key: str
    title: str
    svg: str


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    low: float | None = None
    high: float | None = None


def arm_colour(arm: str, arms: list[str]) -> str:
    if arm in ARM_COLOURS:
        return ARM_COLOURS[arm]
    others = [a for a in arms if a not in ARM_COLOURS]
    return EXTRA_COLOURS[others.index(arm) % len(EXTRA_COLOURS)] if arm in others else EXTRA_COLOURS[0]


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.0f}"
    if magnitude >= 1:
        return f"{value:.1f}".rstrip("0").rstrip(".")
    return f"{value:.2g}"


def _linear_ticks(low: float, high: float, count: int = 5) -> list[float]:
    span = max(high - low, 1e-12)
    raw = span / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.floor(low / step) * step
    return [round(first + i * step, 10) for i in range(int(math.ceil((high - first) / step)) + 1)]


def _log_ticks(low: float, high: float) -> list[float]:
    ticks = []
    for exponent in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1):
        for mantissa in (1, 2, 5):
            value = mantissa * 10 ** exponent
            if low <= value <= high:
                ticks.append(value)
    return ticks or [low, high]


class _Axis:
    """Maps data to pixels; logarithmic when the data span more than a factor of 10."""

    def __init__(self, values: list[float], start: float, end: float, *, from_zero: bool, allow_log: bool = True):
        positive = [v for v in values if v > 0]
        self.log = allow_log and len(positive) == len(values) and positive and max(positive) / min(positive) > 10
        if self.log:
            self.low = 10 ** math.floor(math.log10(min(positive)))
            self.high = 10 ** math.ceil(math.log10(max(positive)))
            self.ticks = _log_ticks(self.low, self.high)
        else:
            low = 0.0 if from_zero else min(values, default=0.0)
            high = max(values, default=1.0)
            if high <= low:
                high = low + (abs(low) or 1.0)
            self.ticks = _linear_ticks(low, high)
            self.low, self.high = self.ticks[0], self.ticks[-1]
        self.start, self.end = start, end

    def __call__(self, value: float) -> float:
        if self.log:
            value = max(value, self.low)
            share = (math.log10(value) - math.log10(self.low)) / (math.log10(self.high) - math.log10(self.low))
        else:
            share = (value - self.low) / ((self.high - self.low) or 1.0)
        return self.start + share * (self.end - self.start)


def _text(x: float, y: float, text: str, *, size: int = 11, anchor: str = "middle", weight: str = "normal",
          rotate: bool = False, fill: str = "#111827") -> str:
    transform = f' transform="rotate(-90 {x:.1f} {y:.1f})"' if rotate else ""
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" font-weight="{weight}" '
            f'fill="{fill}"{transform}>{escape(text)}</text>')


def _frame(title: str, x_label: str, y_label: str, log_note: str) -> list[str]:
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        f'font-family={quoteattr(font_stack())} role="img" aria-label={quoteattr(title)}>',
        _text(LEFT, 18, title, size=13, anchor="start", weight="bold"),
        _text((LEFT + WIDTH - RIGHT) / 2, HEIGHT - 8, x_label),
        _text(14, (TOP + HEIGHT - BOTTOM) / 2, y_label + log_note, rotate=True),
    ]
    return parts


def _legend(names: list[tuple[str, str]], *, dashed: int | None = None) -> list[str]:
    """Legend rows; from index `dashed` on, the rows are bars (dashed) and their label may wrap onto two lines."""
    parts, y = [], TOP + 8
    for index, (label, colour) in enumerate(names):
        x = WIDTH - RIGHT + 14
        dash = ' stroke-dasharray="5 3"' if dashed is not None and index >= dashed else ""
        parts.append(f'<line x1="{x}" y1="{y}" x2="{x + 18}" y2="{y}" stroke="{colour}" stroke-width="2.5"{dash}/>')
        lines = _wrap(label, 18) if dash else [label]
        for number, line in enumerate(lines):
            parts.append(_text(x + 24, y + 4 + number * 12, line, size=10, anchor="start"))
        y += 18 + 12 * (len(lines) - 1)
    return parts


def _wrap(text: str, width: int) -> list[str]:
    words, lines = text.split(" "), [""]
    for word in words:
        if lines[-1] and len(lines[-1]) + 1 + len(word) > width:
            lines.append(word)
        else:
            lines[-1] = f"{lines[-1]} {word}".strip()
    return lines[:3]


def _grid(y_axis: _Axis, x_ticks: list[float], x_pos, *, x_gridlines: bool) -> list[str]:
    """Horizontal gridlines with y labels, x ticks (or vertical gridlines) with labels, and the plot frame."""
    plot_left, plot_right, plot_top, plot_bottom = LEFT, WIDTH - RIGHT, TOP, HEIGHT - BOTTOM
    parts = []
    for tick in y_axis.ticks:
        y = y_axis(tick)
        parts.append(f'<line x1="{plot_left}" y1="{y:.1f}" x2="{plot_right}" y2="{y:.1f}" stroke="#e5e7eb"/>')
        parts.append(_text(plot_left - 6, y + 4, _fmt(tick), size=10, anchor="end"))
    for tick in x_ticks:
        x = x_pos(tick)
        top, colour = (plot_top, "#f3f4f6") if x_gridlines else (plot_bottom + 4, "#6b7280")
        parts.append(f'<line x1="{x:.1f}" y1="{plot_bottom}" x2="{x:.1f}" y2="{top}" stroke="{colour}"/>')
        parts.append(_text(x, plot_bottom + 16, _fmt(tick), size=10))
    parts.append(f'<rect x="{plot_left}" y="{plot_top}" width="{plot_right - plot_left}" '
                 f'height="{plot_bottom - plot_top}" fill="none" stroke="#6b7280"/>')
    return parts


def line_chart(series: dict[str, list[Point]], *, title: str, x_label: str, y_label: str,
               categorical_x: bool = True, colours: dict[str, str] | None = None, log_note: str = " (log)",
               bars: list[tuple[str, list[Point]]] | None = None) -> str:
    """One line per series; x is categorical (concurrency levels evenly spaced) unless told otherwise.

    `bars` are the pass bars of the plan in the chart's units, drawn dashed in red with their label, so the
    margin between a measured line and its bar can be seen.
    """
    colours = colours or {}
    bars = [(label, points) for label, points in (bars or []) if points]
    names = list(series)
    xs = sorted({p.x for points in series.values() for p in points} | {p.x for _, points in bars for p in points})
    ys = [v for points in series.values() for p in points for v in (p.y, p.low, p.high) if v is not None]
    ys += [p.y for _, points in bars for p in points]
    plot_left, plot_right, plot_top, plot_bottom = LEFT, WIDTH - RIGHT, TOP, HEIGHT - BOTTOM
    y_axis = _Axis(ys or [0.0, 1.0], plot_bottom, plot_top, from_zero=True)
    if categorical_x:
        slot = (plot_right - plot_left) / max(len(xs), 1)
        positions = {x: plot_left + slot * (i + 0.5) for i, x in enumerate(xs)}

        def x_pos(value: float) -> float:
            return positions[value]
        x_ticks = xs
    else:
        x_axis = _Axis(xs or [0.0, 1.0], plot_left, plot_right, from_zero=False)
        x_pos, x_ticks = x_axis, x_axis.ticks
    parts = _frame(title, x_label, y_label, log_note if y_axis.log else "")
    parts += _grid(y_axis, x_ticks, x_pos, x_gridlines=False)
    for name in names:
        colour = colours.get(name, arm_colour(name, names))
        points = sorted(series[name], key=lambda p: p.x)
        path = " ".join(f"{x_pos(p.x):.1f},{y_axis(p.y):.1f}" for p in points)
        if len(points) > 1:
            parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for p in points:
            x, y = x_pos(p.x), y_axis(p.y)
            if p.low is not None and p.high is not None:
                parts.append(f'<line x1="{x:.1f}" y1="{y_axis(p.low):.1f}" x2="{x:.1f}" y2="{y_axis(p.high):.1f}" '
                             f'stroke="{colour}" stroke-width="1"/>')
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"/>')
    for _bar_label, points in bars:
        points = sorted(points, key=lambda p: p.x)
        if len(points) == 1:
            x, y = x_pos(points[0].x), y_axis(points[0].y)
            parts.append(f'<line class="bar" x1="{x - 24:.1f}" y1="{y:.1f}" x2="{x + 24:.1f}" y2="{y:.1f}" '
                         f'stroke="{BAR_COLOUR}" stroke-width="2" stroke-dasharray="5 3"/>')
        else:
            path = " ".join(f"{x_pos(p.x):.1f},{y_axis(p.y):.1f}" for p in points)
            parts.append(f'<polyline class="bar" points="{path}" fill="none" stroke="{BAR_COLOUR}" stroke-width="2" '
                         f'stroke-dasharray="5 3"/>')
    parts += _legend([(name, colours.get(name, arm_colour(name, names))) for name in names]
                     + [(label, BAR_COLOUR) for label, _ in bars], dashed=len(names))
    parts.append("</svg>")
    return "\n".join(parts)


def cdf_chart(quantiles: dict[str, list[float]], *, title: str, x_label: str, y_label: str,
              colours: dict[str, str] | None = None, log_note: str = " (log)") -> str:
    """Cumulative distributions from evenly spaced quantiles (q0, q5, …, q100) per series."""
    series = {}
    for name, values in quantiles.items():
        steps = len(values) - 1
        series[name] = [Point(x=v, y=100.0 * i / steps) for i, v in enumerate(values)] if steps > 0 else []
    colours = colours or {}
    names = list(series)
    plot_left, plot_right, plot_top, plot_bottom = LEFT, WIDTH - RIGHT, TOP, HEIGHT - BOTTOM
    xs = [p.x for points in series.values() for p in points]
    x_axis = _Axis(xs or [0.0, 1.0], plot_left, plot_right, from_zero=True)
    y_axis = _Axis([0.0, 100.0], plot_bottom, plot_top, from_zero=True, allow_log=False)
    parts = _frame(title, x_label + (log_note if x_axis.log else ""), y_label, "")
    parts += _grid(y_axis, x_axis.ticks, x_axis, x_gridlines=True)
    for name in names:
        colour = colours.get(name, arm_colour(name, names))
        path = " ".join(f"{x_axis(p.x):.1f},{y_axis(p.y):.1f}" for p in series[name])
        if path:
            parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
    parts += _legend([(name, colours.get(name, arm_colour(name, names))) for name in names])
    parts.append("</svg>")
    return "\n".join(parts)


def by_concurrency(metrics: list[dict[str, Any]], field: str, *, phase: str = "measure") -> dict[str, list[Point]]:
    """Per arm and concurrency: the median over repetitions, with the min–max range as whiskers."""
    cells: dict[tuple[str, int], list[float]] = defaultdict(list)
    for row in metrics:
        value = row.get(field)
        if row.get("phase") != phase or value is None or row.get("concurrency") is None:
            continue
        cells[(str(row.get("arm")), int(row["concurrency"]))].append(float(value))
    series: dict[str, list[Point]] = defaultdict(list)
    for (arm, concurrency), values in sorted(cells.items()):
        low, high = (min(values), max(values)) if len(values) > 1 else (None, None)
        series[arm].append(Point(x=concurrency, y=statistics.median(values), low=low, high=high))
    return dict(series)


def parse_distribution_key(key: str) -> tuple[str, int | None, str]:
    """'fx@8' → ('fx', 8, ''); 'fx@8/replay' (the judge's form for other phases) → ('fx', 8, 'replay')."""
    parts = key.replace("/", "@").split("@")
    arm, concurrency, rest = parts[0], None, []
    for part in parts[1:]:
        if part.isdigit() and concurrency is None:
            concurrency = int(part)
        else:
            rest.append(part)
    return arm, concurrency, "@".join(rest)


def gate_charts(verdict: dict[str, Any]) -> list[Chart]:
    """TTFT p50 and throughput per concurrency per arm, and the TTFT distribution at each concurrency."""
    charts = []
    metrics = verdict.get("metrics") or []
    phases = sorted({row.get("phase") for row in metrics if row.get("phase")}, key=lambda p: (p != "measure", p))
    concurrency_label = _("Concurrency (sessions in flight)")
    for phase in phases:
        suffix = "" if phase == "measure" else f" — {phase}"
        ttft = by_concurrency(metrics, "ttft_p50", phase=phase)
        if len({p.x for points in ttft.values() for p in points}) < 2:
            continue  # one concurrency level: the distribution chart below says more than a single dot
        if ttft:
            charts.append(Chart(f"ttft-p50-{phase}", _("TTFT p50 by concurrency") + suffix, line_chart(
                ttft, title=_("TTFT p50 by concurrency") + suffix, x_label=concurrency_label,
                y_label=_("TTFT p50 (s)"), log_note=_(" (log scale)"),
                bars=comparison_bars(verdict, ttft, "ttft", phase))))
        throughput = by_concurrency(metrics, "throughput", phase=phase)
        if throughput:
            charts.append(Chart(f"throughput-{phase}", _("Throughput by concurrency") + suffix, line_chart(
                throughput, title=_("Throughput by concurrency") + suffix, x_label=concurrency_label,
                y_label=_("Output tokens per second"), log_note=_(" (log scale)"),
                bars=comparison_bars(verdict, throughput, "throughput", phase))))
    charts += soak_charts(verdict)
    charts += cut_charts(verdict)
    groups: dict[tuple[int | None, str], dict[str, list[float]]] = defaultdict(dict)
    for key, values in (verdict.get("distributions") or {}).items():
        arm, concurrency, extra = parse_distribution_key(key)
        if values:
            groups[(concurrency, extra)][arm] = [float(v) for v in values]
    for (concurrency, extra), quantiles in sorted(groups.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1])):
        title = _("TTFT distribution") + (" — " + _("concurrency %(n)s") % {"n": concurrency} if concurrency else "")
        title += f" — {extra}" if extra else ""
        charts.append(Chart(f"ttft-cdf-{concurrency or 0}{'-' + extra if extra else ''}", title, cdf_chart(
            quantiles, title=title, x_label=_("TTFT (s)"), y_label=_("Requests at or below (%)"),
            log_note=_(" (log scale)"))))
    return charts


def comparison_bars(verdict: dict[str, Any], series: dict[str, list[Point]], metric: str,
                    phase: str) -> list[tuple[str, list[Point]]]:
    """Each comparison criterion's bar in the chart's own units: the baseline arm's line scaled by the threshold.

    speed-up ≥ k → candidate ≤ baseline ÷ k; reduction ≥ r → candidate ≤ baseline × (1 − r);
    gain ≥ g → candidate ≥ baseline × (1 + g).
    """
    bars = []
    for criterion in verdict.get("criteria") or []:
        if criterion.get("metric") != metric or criterion.get("phase", "measure") != phase:
            continue
        comparison, threshold, baseline = criterion.get("comparison"), criterion.get("threshold"), criterion.get("baseline")
        if comparison not in ("speedup", "reduction", "gain") or threshold is None or baseline not in series:
            continue
        levels = {int(c["concurrency"]) for c in criterion.get("cells") or [] if c.get("concurrency") is not None}
        scale = {"speedup": 1 / threshold if threshold else None, "reduction": 1 - threshold, "gain": 1 + threshold}[comparison]
        if not scale or scale <= 0:
            continue
        points = [Point(x=p.x, y=p.y * scale) for p in series[baseline] if not levels or int(p.x) in levels]
        label = {"speedup": _("bar: %(arm)s ÷ %(k)s"), "reduction": _("bar: %(arm)s × %(k)s"),
                 "gain": _("bar: %(arm)s × %(k)s")}[comparison] % {"arm": baseline, "k": _fmt(
                     threshold if comparison == "speedup" else scale)}
        bars.append((label, points))
    return bars


def by_window(metrics: list[dict[str, Any]], field: str, phase: str) -> list[Point]:
    """One point per window (repetition) of a phase, in order."""
    rows = sorted((r for r in metrics if r.get("phase") == phase and r.get(field) is not None),
                  key=lambda r: r.get("repetition") or 0)
    return [Point(x=float(r.get("repetition") or i + 1), y=float(r[field])) for i, r in enumerate(rows)]


def soak_series(verdict: dict[str, Any]) -> tuple[dict[str, list[Point]], list[tuple[str, list[Point]]], int]:
    """The soak drawn the way the drift criterion judges it: the criterion's own statistic per steady window
    (warm-up windows left out, as the judge leaves them out) and the bar at the early steady windows' level ×
    (1 + bar) over the late windows; TTFT p50 of every window, warm-up included, for context.
    Returns (series, bars, warm-up windows)."""
    p50 = by_window(verdict.get("metrics") or [], "ttft_p50", "soak")
    criterion = next((c for c in verdict.get("criteria") or [] if c.get("comparison") == "drift"
                      and c.get("phase") == "soak" and c.get("metric") == "ttft"), None)
    cell = next((c for c in (criterion or {}).get("cells") or [] if c.get("per_window")), None)
    if cell is None:
        return ({"p50": p50} if len(p50) >= 2 else {}), [], 0
    steady = list(cell.get("early_windows") or []) + list(cell.get("late_windows") or [])
    judged = [Point(x=float(w), y=float(v)) for w, v in zip(steady, cell["per_window"], strict=False) if v is not None]
    used = str(cell.get("statistic_used") or criterion.get("statistic") or "")
    series = {_("%(statistic)s, judged") % {"statistic": used}: judged, _("p50, every window"): p50}
    bars = []
    if cell.get("first_value") is not None:
        k = 1 + float(criterion.get("threshold") or 0)
        limit = float(cell["first_value"]) * k
        bars.append((_("bar: early steady windows × %(k)s") % {"k": _fmt(k)},
                     [Point(x=float(w), y=limit) for w in cell.get("late_windows") or []]))
    return series, bars, int(cell.get("warmup_windows") or 0)


def soak_charts(verdict: dict[str, Any]) -> list[Chart]:
    series, bars, warmup = soak_series(verdict)
    if not series:
        return []
    title = _("Soak: TTFT per window")
    x_label = _("Window (the first %(n)s: warm-up, not judged)") % {"n": warmup} if warmup else _("Window")
    names = list(series)
    colours = {names[0]: ARM_COLOURS["fx"], **({names[1]: "#94a3b8"} if len(names) > 1 else {})}
    return [Chart("soak-windows", title, line_chart(
        series, title=title, x_label=x_label, y_label=_("TTFT (s)"), colours=colours, log_note=_(" (log scale)"),
        bars=bars))]


def cut_charts(verdict: dict[str, Any]) -> list[Chart]:
    """Across the FX path cut: share of requests answered and cache-hit ratio while the path is cut and after."""
    metrics = verdict.get("metrics") or []
    phases = [phase for phase in ("fault", "recovery") if any(r.get("phase") == phase for r in metrics)]
    if len(phases) < 2:
        return []
    answered, hits = [], []
    for index, phase in enumerate(phases, start=1):
        rows = [r for r in metrics if r.get("phase") == phase]
        n = sum(int(r.get("n") or 0) for r in rows)
        ok = sum(int(r.get("n_ok") or 0) for r in rows)
        answered.append(Point(x=index, y=100.0 * ok / n if n else 0.0))
        ratios = [float(r["hit_ratio"]) for r in rows if r.get("hit_ratio") is not None]
        hits.append(Point(x=index, y=100.0 * statistics.fmean(ratios) if ratios else 0.0))
    bars = []
    for criterion in verdict.get("criteria") or []:
        if criterion.get("phase") == "recovery" and criterion.get("metric") in ("hit_ratio", "external_hit_ratio"):
            bars.append((_("bar: hit ratio after the cut ≥ %(k)s %%") % {"k": _fmt(100 * float(criterion["threshold"]))},
                         [Point(x=len(phases), y=100 * float(criterion["threshold"]))]))
    title = _("FX path cut: requests answered and cache hits")
    svg = line_chart({_("answered (%)"): answered, _("cache hits (%)"): hits}, title=title,
                     x_label=_("1 = during the 60 s cut, 2 = after the path is back"), y_label=_("Percent"),
                     colours={_("answered (%)"): ARM_COLOURS["fx"], _("cache hits (%)"): "#7c3aed"}, bars=bars)
    return [Chart("fx-path-cut", title, svg)]


def reuse_chart(reuse: dict[str, Any] | None) -> str:
    """The customer's trace's hit share against LRU capacity (tokens): the curve the capacity to buy is read
    from (gates.sizing with the trace's reuse, docs/traces.md). Empty without a curve."""
    points = [Point(float(p["capacity_tokens"]), 100 * float(p["hit_fraction"]))
              for p in (reuse or {}).get("curve") or [] if p["capacity_tokens"] > 0]
    if not points:
        return ""
    return line_chart({_("hit share of prompt tokens (%)"): points}, title=_("Reuse captured against cache capacity"),
                      x_label=_("LRU capacity (tokens)"), y_label="%", categorical_x=False)


def _histogram_points(rows: list, scale: float = 1.0) -> list[Point]:
    """[[upper edge or None, value]…] as points at each bin's upper edge (the open last bin at twice the last edge)."""
    edges = [float(edge) for edge, _value in rows if edge is not None]
    beyond = 2 * edges[-1] if edges else 1.0
    return [Point(float(edge) if edge is not None else beyond, scale * float(value)) for edge, value in rows]


def trace_charts(analysis: dict[str, Any]) -> list[Chart]:
    """A trace's analysis (gates.traces.analysis.report) drawn: arrivals over time, context lengths, and, when
    its reuse is known, the reuse-time distribution and hit share against capacity. The portal's trace page."""
    out: list[Chart] = []
    arrivals = analysis.get("arrivals") or {}
    width = float(arrivals.get("bucket_s") or 0)
    if arrivals.get("counts") and width > 0:
        points = [Point(i * width, count / width) for i, count in enumerate(arrivals["counts"])]
        title = _("Arrivals over time")
        out.append(Chart("trace-arrivals", title, line_chart(
            {_("requests per second"): points}, title=title, x_label=_("seconds from the trace's first request"),
            y_label=_("requests per second"), categorical_x=False)))
    lengths = analysis.get("input_length_histogram") or []
    if lengths:
        title = _("Context lengths")
        out.append(Chart("trace-lengths", title, line_chart(
            {_("number of requests"): _histogram_points(lengths)}, title=title,
            x_label=_("prompt tokens, up to (the last bin: longer)"), y_label=_("number of requests"))))
    reuse = analysis.get("reuse") or {}
    if reuse.get("known"):
        times = reuse.get("reuse_time_histogram") or []
        total = sum(float(v) for _edge, v in times)
        if times and total > 0:
            title = _("Reuse-time distribution")
            out.append(Chart("trace-reuse-time", title, line_chart(
                {_("share of hit tokens (%)"): _histogram_points(times, 100.0 / total)}, title=title,
                x_label=_("seconds since the block was last used, up to (the last bin: longer)"),
                y_label="%")))
        curve = reuse_chart(reuse)
        if curve:
            out.append(Chart("trace-hit-share", _("Reuse captured against cache capacity"), curve))
    return out
