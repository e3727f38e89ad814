"""The report writer every measurement shares: markdown tables, strict JSON, PNG charts.

A result folder holds a JSON document (everything, machine and command
included), a markdown page that starts with the run's record
(:meth:`bundle.records.RunRecord.lines`) and shows its tables, and PNG
charts beside it. The load-test reports (:mod:`loadtest.sweeps.report`), the soak,
the CPU benchmarks and the client-cost bench all write through these
functions, so a number is formatted, and a NaN turned into ``null`` or ``-``,
in one way.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bundle.errors import ConfigError
from bundle.plots import PANEL_SIZE, figure, legends


# ------------------------------------------------------------------ JSON
def json_safe(value: Any) -> Any:
    """NaN and infinity as null (strict JSON), dict keys as strings, tuples as lists."""
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def write_json(path: Path, document: Any) -> Path:
    """``document`` as indented strict JSON at ``path`` (its folder created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(json_safe(document), indent=2) + "\n")
    return path


# ------------------------------------------------------------------ markdown
def fmt(value: Any, digits: int = 3) -> str:
    """One table cell: ``-`` for missing or NaN, thousands separators from 100 up, else ``digits``."""
    if value is None or value == "" or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.{digits}g}" if abs(value) < 1 else f"{value:.{digits}f}".rstrip("0").rstrip(".")
    return str(value)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], align: str = "") -> list[str]:
    """A GitHub markdown table; strings are kept as they are, other cells go through :func:`fmt`.

    Args:
        header: column titles.
        rows: the cells, one sequence per row.
        align: one letter per column, ``l`` or ``r`` (empty: the first column left, the others right).
    """
    align = align or "l" + "r" * (len(header) - 1)
    if len(align) != len(header) or set(align) - {"l", "r"}:
        raise ConfigError(f"align needs one of l/r per column ({len(header)}), got {align!r}")
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "".join("---|" if a == "l" else "---:|" for a in align),
    ]
    for row in rows:
        if len(row) != len(header):
            raise ConfigError(f"a row has {len(row)} cells for {len(header)} columns: {row}")
        lines.append("| " + " | ".join(c if isinstance(c, str) else fmt(c) for c in row) + " |")
    return lines


def write_markdown(path: Path, lines: Sequence[str]) -> Path:
    """The lines as one markdown file (its folder created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


# ------------------------------------------------------------------ charts
@dataclass(frozen=True)
class Series:
    """One curve: ``y`` against ``x``, drawn as ``style`` (matplotlib format), in its key's color.

    ``notes`` label single points (text, x, y).
    """

    label: str
    x: Sequence[float]
    y: Sequence[float]
    style: str = "o-"
    color_key: str = ""
    notes: Sequence[tuple[str, float, float]] = ()


@dataclass(frozen=True)
class Panel:
    """One chart of a figure.

    Args:
        title: its title.
        xlabel: its x axis label.
        ylabel: its y axis label.
        series: its curves.
        xlog2: a base-2 log x axis with a tick at each ``xticks``.
        ylog: a log y axis with plain-number ticks.
        xticks: x ticks (with ``xlog2``).
        vlines: vertical marker lines (x, label).
    """

    title: str
    xlabel: str
    ylabel: str
    series: Sequence[Series]
    xlog2: bool = False
    ylog: bool = False
    xticks: Sequence[float] = ()
    vlines: Sequence[tuple[float, str]] = field(default_factory=tuple)


#: Series a panel's own legend holds at most; more, and one legend for all panels goes below them.
LEGEND_IN_PANEL = 6


def _leading_digit(value: float) -> int:
    """The leading digit of a tick at a whole multiple of a power of ten (0 for any other)."""
    if value <= 0:
        return 0
    mantissa = value / 10 ** math.floor(math.log10(value))
    return round(mantissa) if abs(mantissa - round(mantissa)) < 1e-6 else 0


def plot(path: Path, title: str, panels: Sequence[Panel], columns: int | None = None) -> Path:
    """Panels side by side in one PNG; a series keeps its color across panels (by ``color_key``).

    With more than :data:`LEGEND_IN_PANEL` series, or names too long for a panel's own legend,
    one legend below the panels names them all (:func:`bundle.plots.legends`: in as many columns
    as the figure's width holds, the figure grown to hold it), so no legend covers a curve.
    ``columns``: panels per row (None: all in one row).
    """
    import matplotlib
    from matplotlib.ticker import FuncFormatter

    if not panels:
        raise ConfigError("a chart needs at least one panel")
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    # Minor ticks of a log axis labelled at 2x and 5x a power of ten only: all eight crowd
    # into each other and into the decade's label.
    sparse = FuncFormatter(lambda value, _: f"{value:g}" if _leading_digit(value) in (2, 5) else "")
    colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    keys = sorted({s.color_key or s.label for panel in panels for s in panel.series})
    color_of = {key: colors[i % len(colors)] for i, key in enumerate(keys)}
    with figure(path, len(panels), PANEL_SIZE, title, columns) as axes:
        for ax, panel in zip(axes, panels, strict=True):
            for series in panel.series:
                color = color_of[series.color_key or series.label]
                ax.plot(list(series.x), list(series.y), series.style, color=color, label=series.label)
                for text, x, y in series.notes:
                    ax.annotate(
                        text, (x, y), fontsize=7, alpha=0.7, textcoords="offset points", xytext=(3, 3)
                    )
            for x, label in panel.vlines:
                ax.axvline(x, color="gray", linestyle=":", linewidth=1)
                ax.annotate(label, (x, 0.02), xycoords=("data", "axes fraction"), fontsize=7, color="gray")
            if panel.xlog2:
                ax.set_xscale("log", base=2)
                if panel.xticks:
                    ax.set_xticks(list(panel.xticks), [f"{t:g}" for t in panel.xticks])
            finite = [y for series in panel.series for y in series.y if math.isfinite(y)]
            if not finite:  # e.g. steps that answered nothing have no latency
                ax.text(0.5, 0.5, "no values to plot", ha="center", va="center", transform=ax.transAxes)
            if panel.ylog and any(y > 0 for y in finite):  # a log axis of no positive value fails
                ax.set_yscale("log")
                ax.yaxis.set_major_formatter(plain)
                ax.yaxis.set_minor_formatter(sparse)
                ax.tick_params(axis="y", which="minor", labelsize=7)
            ax.set_xlabel(panel.xlabel)
            ax.set_ylabel(panel.ylabel)
            ax.set_title(panel.title)
        legends(axes, LEGEND_IN_PANEL)
    return path
