"""Every chart keeps its legend, labels and titles inside the saved PNG, however long the series
names and however many series: the sweep report's charts, the cold tier's, and the set-up itself."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
from matplotlib.axis import Axis
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from bundle.plots import PANEL_SIZE, figure, legend_below
from bundle.records import RunRecord
from lab.cold_tier import CONDITIONS, write_cold_tier
from loadtest.engine.writer import Panel, Series, plot
from loadtest.sweeps.report import ENGINES_PNG, P99_PNG, THROUGHPUT_PNG, Report, write_report
from loadtest.sweeps.steps import StepResult

MODELS = ("wide_deep_onnx", "wide_deep_onnx_int8", "wide_deep_onnx_fp16")
PROTOCOLS = ("grpc", "http")
LEVELS = (1, 4, 16)
#: Half a pixel either way: a glyph's extent is rounded, the canvas is not.
SLACK = 0.5


def _png_size(path: Path) -> tuple[int, int]:
    """Width and height in pixels, from the PNG's header."""
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", header[16:24])
    return width, height


def _drawn_tick_labels(axis: Axis) -> list[Text]:
    """The tick labels the axis draws: those of ticks inside its view, with text."""
    lo, hi = sorted(axis.get_view_interval())
    tolerance = 1e-9 * max(abs(lo), abs(hi), 1.0)
    labels = []
    for ticks in (axis.get_major_ticks(), axis.get_minor_ticks()):
        for tick in ticks:
            if lo - tolerance <= tick.get_loc() <= hi + tolerance:
                labels += [t for t in (tick.label1, tick.label2) if t.get_visible() and t.get_text()]
    return labels


def _tick_labels(axis: Axis) -> list[Text]:
    """Every tick label the axis holds, drawn or not."""
    return [
        t for tick in (*axis.get_major_ticks(), *axis.get_minor_ticks()) for t in (tick.label1, tick.label2)
    ]


def artists_outside(fig: Figure, png: Path) -> list[str]:
    """What of ``fig`` lies outside the image it was saved as, one line each (empty: nothing).

    Checked, by their window extents in the renderer that saved ``png``: every visible text
    with text (figure and panel titles, axis labels, legend entries, point labels, axis offset
    text), every tick label the axes draw, and each legend's frame and box.
    """
    width, height = _png_size(png)
    assert (width, height) == (round(fig.bbox.width), round(fig.bbox.height)), "the PNG is not the figure"
    canvas = fig.canvas
    assert isinstance(canvas, FigureCanvasAgg)
    renderer = canvas.get_renderer()
    inside = Bbox.from_extents(-SLACK, -SLACK, width + SLACK, height + SLACK)

    ticks = {id(t) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis) for t in _tick_labels(axis)}
    legends = [*fig.legends, *(legend for ax in fig.axes if (legend := ax.get_legend()) is not None)]
    checked: dict[int, tuple[str, Any]] = {}
    for legend in legends:
        checked |= {id(t): ("legend entry", t) for t in legend.get_texts()}
        checked |= {
            id(legend.get_frame()): ("legend frame", legend.get_frame()),
            id(legend): ("legend", legend),
        }
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            checked |= {id(t): ("tick label", t) for t in _drawn_tick_labels(axis)}
    for text in fig.findobj(Text):
        if id(text) not in ticks and id(text) not in checked and text.get_visible() and text.get_text():
            checked[id(text)] = ("text", text)
    outside = []
    for kind, artist in checked.values():
        box = artist.get_window_extent(renderer)
        if not (inside.x0 <= box.x0 <= box.x1 <= inside.x1 and inside.y0 <= box.y0 <= box.y1 <= inside.y1):
            name = artist.get_text() if isinstance(artist, Text) else type(artist).__name__
            outside.append(f"{kind} {name!r} at {box.extents.round(1).tolist()} of a {width}x{height} image")
    return outside


def _assert_inside(figures: list[Figure], pngs: list[Path]) -> None:
    """The figures saved, in order, are ``pngs``, and each keeps everything inside its PNG."""
    assert len(figures) == len(pngs)
    for fig, png in zip(figures, pngs, strict=True):
        outside = artists_outside(fig, png)
        assert not outside, f"{png.name}: " + "; ".join(outside)


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list[Figure]:
    """Each figure the bundle saves, in the order saved."""
    saved: list[Figure] = []
    original = Figure.savefig

    def savefig(self: Figure, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        saved.append(self)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return saved


def _step(model: str, protocol: str, batch: int, level: int, engine: str) -> StepResult:
    rate = 100.0 * level * batch
    return StepResult(
        label="triton", model=model, protocol=protocol, batch_size=batch, concurrency=level,
        processes=1, seconds=1.0, requests=100 * level, errors=0, requests_per_s=rate / batch,
        samples_per_s=rate, p50_ms=1.0 + level, p90_ms=2.0 + level, p95_ms=2.5 + level,
        p99_ms=3.0 + 2 * level, mean_ms=1.5 + level, max_ms=9.0 + level, engine=engine,
        client_bound=level == LEVELS[-1],
    )  # fmt: skip


def _report(batches: tuple[int, ...], engines: tuple[str, ...] = ("locust",)) -> Report:
    steps = [
        _step(model, protocol, batch, level, engine)
        for model in MODELS
        for protocol in PROTOCOLS
        for batch in batches
        for engine in engines
        for level in LEVELS
    ]
    record = RunRecord.from_json({"command": "python -m loadtest sweep", "started": "-", "machine": {}})
    title = (
        "Wide & Deep (reference sizes, table 100000), FP32, FP16 and INT8 models on the local tritonserver"
    )
    return Report(title, record, steps)


@pytest.mark.parametrize(
    ("batches", "engines"),
    [((1,), ("locust",)), ((1, 64, 1024), ("locust",)), ((64, 1024), ("locust", "perf_analyzer"))],
    ids=["one-panel", "three-panels", "engines"],
)
def test_the_sweep_charts_keep_every_label_inside(
    figures: list[Figure], tmp_path: Path, batches: tuple[int, ...], engines: tuple[str, ...]
) -> None:
    paths = write_report(_report(batches, engines), tmp_path)
    pngs = [tmp_path / name for name in (THROUGHPUT_PNG, P99_PNG)]
    if len(engines) > 1:
        pngs.insert(0, tmp_path / ENGINES_PNG)
    assert sorted(p for k, p in paths.items() if k.endswith("png")) == sorted(pngs)
    _assert_inside(figures, pngs)
    throughput = figures[pngs.index(tmp_path / THROUGHPUT_PNG)]
    (legend,) = throughput.legends  # the many series share one legend below the panels
    assert "triton wide_deep_onnx_int8 grpc p50" in [t.get_text() for t in legend.get_texts()]


def _cold_tier_report(stores: tuple[str, ...], ways: tuple[str, ...], batches: list[int]) -> dict[str, Any]:
    levels = [1, 4, 16]
    summary, steps = [], []
    for store in stores:
        for way in ways:
            for batch in batches:
                for level in levels:
                    rate = 1000.0 * level
                    summary.append(
                        {
                            "store": store, "way": way, "batch_size": batch, "concurrency": level,
                            "cold_samples_per_s": 0.9 * rate, "warm_samples_per_s": rate,
                            "cold_over_warm": 0.9, "cold_over_first_store": 1.0, "warm_over_first_store": 1.0,
                            "cold_p50_ms": 10.0, "cold_p99_ms": 40.0, "warm_p99_ms": 15.0,
                            "cold_lookups_per_request": 36.0, "pages_read_per_request": 35.0,
                            "cold_stage_ms": 3.0, "warm_stage_ms": 1.5, "disk_bound_ms": 0.8,
                            "cold_stage_over_disk_bound": 3.7, "cold_rows_ms": 1.5,
                            "cold_rows_over_disk_bound": 1.8,
                        }
                    )  # fmt: skip
                    steps += [
                        {
                            "store": store, "way": way, "batch_size": batch, "concurrency": level,
                            "condition": condition, "resident_at_start_bytes": 0, "errors": 0,
                            "stage_instances": 2, "dense_model": "dlrm_onnx", "dense_instances": 2,
                            "dense_threads": 1,
                        }
                        for condition in CONDITIONS
                    ]  # fmt: skip
    return {
        "record": {
            "command": "python -m lab cold-tier",
            "started": "-",
            "machine": {"cpu": "a test CPU", "cores": 2, "memory_gib": 4.0, "cpu_flags": {"avx2": True}},
        },
        "options": {
            "model": "dlrm_onnx",
            "stage": "dlrm_embedding",
            "ways": list(ways),
            "batch_sizes": batches,
            "concurrency": levels,
            "rounds": 1,
            "seconds": 1.0,
            "warmup_s": 0.0,
            "warm": "resident",
            "pool_rows": 0,
            "stage_instances": 2,
            "dense_instances": 0,
            "dense_threads": 0,
        },
        "stores": [{"label": s, "bytes": 8e9, "row_bytes": 256} for s in stores],
        "disk": [{"queue_depth": 1, "how": "threads", "iops": 24000.0, "mean_latency_us": 42.0}],
        "steps": steps,
        "summary": summary,
    }


@pytest.mark.parametrize(
    ("stores", "ways", "batches"),
    [
        (
            ("float16 rows of the reference tables", "int8 rows of the reference tables"),
            ("io_uring",),
            [64, 1024],
        ),
        (("float16 rows of the reference tables", "int8 rows"), ("io_uring", "prefetch", "pread"), [1024]),
    ],
    ids=["legend-in-panels", "one-panel-legend-below"],
)
def test_the_cold_tier_chart_keeps_every_label_inside(
    figures: list[Figure], tmp_path: Path, stores: tuple[str, ...], ways: tuple[str, ...], batches: list[int]
) -> None:
    paths = write_cold_tier(_cold_tier_report(stores, ways, batches), tmp_path)
    _assert_inside(figures, [paths["plot"]])


def test_an_entry_wider_than_the_figure_widens_it(figures: list[Figure], tmp_path: Path) -> None:
    long = "a series name long enough to run past both edges of one panel " * 2
    path = tmp_path / "wide.png"
    with figure(path, 1, PANEL_SIZE, title="one panel") as (ax,):
        (line,) = ax.plot([0, 1], [0, 1])
        legend = legend_below([ax], [line], [long])
    assert legend.get_texts()[0].get_text() == long
    assert _png_size(path)[0] > round(PANEL_SIZE[0] * figures[0].dpi)
    _assert_inside(figures, [path])


@pytest.mark.parametrize(
    ("names", "below"),
    [
        ([f"triton wide_deep_onnx {p} p{q}" for p in PROTOCOLS for q in (50, 99)], False),
        ([f"triton wide_deep_onnx_int8 {p} [perf_analyzer] p{q}" for p in PROTOCOLS for q in (50, 99)], True),
        (["x" * 40 + " a very long series name" * 5, "short"], True),
    ],
    ids=["short-names-in-panels", "long-names-below", "a-name-wider-than-the-figure"],
)
def test_few_series_keep_their_panel_legend_unless_it_would_crowd_it(
    figures: list[Figure], tmp_path: Path, names: list[str], below: bool
) -> None:
    series = [Series(name, [1, 2, 4], [1.0 + i, 2.0 + i, 3.0 + i]) for i, name in enumerate(names)]
    panels = [Panel(f"batch {b}", "x", "y", series) for b in (1, 64)]
    path = plot(tmp_path / "panel.png", "two panels", panels)
    _assert_inside(figures, [path])
    (fig,) = figures
    assert len(fig.legends) == below
    assert all((ax.get_legend() is None) == below for ax in fig.axes)
