"""The one matplotlib set-up behind every chart the bundle writes.

The data profile and coverage charts (:mod:`criteo.profile`, :mod:`criteo.coverage`) and the
load-test, tune, soak and GPU charts (:func:`loadtest.engine.writer.plot`) draw on the axes
that :func:`figure` hands out, which then gives them one look: the house size and resolution,
a light grid on both tick levels, a layout in which no title, tick label or legend is cut off,
point labels that do not print over one another, and a PNG written atomically (a reader sees
the old chart or the new one, never a part). Charts with many series, or names too long for a
panel's own legend, name them in one legend below the panels (:func:`legends`).

The figure is a :class:`matplotlib.figure.Figure` drawn by the Agg canvas, without pyplot: no
GUI backend is chosen for the process, and no figure stays registered after its block.
matplotlib is imported inside :func:`figure`, so importing the bundle stays cheap.
"""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, cast

from bundle.errors import ConfigError
from bundle.staging import write_file_atomically

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.backends.backend_agg import RendererAgg
    from matplotlib.figure import Figure
    from matplotlib.legend import Legend
    from matplotlib.text import Text

#: Dots per inch of every PNG.
DPI = 110
#: Width x height (inches) of a figure with one chart.
CHART_SIZE = (7.5, 4.8)
#: Width x height (inches) of each chart of a row of charts (a figure of several panels).
PANEL_SIZE = (5.5, 4.4)
#: Font size of a figure's title above its panels.
TITLE_SIZE = 10
#: Inches of white space around the figure's edges and between its panels and titles.
PAD = 0.1
#: Font size of legend entries.
LEGEND_SIZE = 7
#: Columns of a legend below the panels, at most (fewer where the figure is too narrow).
LEGEND_COLUMNS = 3
#: Share of a panel's width its own legend may take; a wider one goes below the panels.
LEGEND_SHARE = 0.6
#: Layout passes that may grow the figure before every artist lies inside it.
_FIT_PASSES = 4


@contextmanager
def figure(
    path: Path,
    panels: int = 1,
    size: tuple[float, float] = CHART_SIZE,
    title: str | None = None,
    columns: int | None = None,
) -> Iterator[list[Axes]]:
    """Axes to draw on; on leaving the block, the chart styled and written to ``path`` as a PNG.

    Nothing is cut off at the figure's edges: a title wider than the figure is broken into
    lines, and where a legend, label or title still runs past an edge, the figure grows by
    what runs over (it keeps the house size where everything fits).

    Args:
        path: the PNG to write (its folder is created). Nothing is written when the block raises.
        panels: charts, one axes each.
        size: width x height (inches) of each chart.
        title: a title above all the panels.
        columns: charts per row (None: all in one row); ``size`` is then the size of one row
            of charts' height and one chart's width.

    Yields:
        The ``panels`` axes, left to right, then row by row.

    Raises:
        ConfigError: ``panels`` is below 1.
    """
    from matplotlib.figure import Figure

    if panels < 1:
        raise ConfigError(f"a chart needs at least one panel, got {panels}")
    # Constrained layout sizes the axes so that no title, tick label or legend is cut off or
    # overlaps a neighbour, the figure's title included (tight_layout leaves that one out).
    columns = min(columns or panels, panels)
    rows = -(-panels // columns)
    fig = Figure(figsize=(size[0] * columns, size[1] * rows), dpi=DPI, layout="constrained")
    fig.get_layout_engine().set(w_pad=PAD, h_pad=PAD)  # type: ignore[union-attr,call-arg]
    grid = fig.subplots(rows, columns, squeeze=False)
    axes = [ax for row in grid for ax in row]
    for spare in axes[panels:]:
        spare.set_visible(False)
        fig.delaxes(spare)
    axes = axes[:panels]
    yield axes
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
    if title:
        _wrap_to_width(fig, fig.suptitle(title, fontsize=TITLE_SIZE))
    _drop_overlapping_labels(fig)
    _grow_to_fit(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    write_file_atomically(path, buffer.getvalue())


def legends(axes: Sequence[Axes], most_in_panel: int) -> list[Legend]:
    """Name the curves: each panel in a legend of its own, or all of them in one below the panels.

    The panels keep their own legends where the curves have at most ``most_in_panel`` names in
    all and each legend takes at most :data:`LEGEND_SHARE` of its panel's width. Otherwise one
    legend below the panels names each curve once (:func:`legend_below`), so that no legend
    covers a panel or squeezes it.

    Args:
        axes: the axes :func:`figure` yielded, their curves drawn with labels.
        most_in_panel: names a panel's own legend may hold.

    Returns:
        The legends drawn (none where no curve has a name).
    """
    entries: dict[str, Artist] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    if not entries:
        return []
    if len(entries) <= most_in_panel:
        renderer = _renderer(cast("Figure", axes[0].get_figure(root=True)))
        own = [ax.legend(fontsize=LEGEND_SIZE) for ax in axes if ax.get_legend_handles_labels()[1]]
        share = [legend.get_window_extent(renderer).width / legend.axes.bbox.width for legend in own]
        if max(share) <= LEGEND_SHARE:
            return own
        for legend in own:
            legend.remove()
    return [legend_below(axes, list(entries.values()), list(entries))]


def legend_below(axes: Sequence[Axes], handles: Sequence[Artist], labels: Sequence[str]) -> Legend:
    """One legend below all the panels, in as many columns as the figure's width holds.

    The columns are :data:`LEGEND_COLUMNS` at most, fewer where the entries would run past the
    figure's edges (one at least; an entry wider than the figure then widens it, see
    :func:`figure`). The figure grows by the legend's height, so the panels keep theirs.

    Args:
        axes: the axes :func:`figure` yielded.
        handles: one artist per entry (a curve, as ``ax.get_legend_handles_labels()`` gives).
        labels: their names, in the same order.

    Returns:
        The legend.
    """
    fig = cast("Figure", axes[0].get_figure(root=True))
    renderer = _renderer(fig)
    room = fig.bbox.width - 2 * PAD * fig.dpi
    for columns in range(min(LEGEND_COLUMNS, len(labels)), 0, -1):
        legend = fig.legend(
            handles=list(handles), labels=list(labels), loc="outside lower center",
            ncol=columns, fontsize=LEGEND_SIZE, frameon=False,
        )  # fmt: skip
        box = legend.get_window_extent(renderer)
        if box.width <= room or columns == 1:
            break
        legend.remove()
    width, height = fig.get_size_inches()
    _resize(fig, width, height + box.height / fig.dpi + PAD)
    return legend


def _resize(fig: Figure, width: float, height: float) -> None:
    """Size the figure to ``width`` x ``height`` inches, each rounded up to a whole pixel (the PNG
    holds whole pixels: a fraction would be cut off the bottom or right edge)."""
    dpi = fig.dpi
    fig.set_size_inches(math.ceil(width * dpi - 1e-6) / dpi, math.ceil(height * dpi - 1e-6) / dpi)


def _renderer(fig: Figure) -> RendererAgg:
    """The Agg renderer that lays out and measures ``fig`` (one is attached on first use)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    return canvas.get_renderer()


def _wrap_to_width(fig: Figure, text: Text) -> None:
    """Break ``text`` at spaces into lines that fit the figure's width (less its padding)."""
    room = fig.bbox.width - 2 * PAD * fig.dpi
    width = text.get_window_extent(_renderer(fig)).width
    if width > room:
        chars = max(10, int(len(text.get_text()) * room / width))
        text.set_text(textwrap.fill(text.get_text(), chars, break_long_words=False))


def _grow_to_fit(fig: Figure) -> None:
    """Widen or heighten the figure until every artist of it lies inside its edges.

    Constrained layout keeps axes, their labels and outside legends apart, but a legend or
    title wider than the figure is centred and runs past both edges: the figure then grows
    by what runs over, plus :data:`PAD` a side, and is laid out again.
    """
    renderer = _renderer(fig)
    slack = 1 / fig.dpi  # a pixel: rounding, not an overflow
    for _ in range(_FIT_PASSES):
        fig.draw_without_rendering()
        box = fig.get_tightbbox(renderer)  # inches
        width, height = fig.get_size_inches()
        over_x = max(0.0, -box.x0) + max(0.0, box.x1 - width)
        over_y = max(0.0, -box.y0) + max(0.0, box.y1 - height)
        if over_x <= slack and over_y <= slack:
            return
        _resize(
            fig,
            width + (over_x + 2 * PAD if over_x > slack else 0.0),
            height + (over_y + 2 * PAD if over_y > slack else 0.0),
        )


def _drop_overlapping_labels(fig: Figure) -> None:
    """Hide each point label (``ax.annotate``) that would print over an earlier one of its axes.

    Labels are kept in the order they were drawn, so a caller draws the ones that matter first.
    """
    from matplotlib.text import Annotation
    from matplotlib.transforms import Bbox

    renderer = _renderer(fig)
    fig.draw_without_rendering()  # lays the figure out, so the labels' extents are final
    for ax in fig.axes:
        kept: list[Bbox] = []
        for text in ax.texts:
            if not isinstance(text, Annotation) or not text.get_visible() or not text.get_text():
                continue
            box = text.get_window_extent(renderer)
            if any(box.overlaps(other) for other in kept):
                text.set_visible(False)
            else:
                kept.append(box)
