"""Charts drawn on the server as SVG text: no script, every label escaped, colours as attributes.

The console's content security policy forbids inline script and inline styles, so a chart is plain SVG
markup whose colours are presentation attributes (``fill="..."``), which the policy allows, and whose
words are escaped here, once, before they reach the page.

>>> svg = bar_chart([(0.0, {"delivered": 3}), (60.0, {"delivered": 1, "retried": 2})], title="deliveries")
>>> svg.startswith("<svg") and "<script" not in svg
True
"""

from __future__ import annotations

import html
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["PALETTE", "Bar", "bar_chart", "escape", "minute_label", "stack"]

PALETTE: dict[str, str] = {
    "delivered": "#2e7d32",
    "acked": "#1b5e20",
    "awaiting_ack": "#0277bd",
    "retried": "#f9a825",
    "released": "#8d6e63",
    "rate_limited": "#6a1b9a",
    "deduplicated": "#78909c",
    "failed": "#e64a19",
    "expired": "#5d4037",
    "dead_letter": "#c62828",
}
"""A colour per delivery outcome; an outcome not named here takes one of :data:`SPARE` by its position."""

SPARE = ("#455a64", "#00838f", "#ad1457", "#9e9d24", "#4527a0")


def escape(text: object) -> str:
    """Text safe inside an SVG element or a double-quoted attribute."""
    return html.escape(str(text), quote=True)


def minute_label(at: float) -> str:
    """``HH:MM`` in UTC for a POSIX time (the console shows every time in UTC)."""
    return time.strftime("%H:%M", time.gmtime(at))


@dataclass(frozen=True)
class Bar:
    """One segment of a stacked bar: its series, value and the rectangle it fills."""

    series: str
    value: int
    x: float
    y: float
    width: float
    height: float


def stack(points: Sequence[tuple[float, Mapping[str, int]]], series: Sequence[str], *, left: float, top: float,
          width: float, height: float) -> tuple[list[list[Bar]], int]:
    """The stacked segments of each point (bottom first, in ``series`` order) and the scale's maximum."""
    peak = max((sum(counts.get(s, 0) for s in series) for _, counts in points), default=0)
    scale = max(peak, 1)
    slot = width / max(len(points), 1)
    bar_width = max(slot * 0.8, 1.0)
    out: list[list[Bar]] = []
    for i, (_, counts) in enumerate(points):
        x = left + i * slot + (slot - bar_width) / 2
        base = top + height
        column = []
        for s in series:
            value = counts.get(s, 0)
            if value <= 0:
                continue
            h = height * value / scale
            base -= h
            column.append(Bar(s, value, x, base, bar_width, h))
        out.append(column)
    return out, peak


def _colour(series: str, position: int) -> str:
    return PALETTE.get(series, SPARE[position % len(SPARE)])


def bar_chart(points: Sequence[tuple[float, Mapping[str, int]]], *, title: str, series: Sequence[str] | None = None,
              width: int = 720, height: int = 240, label_every: int = 10) -> str:
    """A stacked bar chart of ``points`` — (minute as POSIX time, series -> count) — as an SVG string.

    ``series`` orders the stack (default: every series found, in the order of :data:`PALETTE`, then by
    name). Each bar carries a ``<title>`` naming its minute and counts, so a pointer or a screen reader
    gets the figures; the caller shows the same figures in a table for readers without the picture.
    """
    found = {s for _, counts in points for s in counts}
    if series is None:
        series = [s for s in PALETTE if s in found] + sorted(found - PALETTE.keys())
    left, right, top, bottom = 40.0, 8.0, 24.0, 48.0
    plot_w, plot_h = width - left - right, height - top - bottom
    columns, peak = stack(points, series, left=left, top=top, width=plot_w, height=plot_h)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        f'<text x="{left:g}" y="14" font-size="12" fill="#333">{escape(title)}</text>',
        f'<line x1="{left:g}" y1="{top + plot_h:g}" x2="{left + plot_w:g}" y2="{top + plot_h:g}" stroke="#999"/>',
        f'<text x="{left - 4:g}" y="{top + plot_h:g}" font-size="10" text-anchor="end" fill="#555">0</text>',
    ]
    if peak:
        out.append(f'<text x="{left - 4:g}" y="{top + 4:g}" font-size="10" text-anchor="end" fill="#555">{peak}</text>')
    order = {s: i for i, s in enumerate(series)}
    for i, ((at, counts), column) in enumerate(zip(points, columns)):
        figures = ", ".join(f"{s} {counts[s]}" for s in series if counts.get(s, 0) > 0) or "none"
        out.append(f"<g><title>{escape(minute_label(at))} UTC: {escape(figures)}</title>")
        for bar in column:
            out.append(f'<rect x="{bar.x:.1f}" y="{bar.y:.1f}" width="{bar.width:.1f}" height="{bar.height:.1f}" '
                       f'fill="{_colour(bar.series, order[bar.series])}" data-series="{escape(bar.series)}"/>')
        out.append("</g>")
        if label_every and i % label_every == 0:
            x = left + (i + 0.5) * plot_w / max(len(points), 1)
            out.append(f'<text x="{x:.1f}" y="{top + plot_h + 14:g}" font-size="10" text-anchor="middle" '
                       f'fill="#555">{escape(minute_label(at))}</text>')
    x = left
    for s in series:
        out.append(f'<rect x="{x:g}" y="{height - 16:g}" width="10" height="10" fill="{_colour(s, order[s])}"/>')
        out.append(f'<text x="{x + 14:g}" y="{height - 7:g}" font-size="11" fill="#333">{escape(s)}</text>')
        x += 14 + 7 * len(s) + 16
    if not series:
        out.append(f'<text x="{left + plot_w / 2:g}" y="{top + plot_h / 2:g}" font-size="12" text-anchor="middle" '
                   'fill="#777">nothing delivered in this window</text>')
    out.append("</svg>")
    return "".join(out)
