"""Minimal SVG line charts (no plotting library needed for a few curves)."""
from __future__ import annotations

from xml.sax.saxutils import escape

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]


def line_chart(path: str, title: str, xlabel: str, ylabel: str, series: list[dict],
               width: int = 900, height: int = 420) -> None:
    """series: [{"label": str, "y": [float], "x": [float] (optional: the
    index), "dash": bool (optional), "points": bool (optional: mark each
    point)}]."""
    ml, mr, mt, mb = 80, 20, 40, 90
    pw, ph = width - ml - mr, height - mt - mb
    xs = [s.get("x") or list(range(len(s["y"]))) for s in series]
    xmin = min((min(x) for x in xs if x), default=0)
    xmax = max((max(x) for x in xs if x), default=1)
    ymax = max((max(s["y"]) for s in series if s["y"]), default=1.0) * 1.08 or 1.0
    sx = lambda i: ml + pw * (i - xmin) / ((xmax - xmin) or 1)
    sy = lambda v: mt + ph * (1 - v / ymax)
    fmt = (lambda v: f"{v:.0f}") if ymax >= 10 else (lambda v: f"{v:.2f}")
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="15">{escape(title)}</text>',
           f'<line x1="{ml}" y1="{mt + ph}" x2="{ml + pw}" y2="{mt + ph}" stroke="black"/>',
           f'<line x1="{ml}" y1="{mt}" x2="{ml}" y2="{mt + ph}" stroke="black"/>']
    for j in range(6):
        v = ymax * j / 5
        out.append(f'<text x="{ml - 6}" y="{sy(v) + 4:.1f}" text-anchor="end">{fmt(v)}</text>')
        out.append(f'<line x1="{ml}" y1="{sy(v):.1f}" x2="{ml + pw}" y2="{sy(v):.1f}" stroke="#ddd"/>')
    for j in range(6):
        i = xmin + (xmax - xmin) * j / 5
        label = f"{i:.0f}" if xmax - xmin >= 10 else f"{i:.2g}"
        out.append(f'<text x="{sx(i):.1f}" y="{mt + ph + 16}" text-anchor="middle">{label}</text>')
    out.append(f'<text x="{ml + pw / 2}" y="{mt + ph + 34}" text-anchor="middle">{escape(xlabel)}</text>')
    out.append(f'<text transform="translate(18,{mt + ph / 2}) rotate(-90)" text-anchor="middle">'
               f'{escape(ylabel)}</text>')
    for idx, s in enumerate(series):
        color = PALETTE[idx % len(PALETTE)]
        ys, x = s["y"], xs[idx]
        if not ys:
            continue
        step = max(1, len(ys) // 2000)  # keep the file small
        pts = " ".join(f"{sx(x[i]):.1f},{sy(ys[i]):.1f}" for i in range(0, len(ys), step))
        dash = ' stroke-dasharray="6,4"' if s.get("dash") else ""
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5"{dash} points="{pts}"/>')
        if s.get("points"):
            out.extend(f'<circle cx="{sx(x[i]):.1f}" cy="{sy(ys[i]):.1f}" r="3" fill="{color}"/>'
                       for i in range(len(ys)))
        lx = ml + 10 + (idx % 3) * 270
        ly = mt + ph + 54 + (idx // 3) * 18
        out.append(f'<line x1="{lx}" y1="{ly - 4}" x2="{lx + 24}" y2="{ly - 4}" stroke="{color}" '
                   f'stroke-width="2"{dash}/>')
        out.append(f'<text x="{lx + 30}" y="{ly}">{escape(s["label"])}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
