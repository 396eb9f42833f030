"""Small charts the pages draw as inline SVG: the geometry here, the markup in templates (no JavaScript, no styles
the Content Security Policy would block)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.utils import timezone


def svg_chart(times: list[datetime], lines: list[tuple[str, str, list, float]], end_label: str = "now") -> dict:
    """Polyline points of a small line chart (600 x 160 view box) for templates/portal/_chart.html.

    Each line is (label, css class, values, current value); a value None is a gap (no point drawn).
    """
    width, height, left, bottom, top = 600, 160, 36, 22, 8
    peak = max((max((v for v in values if v is not None), default=0) for _, _, values, _ in lines), default=0)
    ymax = max(1, peak)
    ymax = int(ymax) + (1 if ymax != int(ymax) else 0)
    n = max(len(times) - 1, 1)

    def x(i: int) -> float:
        return round(left + (width - left - 4) * i / n, 1)

    def y(v: float) -> float:
        return round(top + (height - top - bottom) * (1 - v / ymax), 1)

    return {
        "width": width,
        "height": height,
        "lines": [
            {
                "label": label,
                "css": css,
                "points": " ".join(f"{x(i)},{y(v)}" for i, v in enumerate(values) if v is not None),
                "now": now,
            }
            for label, css, values, now in lines
        ],
        "ymax": ymax,
        "y_top": y(ymax),
        "y_mid": y(ymax / 2),
        "y_zero": y(0),
        "mid_label": f"{ymax / 2:g}",
        "x_left": left,
        "x_right": width - 4,
        "x_mid": x(n // 2),
        "start_label": timezone.localtime(times[0] - (times[1] - times[0])).strftime("%H:%M") if len(times) > 1 else "",
        "mid_label_x": timezone.localtime(times[n // 2]).strftime("%H:%M") if times else "",
        "end_label": end_label,
    }


def bar_chart(points: list[tuple[object, Decimal]], width: int = 600, height: int = 170) -> dict:
    """Geometry of a small bar chart (one bar per point) for templates/billing/_bar_chart.html."""
    left, right, top, bottom = 44, 6, 8, 20
    top_value = max((value for _, value in points), default=Decimal(0)) or Decimal(1)
    plot_h, slot = height - top - bottom, (width - left - right) / max(len(points), 1)
    bars = []
    for i, (label, value) in enumerate(points):
        h = float(value / top_value) * plot_h
        bars.append(
            {
                "x": round(left + i * slot + slot * 0.1, 1),
                "w": round(slot * 0.8, 1),
                "y": round(top + plot_h - h, 1),
                "h": round(h, 1),
                "label": label,
                "value": value,
            }
        )
    return {
        "width": width,
        "height": height,
        "x_left": left,
        "x_right": width - right,
        "y_top": top,
        "y_zero": top + plot_h,
        "ymax": top_value.normalize() if top_value else 0,
        "bars": bars,
        "start_label": points[0][0] if points else "",
        "end_label": points[-1][0] if points else "",
    }
