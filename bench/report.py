"""Format result rows for the command line.

:func:`format_rows` renders any list of row dicts (from :class:`bench.store.Store`)
as an aligned plain-text table, JSON or CSV. :func:`summarize` turns metric
rows into the short AUC-by-attack report printed at the end of a run.
No dependencies beyond the standard library.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Sequence
from datetime import date, datetime
from typing import Any

from bench.errors import ConfigError

__all__ = ["FORMATS", "AUC_METRICS", "format_rows", "format_value", "split_label", "summarize", "sweep_summary"]

FORMATS = ("table", "json", "csv")
AUC_METRICS = ("auc", "roc_auc", "auroc")
WIDTH = 100  # summarize() fits this many terminal columns
_LABEL_MAX = 40


# ---------------------------------------------------------------- format_rows


def format_value(value: Any) -> str:
    """A cell for the plain-text table: floats with 4 decimals, None as '-'."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if value == 0 or 1e-3 <= abs(value) < 1e6:
            return f"{value:.4f}"
        return f"{value:.4g}"  # keep tiny/huge values (e.g. delta=1e-5) readable
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def _columns(rows: Sequence[dict], columns: Sequence[str] | None) -> list[str]:
    if columns is None:
        seen: dict[str, None] = {}
        for row in rows:
            for key in row:
                seen.setdefault(key, None)
        return list(seen)
    cols = list(columns)
    if rows:
        known: set[str] = set()
        for row in rows:
            known.update(row)
        unknown = [c for c in cols if c not in known]
        if unknown:
            raise ConfigError(
                f"unknown column {unknown[0]!r}: choose from {', '.join(sorted(known))}"
            )
    return cols


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # strict JSON has no NaN/Infinity
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _table(rows: Sequence[dict], cols: list[str]) -> str:
    if not cols:
        return "(no rows)"
    cells = [[format_value(row.get(c)) for c in cols] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(cols)]
    numeric = [
        all(_is_number(row.get(c)) or row.get(c) is None for row in rows) and bool(rows)
        for c in cols
    ]

    def line(values: list[str]) -> str:
        out = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric)
        ]
        return "  ".join(out).rstrip()

    lines = [line(cols), "  ".join("-" * w for w in widths)]
    lines += [line(r) for r in cells]
    if not rows:
        lines.append("(no rows)")
    return "\n".join(lines)


def format_rows(rows: list[dict], fmt: str, columns: list[str] | None = None) -> str:
    """Render rows as ``"table"``, ``"json"`` or ``"csv"``.

    ``columns`` selects and orders the columns (default: every key, in order
    of first appearance). table: aligned plain text, floats with 4 decimals,
    None as ``-``. json: a list of objects (None and NaN as null). csv: a
    header line, then one line per row (None as an empty cell).
    """
    if fmt not in FORMATS:
        raise ConfigError(f"unknown format {fmt!r}: use table, json or csv")
    rows = list(rows)
    cols = _columns(rows, columns)
    if fmt == "table":
        return _table(rows, cols)
    if fmt == "json":
        data = [{c: _json_safe(row.get(c)) for c in cols} for row in rows]
        return json.dumps(data, indent=2, default=str, allow_nan=False)
    buf = io.StringIO()
    if cols:
        writer = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow(
                {
                    c: (
                        json.dumps(row.get(c), sort_keys=True, default=str)
                        if isinstance(row.get(c), (dict, list))
                        else row.get(c)
                    )
                    for c in cols
                }
            )
    return buf.getvalue()


# ---------------------------------------------------------------- summarize


def _fmt_ci(value: float, low: Any, high: Any) -> str:
    if low is None or high is None:
        return f"{value:.3f}"
    return f"{value:.3f} [{low:.2f},{high:.2f}]"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def split_label(label: str) -> tuple[str, dict[str, str]]:
    """``"min_k(k=0.1)"`` -> ``("min_k", {"k": "0.1"})``: a swept suite entry's base name and parameter values
    (see :func:`bench.suite.sweep_suffix`); a plain label has no values."""
    if not label.endswith(")") or "(" not in label:
        return label, {}
    base, _, inner = label[:-1].partition("(")
    values: dict[str, str] = {}
    for part in inner.split(", "):
        k, eq, v = part.partition("=")
        if not eq or not k:
            return label, {}
        values[k] = v
    return base, values


def _attack_order(label: str) -> tuple:
    """Sort key: by base name, then swept values numerically where they are numbers (k=0.05 before k=0.1)."""
    base, values = split_label(label)

    def num(v: str) -> tuple:
        try:
            return (0, float(v), v)
        except ValueError:
            return (1, 0.0, v)
    return (base, tuple((k, num(v)) for k, v in values.items()))


def _clip_attack(label: str, width: int) -> str:
    """Clip a column label, keeping a swept entry's parameter values (the part that tells the columns apart)."""
    if len(label) <= width:
        return label
    base, values = split_label(label)
    if values:
        suffix = label[len(base):]
        room = width - len(suffix)
        if room >= 4:
            return _clip(base, room) + suffix
    return _clip(label, width)


def sweep_summary(rows: list[dict]) -> str:
    """AUC against each swept parameter value: one line per (task/model, defense/game, attack, parameter).

    Swept entries are labelled like ``min_k(k=0.1)`` by the suite; empty when the run swept nothing.
    """
    auc = [r for r in rows if str(r.get("metric", "")).lower() in AUC_METRICS]
    series: dict[tuple, dict[str, list[float]]] = {}
    for r in auc:
        base, values = split_label(str(r.get("attack")))
        if len(values) != 1:
            continue
        (param, value), = values.items()
        key = (str(r.get("task")), str(r.get("model")), str(r.get("defense")), str(r.get("game")), base, param)
        series.setdefault(key, {}).setdefault(value, []).append(float(r["value"]))
    lines = []
    for (task, model, defense, game, base, param), by_value in sorted(series.items()):
        if len(by_value) < 2:
            continue
        order = sorted(by_value, key=lambda v: _attack_order(f"x({param}={v})"))
        cells = "  ".join(f"{param}={v}: {sum(by_value[v]) / len(by_value[v]):.3f}" for v in order)
        lines.append(f"  {task}/{model} {defense} / {game}  {base}  {cells}")
    if not lines:
        return ""
    return "AUC by swept parameter\n" + "\n".join(lines)


def epsilon_summary(rows: list[dict]) -> str:
    """The largest ε lower bound (``eps_lb_*`` rows, bench/audit.py) per task/model, defense and game, with the
    attack that reached it; empty when the run has no such rows. Bounds flagged ``indicative`` come from targets
    scored on one model (not independent trials) and are marked ``~``: evidence of leakage, not a refutation of
    a DP claim."""
    best: dict[tuple, tuple[float, str, str, bool]] = {}
    for r in rows:
        name = str(r.get("metric", ""))
        if not name.startswith("eps_lb_"):
            continue
        key = (str(r.get("task")), str(r.get("model")), str(r.get("defense")), str(r.get("game")), name)
        value = float(r["value"])
        if key not in best or value > best[key][0]:
            best[key] = (value, str(r.get("attack")), name, "indicative" in str(r.get("flag") or ""))
    if not best:
        return ""
    lines = ["Largest ε lower bound per defense and game (~ = indicative: targets share one model)"]
    for (task, model, defense, game, _), (value, attack, name, indicative) in sorted(best.items()):
        lines.append(f"  {task}/{model} {defense} / {game}  {name}  {value:.3f}{'~' if indicative else ' '}  "
                     f"({attack})")
    return "\n".join(lines)


def _chunks(attacks: list[str], widths: dict[str, int], budget: int) -> Iterable[list[str]]:
    """Split attack columns into groups that fit next to the row label."""
    chunk: list[str] = []
    used = 0
    for attack in attacks:
        need = widths[attack] + 1
        if chunk and used + need > budget:
            yield chunk
            chunk, used = [], 0
        chunk.append(attack)
        used += need
    if chunk:
        yield chunk


def summarize(rows: list[dict]) -> str:
    """The AUC of every attack, per task/model, as a defense/game x attack table.

    Cells read ``0.873 [0.84,0.90]`` (AUC and its confidence interval); with
    several seeds a cell is the mean AUC and its spread ``0.873 ±0.012``.
    ``*`` marks the strongest attack (highest AUC) of each row, ``!`` a cell
    whose metric row carries a flag (listed below the table).
    """
    auc_rows = [r for r in rows if str(r.get("metric", "")).lower() in AUC_METRICS]
    if not auc_rows:
        names = sorted({str(r.get("metric")) for r in rows})
        if not names:
            return "no results to summarize"
        return f"no AUC rows to summarize (metrics present: {', '.join(names)})"

    # (task, model) -> (defense, game) -> attack -> [rows over seeds]
    groups: dict[tuple[str, str], dict[tuple[str, str], dict[str, list[dict]]]] = {}
    for r in auc_rows:
        tm = (str(r.get("task")), str(r.get("model")))
        dg = (str(r.get("defense")), str(r.get("game")))
        groups.setdefault(tm, {}).setdefault(dg, {}).setdefault(str(r.get("attack")), []).append(r)

    runs = sorted({(r.get("run"), r.get("suite")) for r in auc_rows}, key=str)
    head = "Attack AUC (higher = more leakage; 0.5 = chance)"
    if len(runs) == 1 and runs[0][0] is not None:
        run, suite = runs[0]
        head += f" - run {run}" + (f", suite {suite}" if suite else "")
    out = [head]
    flags: list[str] = []
    multi_seed = False

    for (task, model), by_row in groups.items():
        attacks = sorted({a for cells in by_row.values() for a in cells}, key=_attack_order)
        table: dict[tuple[str, str], dict[str, str]] = {}
        for dg, cells in by_row.items():
            means = {a: sum(float(x["value"]) for x in xs) / len(xs) for a, xs in cells.items()}
            best = max(means.values())
            row_cells: dict[str, str] = {}
            for attack, xs in cells.items():
                mean = means[attack]
                if len(xs) == 1:
                    text = _fmt_ci(mean, xs[0].get("ci_low"), xs[0].get("ci_high"))
                else:
                    multi_seed = True
                    sd = math.sqrt(sum((float(x["value"]) - mean) ** 2 for x in xs) / (len(xs) - 1))
                    text = f"{mean:.3f} ±{sd:.3f}"
                # two marker characters, always present, so the numbers line up
                marks = "*" if mean == best else " "
                flagged = sorted({str(x["flag"]) for x in xs if x.get("flag")})
                if flagged:
                    marks += "!"
                    flags.append(f"  {task}/{model} {dg[0]}/{dg[1]} {attack}: {', '.join(flagged)}")
                row_cells[attack] = text + marks.ljust(2)
            table[dg] = row_cells

        labels = {dg: _clip(f"{dg[0]} / {dg[1]}", _LABEL_MAX) for dg in table}
        label_w = max([len("defense / game")] + [len(v) for v in labels.values()])
        col_w = {  # cell width including the two marker characters
            a: max([len(_clip_attack(a, 24)) + 2] + [len(table[dg].get(a, "-  ")) for dg in table]) for a in attacks
        }
        out.append("")
        out.append(f"task {task}, model {model}")
        for i, chunk in enumerate(_chunks(attacks, col_w, WIDTH - label_w - 1)):
            if i:
                out.append("")
            header = [_clip_attack(a, 24).rjust(col_w[a] - 2) + "  " for a in chunk]
            rules = ["-" * (col_w[a] - 2) + "  " for a in chunk]
            out.append(("defense / game".ljust(label_w) + "  " + " ".join(header)).rstrip())
            out.append(("-" * label_w + "  " + " ".join(rules)).rstrip())
            for dg in table:  # first-appearance order (the store sorts by defense)
                cells = [table[dg].get(a, "-  ").rjust(col_w[a]) for a in chunk]
                out.append((labels[dg].ljust(label_w) + "  " + " ".join(cells)).rstrip())

    out.append("")
    legend = "* strongest attack in the row"
    if multi_seed:
        legend += "; mean ±sd over seeds where several"
    legend += "; [low,high] confidence interval"
    out.append(legend)
    if flags:
        out.append("! flagged:")
        out.extend(flags)
    sweeps = sweep_summary(rows)
    if sweeps:
        out += ["", sweeps]
    eps = epsilon_summary(rows)
    if eps:
        out += ["", eps]
    return "\n".join(out)
