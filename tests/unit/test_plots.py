"""The bundle's one matplotlib set-up: house size and resolution, a PNG written atomically, and
point labels that never print over one another."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

from bundle.errors import ConfigError
from bundle.plots import CHART_SIZE, DPI, PANEL_SIZE, figure

ROOT = Path(__file__).resolve().parents[2]


def _png_size(path: Path) -> tuple[int, int]:
    """Width and height in pixels, from the PNG's header."""
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", header[16:24])
    return width, height


def test_one_chart_at_the_house_size(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "chart.png"
    with figure(path) as (ax,):
        ax.plot([1, 2, 3], [1, 4, 9], "o-", label="squares")
        ax.legend()
    assert _png_size(path) == (round(CHART_SIZE[0] * DPI), round(CHART_SIZE[1] * DPI))
    grid = ax.get_xgridlines() + ax.get_ygridlines()
    assert grid and all(line.get_visible() for line in grid)  # the house grid
    assert [p.name for p in path.parent.iterdir()] == ["chart.png"]  # no temporary file left


def test_panels_side_by_side_under_one_title(tmp_path: Path) -> None:
    path = tmp_path / "panels.png"
    with figure(path, 3, PANEL_SIZE, title="three panels") as axes:
        assert len(axes) == 3
        for i, ax in enumerate(axes):
            ax.plot([0, 1], [0, i])
    assert _png_size(path) == (round(3 * PANEL_SIZE[0] * DPI), round(PANEL_SIZE[1] * DPI))
    assert axes[0].figure.get_suptitle() == "three panels"


def test_a_failed_drawing_leaves_the_old_chart(tmp_path: Path) -> None:
    path = tmp_path / "chart.png"
    path.write_bytes(b"old")
    with pytest.raises(ValueError, match="bad data"), figure(path) as (ax,):
        ax.plot([1], [1])
        raise ValueError("bad data")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["chart.png"]


def test_point_labels_that_would_overlap_are_dropped(tmp_path: Path) -> None:
    with figure(tmp_path / "labels.png") as (ax,):
        ax.plot([0, 10], [0, 10])
        first = ax.annotate("C1", (5, 5))
        on_top = ax.annotate("C2", (5, 5.01))
        apart = ax.annotate("C3", (1, 9))
    assert first.get_visible() and apart.get_visible()
    assert not on_top.get_visible()


def test_no_panel_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="at least one panel"), figure(tmp_path / "none.png", 0):
        pass
    assert not (tmp_path / "none.png").exists()


def test_neither_import_nor_drawing_touches_pyplot(tmp_path: Path) -> None:
    """Importing the bundle stays cheap, and a chart neither picks a GUI backend nor stays open."""
    code = (
        "import sys; from pathlib import Path; import bundle.plots as p; "
        "print('matplotlib' in sys.modules); "
        f"ctx = p.figure(Path({str(tmp_path / 'c.png')!r}))\n"
        "with ctx as (ax,): ax.plot([0, 1])\n"
        "print('matplotlib.pyplot' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False"]
    assert (tmp_path / "c.png").is_file()
