"""A figure in its unit, as a person reads it: the one formatter of the portal's pages and the signed reports.

A fraction reads as a percentage, a ratio with ×, a count grouped by thousands; three significant places below
100, none above; the number format is the reader's (the active language), yes and no are words in it.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django.utils import formats
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

UNIT_WORDS = {"requests": gettext_lazy("requests"), "GPUs": gettext_lazy("GPUs")}
NOTHING = "—"


def rounded(value: float, places: int) -> Decimal:
    """`value` rounded half away from zero to `places` decimals, from its shortest decimal form (0.3735 → 0.374,
    never 0.373 from its binary form or a cut): the one rounding rule of every figure a person reads."""
    return Decimal(repr(float(value))).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)


def fixed(value: Any, places: int, grouping: bool = True) -> str:
    """A figure at exactly `places` decimals, rounded by `rounded`, in the reader's number format."""
    if value is None or value == "" or isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return NOTHING if not isinstance(value, str) or not value else value
    return formats.number_format(rounded(value, max(0, int(places))), decimal_pos=max(0, int(places)), use_l10n=True,
                                 force_grouping=grouping)


def percent(fraction: Any, places: int = 1) -> str:
    """A fraction as a percentage at `places` decimals ("37.4 %"), rounded by `rounded`."""
    if fraction is None or fraction == "" or isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        return NOTHING
    return fixed(float(fraction) * 100, places) + " %"


def number(value: Any, digits: int = 3) -> str:
    """A figure to `digits` significant places below 1, fewer decimals as it grows, in the reader's number format."""
    if value is None or value == "":
        return NOTHING
    if isinstance(value, bool):
        return _("yes") if value else _("no")
    if not isinstance(value, (int, float)):
        return str(value)
    if value != value:  # NaN
        return NOTHING
    if isinstance(value, int) or float(value).is_integer():
        return formats.number_format(int(value), use_l10n=True, force_grouping=True)
    magnitude = abs(value)
    places = 0 if magnitude >= 100 else 1 if magnitude >= 10 else 2 if magnitude >= 1 else int(digits)
    return formats.number_format(rounded(value, places), decimal_pos=places, use_l10n=True, force_grouping=True)


def figure(value: Any, unit: str = "") -> str:
    """A criterion's figure in its unit: a fraction as a percentage, a ratio with ×, else the number and its unit."""
    if value is None or value == "" or isinstance(value, bool) or not isinstance(value, (int, float)):
        return number(value)
    if unit == "fraction":
        return number(value * 100) + " %"
    if unit == "×":
        return number(value) + "×"
    if unit in ("", "version"):
        return number(value)
    return f"{number(value)} {UNIT_WORDS.get(unit, unit)}"


def interval(ci: Any, unit: str = "") -> str:
    """[low, high] in the figure's unit, or — when there is none."""
    if not ci or len(ci) != 2 or ci[0] is None or ci[1] is None:
        return NOTHING
    return f"[{figure(ci[0], unit)}, {figure(ci[1], unit)}]"
