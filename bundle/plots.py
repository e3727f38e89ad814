"""The one matplotlib set-up behind every chart the bundle writes.

The data profile and coverage charts (:mod:`criteo.profile`, :mod:`criteo.coverage`) and the
load-test, tune, soak and GPU charts (:func:`loadtest.engine.writer.plot`) draw on the axes
that :func:`figure` hands out, which then gives them one look: the house size and resolution,
a light grid on both tick levels, a layout in which no title, tick label or legend is cut off,
point labels that do not print over one another, and a PNG written atomically (a reader sees
the old chart or the new one, never a part).

The figure is a :class:`matplotlib.figure.Figure` drawn by the Agg canvas, without pyplot: no
GUI backend is chosen for the process, and no figure stays registered after its block.
matplotlib is imported inside :func:`figure`, so importing the bundle stays cheap.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from bundle.errors import ConfigError
from bundle.staging import write_file_atomically

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

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


@contextmanager
def figure(
    path: Path,
    panels: int = 1,
    size: tuple[float, float] = CHART_SIZE,
    title: str | None = None,
    columns: int | None = None,
) -> Iterator[list[Axes]]:
    """Axes to draw on; on leaving the block, the chart styled and written to ``path`` as a PNG.

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
        fig.suptitle(title, fontsize=TITLE_SIZE)
    _drop_overlapping_labels(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    write_file_atomically(path, buffer.getvalue())


def _drop_overlapping_labels(fig: Figure) -> None:
    """Hide each point label (``ax.annotate``) that would print over an earlier one of its axes.

    Labels are kept in the order they were drawn, so a caller draws the ones that matter first.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Annotation
    from matplotlib.transforms import Bbox

    FigureCanvasAgg(fig)
    fig.draw_without_rendering()  # lays the figure out, so the labels' extents are final
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
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
