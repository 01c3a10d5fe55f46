"""The headline plot of a track, privacy against utility retained, as an Altair chart (the app, and the Vega-Lite
spec the export writes) and as inline SVG (the export's index.html, viewable offline without any script).

Both are drawn from the same points (:func:`headline_points`): per configuration the worst-case TPR at 1% FPR
(log scale; values below :data:`TPR_FLOOR` drawn at the floor) and the worst-case AUC on the track's headline
game, against utility retained, with 95% CI bars, anchors as squares and the Pareto front of the ranking
(layer 1, see aggregate.RANKING_RULE) in red.
"""

from __future__ import annotations

import html
import math

import altair as alt
import numpy as np
import pandas as pd

__all__ = ["TPR_FLOOR", "headline_points", "headline_chart", "headline_svg", "heatmap_chart", "roc_chart",
           "roc_svg"]

TPR_FLOOR = 1e-3
FRONT_COLOR = "#d62728"
OTHER_COLOR = "#555555"
PANELS = (("tpr", "worst-case TPR at 1% FPR (log)", True, 0.01),
          ("auc", "worst-case AUC", False, 0.5))


def headline_points(ranking: pd.DataFrame) -> pd.DataFrame:
    """One point per ranked configuration with both a privacy value and utility retained: the data of the plot."""
    cols = ["rank", "defense", "params_summary", "kind", "front", "retained", "retained_low", "retained_high",
            "tpr", "tpr_low", "tpr_high", "tpr_plot", "tpr_low_plot", "tpr_high_plot", "auc", "auc_low", "auc_high"]
    if ranking.empty:
        return pd.DataFrame(columns=cols)
    r = ranking[np.isfinite(ranking["retained"].astype(float)) & np.isfinite(ranking["tpr"].astype(float))].copy()
    r["kind"] = np.where(r["anchor"].astype(bool), "anchor", "defense")
    r["front"] = r["pareto_layer"] == 1
    for c in ("retained_low", "retained_high", "auc_low", "auc_high", "tpr_low", "tpr_high"):
        r[c] = r[c].astype(float).where(np.isfinite(r[c].astype(float)), r[c.rsplit("_", 1)[0]].astype(float))
    clip = lambda s: s.astype(float).clip(lower=TPR_FLOOR, upper=1.0)  # noqa: E731
    r["tpr_plot"], r["tpr_low_plot"], r["tpr_high_plot"] = clip(r["tpr"]), clip(r["tpr_low"]), clip(r["tpr_high"])
    r["rank"] = [("anchor" if k == "anchor" else (str(int(x)) if x == x else "—"))
                 for k, x in zip(r["kind"], r["rank"])]
    return r[cols].reset_index(drop=True)


def _x_domain(points: pd.DataFrame) -> list[float]:
    lo = min(0.0, float(points["retained_low"].min())) if not points.empty else 0.0
    hi = max(1.0, float(points["retained_high"].max())) if not points.empty else 1.0
    pad = 0.05 * (hi - lo)
    return [lo - pad, hi + pad]


def headline_chart(points: pd.DataFrame, title: str = "") -> alt.HConcatChart:
    """Two panels side by side: TPR at 1% FPR (log) and AUC against utility retained."""
    xdom = _x_domain(points)
    x = alt.X("retained:Q", title="utility retained (none = 0, finetune = 1)", scale=alt.Scale(domain=xdom))
    color = alt.Color("front:N", title="Pareto front", scale=alt.Scale(domain=[True, False],
                                                                     range=[FRONT_COLOR, OTHER_COLOR]))
    shape = alt.Shape("kind:N", title="", scale=alt.Scale(domain=["anchor", "defense"], range=["square", "circle"]))
    panels = []
    for key, ytitle, log, chance in PANELS:
        ycol = f"{key}_plot" if key == "tpr" else key
        lo, hi = (f"{key}_low_plot", f"{key}_high_plot") if key == "tpr" else (f"{key}_low", f"{key}_high")
        scale = alt.Scale(type="log", domain=[TPR_FLOOR, 1.0]) if log else alt.Scale(domain=[0.4, 1.0], clamp=True)
        base = alt.Chart(points)
        tooltip = ["rank", "defense", "params_summary", alt.Tooltip("retained:Q", format=".3f"),
                   alt.Tooltip(f"{key}:Q", format=".3f")]
        y = alt.Y(f"{ycol}:Q", title=ytitle, scale=scale)
        xbar = base.mark_rule(opacity=0.6).encode(x=alt.X("retained_low:Q", scale=alt.Scale(domain=xdom)),
                                                  x2="retained_high:Q", y=y, color=color)
        ybar = base.mark_rule(opacity=0.6).encode(x=x, y=alt.Y(f"{lo}:Q", scale=scale), y2=f"{hi}:Q", color=color)
        pts = base.mark_point(size=110, filled=True).encode(x=x, y=y, color=color, shape=shape, tooltip=tooltip)
        labels = base.mark_text(align="left", dx=8, dy=-8, fontSize=11).encode(x=x, y=y, text="defense:N")
        rule = alt.Chart(pd.DataFrame({"chance": [chance]})).mark_rule(strokeDash=[4, 4], color="gray").encode(
            y=alt.Y("chance:Q", scale=scale))
        layers = [rule, xbar, ybar, pts, labels]
        if key == "tpr":
            front = base.transform_filter(alt.datum.front).mark_line(color=FRONT_COLOR).encode(
                x=x, y=y, order="retained:Q")
            layers.insert(1, front)
        panels.append(alt.layer(*layers).properties(width=380, height=300))
    chart = alt.hconcat(*panels).resolve_scale(color="shared", shape="shared")
    return chart.properties(title=title) if title else chart


# ---------------------------------------------------------------- inline SVG (export)

_W, _H = 440, 340
_M = {"l": 58, "r": 64, "t": 16, "b": 46}


def _fmt_tick(v: float) -> str:
    return f"{v:g}"


def _panel_svg(points: pd.DataFrame, key: str, ytitle: str, log: bool, chance: float, x0: float) -> list[str]:
    xdom = _x_domain(points)
    pw, ph = _W - _M["l"] - _M["r"], _H - _M["t"] - _M["b"]
    ylo, yhi = (TPR_FLOOR, 1.0) if log else (0.4, 1.0)

    def sx(v: float) -> float:
        return x0 + _M["l"] + (v - xdom[0]) / (xdom[1] - xdom[0]) * pw

    def sy(v: float) -> float:
        v = min(max(v, ylo), yhi)
        t = (math.log10(v) - math.log10(ylo)) / (math.log10(yhi) - math.log10(ylo)) if log else (v - ylo) / (yhi - ylo)
        return _M["t"] + (1 - t) * ph

    out = [f'<g class="panel" data-metric="{key}">',
           f'<rect x="{x0 + _M["l"]:.1f}" y="{_M["t"]}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>']
    yticks = [1e-3, 1e-2, 1e-1, 1.0] if log else [0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    for t in yticks:
        out.append(f'<line x1="{x0 + _M["l"] - 4:.1f}" x2="{x0 + _M["l"] + pw:.1f}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" '
                   f'stroke="#eee"/><text x="{x0 + _M["l"] - 6:.1f}" y="{sy(t) + 4:.1f}" text-anchor="end" '
                   f'font-size="11">{_fmt_tick(t)}</text>')
    step = 0.25 if xdom[1] - xdom[0] <= 1.6 else 0.5
    t = math.ceil(xdom[0] / step) * step
    while t <= xdom[1] + 1e-9:
        out.append(f'<line x1="{sx(t):.1f}" x2="{sx(t):.1f}" y1="{_M["t"]}" y2="{_M["t"] + ph + 4}" stroke="#eee"/>'
                   f'<text x="{sx(t):.1f}" y="{_M["t"] + ph + 16}" text-anchor="middle" font-size="11">'
                   f'{_fmt_tick(round(t, 6))}</text>')
        t += step
    out.append(f'<line x1="{x0 + _M["l"]:.1f}" x2="{x0 + _M["l"] + pw:.1f}" y1="{sy(chance):.1f}" '
               f'y2="{sy(chance):.1f}" stroke="gray" stroke-dasharray="4 4"/>')
    out.append(f'<text x="{x0 + _M["l"] + pw / 2:.1f}" y="{_H - 8}" text-anchor="middle" font-size="12">'
               f'utility retained (none = 0, finetune = 1)</text>')
    out.append(f'<text transform="translate({x0 + 14:.1f},{_M["t"] + ph / 2:.1f}) rotate(-90)" text-anchor="middle" '
               f'font-size="12">{html.escape(ytitle)}</text>')
    ycol = f"{key}_plot" if key == "tpr" else key
    lo, hi = (f"{key}_low_plot", f"{key}_high_plot") if key == "tpr" else (f"{key}_low", f"{key}_high")
    if key == "tpr":
        front = points[points["front"]].sort_values("retained")
        if len(front) > 1:
            path = " ".join(f"{sx(a):.1f},{sy(b):.1f}" for a, b in zip(front["retained"], front[ycol]))
            out.append(f'<polyline points="{path}" fill="none" stroke="{FRONT_COLOR}" stroke-width="1.5"/>')
    for p in points.to_dict("records"):
        c = FRONT_COLOR if p["front"] else OTHER_COLOR
        x, y = sx(p["retained"]), sy(p[ycol])
        out.append(f'<line x1="{sx(p["retained_low"]):.1f}" x2="{sx(p["retained_high"]):.1f}" y1="{y:.1f}" '
                   f'y2="{y:.1f}" stroke="{c}" opacity="0.6"/>')
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{sy(p[lo]):.1f}" y2="{sy(p[hi]):.1f}" stroke="{c}" '
                   f'opacity="0.6"/>')
        name = html.escape(str(p["defense"]))
        tip = html.escape(f"{p['defense']} (rank {p['rank']}): utility retained {p['retained']:.3f}, "
                          f"{key.upper()} {p[key]:.3f}")
        if p["kind"] == "anchor":
            out.append(f'<rect class="point" x="{x - 5:.1f}" y="{y - 5:.1f}" width="10" height="10" fill="{c}">'
                       f'<title>{tip}</title></rect>')
        else:
            out.append(f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="5.5" fill="{c}"><title>{tip}</title>'
                       f'</circle>')
        out.append(f'<text x="{x + 8:.1f}" y="{y - 8:.1f}" font-size="11">{name}</text>')
    out.append("</g>")
    return out


def headline_svg(points: pd.DataFrame, title: str = "") -> str:
    """The headline plot as a standalone inline SVG element (no script, no external resource)."""
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * _W}" height="{_H}" viewBox="0 0 {2 * _W} {_H}" '
             f'role="img" font-family="sans-serif">'
             f'<title>{html.escape(title or "privacy vs utility retained")}</title>']
    for i, (key, ytitle, log, chance) in enumerate(PANELS):
        parts += _panel_svg(points, key, ytitle, log, chance, i * _W)
    parts.append("</svg>")
    return "\n".join(parts)


# ---------------------------------------------------------------- defense page

def heatmap_chart(grid: pd.DataFrame) -> alt.VConcatChart:
    """Games × attacks heatmaps of one configuration: AUC and TPR at 1% FPR (mean over seeds)."""
    charts = []
    for metric, domain in (("AUC", [0.4, 1.0]), ("TPR@1%FPR", [0.0, 1.0])):
        g = grid[grid["metric"] == metric]
        games = list(dict.fromkeys(g["game"]))
        base = alt.Chart(g).encode(x=alt.X("attack:N", title="attack"), y=alt.Y("game:N", sort=games, title="game"))
        rect = base.mark_rect().encode(color=alt.Color("mean:Q", title=metric, scale=alt.Scale(
            domain=domain, scheme="reds", clamp=True)), tooltip=["game", "attack", alt.Tooltip("mean:Q", format=".3f"),
                                                                 "n"])
        text = base.mark_text(fontSize=11).encode(text=alt.Text("mean:Q", format=".2f"))
        charts.append((rect + text).properties(title=metric, width=360, height=28 * max(len(games), 1)))
    return alt.hconcat(*charts).resolve_scale(color="independent")


def roc_chart(roc: pd.DataFrame) -> alt.LayerChart:
    """Log–log ROC curves (one per attack and seed) with the chance diagonal."""
    pos = roc[(roc["fpr"] > 0) & (roc["tpr"] > 0)]
    lo = float(pos["fpr"].min()) if not pos.empty else 1e-3
    chance = pd.DataFrame({"fpr": [lo, 1.0], "tpr": [lo, 1.0]})
    curves = alt.Chart(pos).mark_line(interpolate="step-after").encode(
        x=alt.X("fpr:Q", scale=alt.Scale(type="log"), title="false positive rate"),
        y=alt.Y("tpr:Q", scale=alt.Scale(type="log"), title="true positive rate"),
        color=alt.Color("curve:N", title="attack (seed)"), tooltip=["curve", "fpr", "tpr"])
    diag = alt.Chart(chance).mark_line(strokeDash=[4, 4], color="gray").encode(x="fpr:Q", y="tpr:Q")
    return curves + diag


PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf"]


def roc_svg(roc: pd.DataFrame, title: str = "ROC curves") -> str:
    """Log–log ROC curves as inline SVG (the export's defense pages): one step curve per ``curve`` label (attack and
    seed), the chance diagonal dashed; points with FPR or TPR = 0 cannot be drawn on log axes and are left out."""
    w, h, m = 560, 380, {"l": 58, "r": 190, "t": 14, "b": 44}
    pw, ph = w - m["l"] - m["r"], h - m["t"] - m["b"]
    pos = roc[(roc["fpr"] > 0) & (roc["tpr"] > 0)]
    lo = 10 ** math.floor(math.log10(max(float(pos["fpr"].min()), 1e-6))) if not pos.empty else 1e-3
    lo = min(lo, 10 ** math.floor(math.log10(max(float(pos["tpr"].min()), 1e-6)))) if not pos.empty else lo
    span = -math.log10(lo)

    def s(v: float, horizontal: bool) -> float:
        t = (math.log10(max(v, lo)) - math.log10(lo)) / span
        return m["l"] + t * pw if horizontal else m["t"] + (1 - t) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" '
           f'font-family="sans-serif"><title>{html.escape(title)}</title>',
           f'<rect x="{m["l"]}" y="{m["t"]}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>']
    k = 0
    while 10 ** -k >= lo * 0.999:
        v = 10 ** -k
        out.append(f'<line x1="{s(v, True):.1f}" x2="{s(v, True):.1f}" y1="{m["t"]}" y2="{m["t"] + ph}" stroke="#eee"/>'
                   f'<text x="{s(v, True):.1f}" y="{m["t"] + ph + 15}" text-anchor="middle" font-size="11">{v:g}</text>'
                   f'<line x1="{m["l"]}" x2="{m["l"] + pw}" y1="{s(v, False):.1f}" y2="{s(v, False):.1f}" '
                   f'stroke="#eee"/><text x="{m["l"] - 6}" y="{s(v, False) + 4:.1f}" text-anchor="end" '
                   f'font-size="11">{v:g}</text>')
        k += 1
    out.append(f'<line x1="{s(lo, True):.1f}" y1="{s(lo, False):.1f}" x2="{s(1, True):.1f}" y2="{s(1, False):.1f}" '
               f'stroke="gray" stroke-dasharray="4 4"/>')
    out.append(f'<text x="{m["l"] + pw / 2:.1f}" y="{h - 8}" text-anchor="middle" font-size="12">false positive rate'
               f'</text><text transform="translate(14,{m["t"] + ph / 2:.1f}) rotate(-90)" text-anchor="middle" '
               f'font-size="12">true positive rate</text>')
    for i, (curve, g) in enumerate(pos.groupby("curve", sort=True)):
        color = PALETTE[i % len(PALETTE)]
        pts, prev = [], None
        for f, t in zip(g["fpr"], g["tpr"]):  # step-after, as in the app
            x, y = s(f, True), s(t, False)
            if prev is not None:
                pts.append(f"{x:.1f},{prev:.1f}")
            pts.append(f"{x:.1f},{y:.1f}")
            prev = y
        out.append(f'<polyline class="roc" points="{" ".join(pts)}" fill="none" stroke="{color}" stroke-width="1.5">'
                   f'<title>{html.escape(str(curve))}</title></polyline>')
        ly = m["t"] + 12 + 16 * i
        out.append(f'<line x1="{m["l"] + pw + 12}" x2="{m["l"] + pw + 30}" y1="{ly - 4}" y2="{ly - 4}" '
                   f'stroke="{color}" stroke-width="2"/><text x="{m["l"] + pw + 36}" y="{ly}" font-size="11">'
                   f'{html.escape(str(curve))}</text>')
    out.append("</svg>")
    return "\n".join(out)
