"""Every figure the pipeline writes, looked at as an image.

* The report's PNGs and those of the evaluate, partition and evidence stages (matplotlib), made
  from small hand-made inputs through the functions the stages call: each is decoded and must
  be drawn on, not mostly blank, and of a sane size; no legend may sit on an axes; what a
  figure leaves out it says (a DP bound that constrains nothing, a run without an audit bound);
  the files get the umask's mode, not tempfile's 0600.
* The `dvc plots show` / `dvc plots diff` charts: DVC fills the templates in .dvc/plots with
  the overlay tables (its own `plots show` and renderer matching, as `dvc plots show --json`
  does), and vl-convert renders them offline (Vega-Lite 5.8, the oldest it ships; DVC's page
  runs 5.2). One seed (no band) and two revisions (`plots diff`) included.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.image  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import yaml  # noqa: E402

from dpclip.reporting import plots  # noqa: E402
from dpclip.pipeline.params import parse_params  # noqa: E402
from dpclip.files import write_csv_frame, write_json  # noqa: E402
from dpclip.layout import Layout  # noqa: E402
from dpclip.run_keys import configured_runs  # noqa: E402
from dpclip.stages.evaluate import run_summary  # noqa: E402
from dpclip.stages.report import report  # noqa: E402

PROJECT = Path(__file__).resolve().parents[1]


def file_mode() -> int:
    """The mode a file written with ``open`` gets under this process's umask (0644 with 022)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


@dataclass
class Ink:
    """How much of an image is drawn on."""
    height: int
    width: int
    drawn: float  # the fraction of pixels that are not background (white or transparent)
    blank_rows: float  # the longest run of blank rows, as a fraction of the height
    blank_columns: float  # the same for columns, of the width


def _longest_run(blank: np.ndarray) -> int:
    longest = run = 0
    for b in blank:
        run = run + 1 if b else 0
        longest = max(longest, run)
    return longest


def ink(png: bytes | Path) -> Ink:
    """Decode a PNG and measure its ink (transparent pixels count as white background)."""
    image = matplotlib.image.imread(io.BytesIO(png) if isinstance(png, bytes) else png)
    rgb = image[..., :3].astype(float)
    if image.shape[-1] == 4:
        alpha = image[..., 3:4].astype(float)
        rgb = rgb * alpha + (1 - alpha)
    drawn = (rgb < 0.95).any(axis=-1)
    height, width = drawn.shape
    return Ink(height, width, float(drawn.mean()),
               _longest_run(~drawn.any(axis=1)) / height,
               _longest_run(~drawn.any(axis=0)) / width)


def assert_drawn(image: Ink, name: str, max_height: int = 1500, min_drawn: float = 0.03):
    """Drawn on (at least ``min_drawn`` of it), no blank band over a third of it either way,
    and between 150 px and ``max_height`` tall."""
    assert 150 <= image.height <= max_height, f"{name}: {image.height} px tall"
    assert image.width >= 200, f"{name}: {image.width} px wide"
    assert image.drawn >= min_drawn, f"{name}: only {image.drawn:.1%} drawn on"
    assert image.blank_rows <= 1 / 3, \
        f"{name}: a blank band of {image.blank_rows:.0%} of its height"
    assert image.blank_columns <= 1 / 3, \
        f"{name}: a blank band of {image.blank_columns:.0%} of its width"


@dataclass
class Drawn:
    """What one figure showed when it was written: its texts, and legends on axes."""
    path: Path
    texts: list[str]
    legend_labels: list[str]
    covering_legends: list[str]  # "legend on <axes title>" for each legend over an axes


@pytest.fixture
def drawn(monkeypatch) -> dict[str, Drawn]:
    """The figures written through :mod:`dpclip.reporting.plots` in the test, by file name, looked at
    just before they are saved."""
    from matplotlib.text import Text

    seen: dict[str, Drawn] = {}
    write = plots.write_figure

    def looking(path, fig):
        fig.canvas.draw()
        covering = []
        for ax in fig.axes:
            legend = ax.get_legend()
            if legend is None:
                continue
            box = legend.get_window_extent()
            covering += [f"legend on {other.get_title() or 'axes'}" for other in fig.axes
                         if box.overlaps(other.get_window_extent())]
        legends = [t.get_text() for ax in fig.axes if ax.get_legend()
                   for t in ax.get_legend().get_texts()]
        texts = [t.get_text() for t in fig.findobj(Text) if t.get_text()]
        seen[Path(path).name] = Drawn(Path(path), texts, legends, covering)
        return write(path, fig)

    monkeypatch.setattr(plots, "write_figure", looking)
    return seen


ACCURACY = {"non_private": 0.95, "dp_sgd": 0.9, "sanitize": 0.86}


def _metrics(run: str, method: str, seed: int) -> dict:
    """Metrics of a run as the evaluate stage writes them (the keys the report reads): dp_sgd
    audited, sanitize claiming epsilon under an adjacency the audit does not cover,
    non_private without a claim."""
    private = method != "non_private"
    fpr = np.logspace(-3, 0, 8)
    audit_reason = {"sanitize": "replace_one_features adjacency (the canaries are added or "
                                "removed whole records)", "non_private": "no DP claim"}
    audit = {kind: {"applicable": method == "dp_sgd", "violated": False,
                    "reason": audit_reason.get(method),
                    "epsilon_lower_bound": 1.2 + 0.3 * seed if method == "dp_sgd" else None}
             for kind in ("whitebox",)}
    loss = {"auc": 0.55 + 0.01 * seed, "balanced_accuracy": 0.53, "tpr_at_fpr_1pct": 0.02,
            "tpr_at_fpr_0.1pct": 0.004,
            "dp_bound": {"checked": private, "violated": False, "worst_margin": -0.2,
                         "epsilon_used": 16.0, "delta_used": 0.03}}
    return {"run": run, "dataset": "digits", "method": method, "alpha": None, "seed": seed,
            "privacy": {"dp_guarantee": private, "target_epsilon": 8.0,
                        "epsilon": 7.9 if private else None, "delta": 1e-5,
                        "noise_multiplier": 1.1 if private else None,
                        "adjacency": "replace_one_features" if method == "sanitize" else
                        "add_remove"},
            "utility": {"accuracy": ACCURACY[method] - 0.02 * seed, "ece": 0.05 + 0.01 * seed,
                        "mce": 0.1, "brier": 0.2, "nll": 0.3},
            "mia": {"loss": loss,
                    "headline": {"attack": "loss", "auc": loss["auc"], "low_fpr": 0.01,
                                 "tpr_at_low_fpr": 0.02 + 0.01 * seed, "tpr_at_zero_fp": 0.0}},
            "clip": {"c_initial": 1.0, "c_final": 1.5, "c_median": 1.2},
            "audit": audit, "time": {"train_s": 1.0, "step_s_median": 0.01}, "training": {},
            "_roc": pd.DataFrame({"attack": "loss", "fpr": fpr, "tpr": fpr ** (0.8 + 0.1 * seed)})}


def evaluated_project(root: Path, tiny_raw, seeds: list[int]):
    """non_private, dp_sgd and sanitize at epsilon 8 over ``seeds``, as the evaluate stage
    leaves them (metrics, summaries, traces, ROC and reliability tables)."""
    params = parse_params(tiny_raw(train={"methods": ["non_private", "dp_sgd", "sanitize"],
                                          "seeds": seeds}))
    layout = Layout(root)
    for key in configured_runs(params):
        m = _metrics(key.name, key.method, key.seed)
        roc = m.pop("_roc")
        write_json(layout.metrics(key.name), m)
        write_json(layout.summary(key.name), run_summary(m))
        steps = np.arange(1, 201)
        clip = 1 + 0.5 * np.sin(steps / 20 + key.seed) if key.method == "dp_sgd" else np.nan
        write_csv_frame(layout.trace(key.name), pd.DataFrame(
            {"step": steps, "train_loss": 1 / steps, "clip_threshold": clip}))
        write_csv_frame(layout.roc(key.name), roc)
        write_csv_frame(layout.reliability(key.name), pd.DataFrame(
            {"confidence": [0.35, 0.6, 0.8, 0.95], "accuracy": [0.3, 0.55, 0.85, 0.97],
             "count": [3, 20, 40, 200]}))
    return params, layout


@pytest.fixture
def reported(tmp_path, tiny_raw, drawn):
    """The report of two seeds, its figures looked at as they were written."""
    params, layout = evaluated_project(tmp_path, tiny_raw, [0, 1])
    report(params, layout, track=False)
    return layout, drawn


REPORT_FIGURES = {"comparison.png", "claimed_vs_audited_epsilon.png", "clip_thresholds.png",
                  "clip_thresholds-eps8-iid-seed0.png", "clip_thresholds-eps8-iid-seed1.png",
                  "roc.png", "privacy_utility.png"}


def test_every_report_figure_is_drawn_on_with_its_legend_off_the_axes(reported):
    layout, drawn = reported
    written = {p.name for p in layout.reports.glob("*.png")}
    assert written == REPORT_FIGURES
    for name in sorted(written):
        assert_drawn(ink(layout.reports / name), name)
        assert drawn[name].covering_legends == [], name


def test_report_files_get_the_umask_mode(reported):
    layout, _ = reported
    files = [*layout.reports.iterdir(), *layout.overlays.rglob("*.csv")]
    assert layout.overlays / "roc" / "loss.csv" in files
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == file_mode(), path.name


def test_atomic_writes_are_not_private_to_their_owner(tmp_path):
    """tempfile makes 0600 files and 0700 folders; renamed into place they must read like any
    other output: 0644 and 0755 under the usual umask 022."""
    from dpclip.files import atomic_dir, write_text

    umask = os.umask(0o022)
    try:
        write_text(tmp_path / "report.md", "# report\n")
        with atomic_dir(tmp_path / "prepared") as folder:
            write_text(folder / "split.csv", "x\n")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "report.md").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "prepared").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "prepared" / "split.csv").stat().st_mode) == 0o644


def test_the_audit_figure_says_which_runs_have_no_bound_and_why(reported):
    _, drawn = reported
    texts = "\n".join(drawn["claimed_vs_audited_epsilon.png"].texts)
    for run in ("sanitize-eps8-iid-seed0", "non_private-eps8-iid-seed1"):
        assert run in texts  # every run has its row
    assert "no audit bound (claims epsilon 7.9, replace_one_features adjacency): not" in \
        texts.replace("\n", " ")  # the mark: another neighbouring notion
    assert "no audit bound (no DP claim): not applicable (no DP claim)" in texts


def test_the_jittered_epsilon_axis_says_so(reported):
    _, drawn = reported
    texts = drawn["privacy_utility.png"].texts
    assert any(t.startswith("epsilon (log axis, jittered by up to ±") for t in texts)
    assert any("ticks mark the true epsilons" in t for t in texts)
    assert "Privacy-utility over seeds (mean, 95% band)" in texts


def test_a_dp_bound_is_drawn_where_the_legend_names_it(tmp_path, drawn):
    fpr = np.logspace(-4, 0, 50)
    curves = {"loss threshold": pd.DataFrame({"fpr": fpr, "tpr": fpr ** 0.9})}
    plots.roc_figure(tmp_path / "loose.png", curves, "eps' 16", bound=(16.0, 0.03))
    plots.roc_figure(tmp_path / "tight.png", curves, "eps' 2", bound=(2.0, 1e-5))
    loose, tight = drawn["loose.png"], drawn["tight.png"]
    # eps' 16 allows TPR ~1 at every FPR from 1e-4: a line along the top edge, not named
    assert not any("DP bound" in label for label in loose.legend_labels)
    assert any(t.startswith("DP bound (eps' 16, delta' 0.03) not drawn") for t in loose.texts)
    assert "DP bound (eps' 2)" in tight.legend_labels
    for d in (loose, tight):
        assert_drawn(ink(d.path), d.path.name)
        assert d.covering_legends == []


def test_reliability_bins_carry_their_record_counts(tmp_path, drawn):
    bins = pd.DataFrame({"lower": np.linspace(0, 0.9, 10), "upper": np.linspace(0.1, 1, 10),
                         "count": [0, 0, 0, 2, 7, 0, 15, 30, 80, 400],
                         "accuracy": [0, 0, 0, 1.0, 0.4, 0, 0.6, 0.7, 0.85, 0.98]})
    bins["bin_center"] = (bins["lower"] + bins["upper"]) / 2
    plots.reliability_figure(tmp_path / "reliability.png", bins, 0.04, "run")
    d = drawn["reliability.png"]
    assert {"2", "7", "15", "30", "80", "400"} <= set(d.texts)  # the non-empty bins
    assert "0" not in d.texts  # empty bins are not drawn
    assert_drawn(ink(d.path), "reliability.png")
    assert d.covering_legends == []


def test_the_other_stages_figures_are_drawn_on_with_their_legends_off_the_axes(tmp_path,
                                                                               drawn):
    steps = np.arange(1, 101)
    trace = pd.DataFrame({"step": steps, "clip_threshold": 1 + steps / 100,
                          "epoch": np.repeat(np.arange(1, 11), 10),
                          "monitored_std": np.repeat(np.linspace(1, 0.2, 10), 10),
                          "early_stop_flag": np.repeat([0] * 7 + [1] * 3, 10)})
    plots.clip_figure(tmp_path / "clip.png", {"run a": trace, "run b": trace.assign(
        clip_threshold=trace["clip_threshold"] * 2)}, "C_t")
    plots.clip_figure(tmp_path / "no_clip.png", {"run": trace.assign(clip_threshold=np.nan)},
                      "C_t")
    plots.early_stopping_figure(tmp_path / "early_stopping.png",
                                trace.drop_duplicates("epoch"), "early stopping", "std")
    layers = {n: {"accuracy": 0.5 + 0.02 * i, "auc": 0.52 - 0.01 * i}
              for i, n in enumerate(("fc1", "fc2", "head"))}
    plots.layer_attack_figure(tmp_path / "ir_mia.png", layers, "IR attack")
    plots.partition_histogram_figure(tmp_path / "histogram.png", {
        "histogram": [30, 10, 5, 40], "classes": ["a", "b", "c", "d"], "alpha": 0.1,
        "size": 85, "source_size": 100})
    plots.claim_figure(tmp_path / "claim.png", [
        {"label": "eps 1", "baseline": "dp_sgd", "method_mean": (0.8, 0.75, 0.85),
         "baseline_mean": (0.7, 0.65, 0.75), "paper_method": 0.82},
        {"label": "eps 8", "baseline": "dp_sgd", "method_mean": (0.9, 0.88, 0.92),
         "baseline_mean": (0.85, 0.8, 0.9)}], "auto_s", "accuracy", "claim")
    assert set(drawn) == {"clip.png", "no_clip.png", "early_stopping.png", "ir_mia.png",
                          "histogram.png", "claim.png"}
    for name, d in drawn.items():
        assert_drawn(ink(d.path), name, min_drawn=0.02)
        assert d.covering_legends == [], name
        assert stat.S_IMODE(d.path.stat().st_mode) == file_mode(), name
    assert drawn["early_stopping.png"].legend_labels == ["std", "stop flag"]  # one flag entry


# --- the DVC plots: templates filled by DVC, rendered by vl-convert --------------------------

VEGA_LITE = "5.8"


def dvc_plots(root: Path) -> dict:
    """``dvc plots show`` of ``root`` (the project's ``plots:`` and templates, the overlay
    tables already there): DVC's plot data of the workspace, as its command collects it."""
    from dvc.repo import Repo

    templates = root / ".dvc" / "plots"
    if not templates.exists():
        Repo.init(str(root), no_scm=True)
        shutil.copytree(PROJECT / ".dvc" / "plots", templates, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("*.html"))
        section = yaml.safe_load((PROJECT / "dvc.yaml").read_text())["plots"]
        (root / "dvc.yaml").write_text(yaml.safe_dump({"plots": section}, sort_keys=False))
    with Repo(str(root)) as repo:
        return repo.plots.show()["workspace"]


def vega_specs(by_revision: dict[str, dict], templates: Path) -> dict[str, dict]:
    """The filled Vega-Lite spec of each plot with data, by plot name (``dvc plots show
    --json``'s ``content``), for the revisions given (two: what ``dvc plots diff`` draws)."""
    from dvc.render.match import match_defs_renderers

    return {r.renderer.name: r.renderer.get_filled_template()
            for r in match_defs_renderers(data=by_revision, templates_dir=templates)
            if r.renderer.datapoints}


@pytest.fixture
def overlays_of(tmp_path_factory, tiny_raw):
    """``seeds`` -> the DVC plots of a project evaluated with those seeds."""
    def make(seeds: list[int]) -> tuple[Path, dict]:
        root = tmp_path_factory.mktemp(f"seeds{len(seeds)}")
        params, layout = evaluated_project(root, tiny_raw, seeds)
        from dpclip.reporting.overlays import write_overlays

        write_overlays(layout, configured_runs(params))
        return root, dvc_plots(root)

    return make


PLOTS = {"overlays/clip_threshold.csv", "overlays/roc/loss.csv", "overlays/reliability.csv",
         "overlays/privacy_utility.csv", "claimed_vs_audited_epsilon",
         "privacy_utility_accuracy", "privacy_utility_ece", "privacy_utility_attack"}


def render(spec: dict) -> Ink:
    import vl_convert

    return ink(vl_convert.vegalite_to_png(spec, vl_version=VEGA_LITE))


def test_every_dvc_plot_renders_drawn_on_and_of_a_sane_height(overlays_of):
    for seeds in ([0], [0, 1]):  # one seed: no band (its interval columns are empty)
        root, shown = overlays_of(seeds)
        specs = vega_specs({"workspace": shown}, root / ".dvc" / "plots")
        assert PLOTS <= set(specs), set(specs)
        for name, spec in specs.items():
            # a chart is 300-400 px; one seed's band once drew 380 px and then thousands blank
            assert_drawn(render(spec), f"{name} ({len(seeds)} seeds)", max_height=700,
                         min_drawn=0.02)


def test_dvc_plots_diff_tells_the_revisions_apart(overlays_of):
    import vl_convert

    root, one_seed = overlays_of([0])
    _, two_seeds = overlays_of([0, 1])
    specs = vega_specs({"main": one_seed, "workspace": two_seeds}, root / ".dvc" / "plots")
    for name in PLOTS:
        assert_drawn(render(specs[name]), f"{name} (main, workspace)", max_height=700,
                     min_drawn=0.02)
        vega = vl_convert.vegalite_to_vega(specs[name], vl_version=VEGA_LITE)
        by_revision = [legend for legend in vega.get("legends", [])
                       if legend.get("title") == "revision"]
        assert len(by_revision) == 1, name
        legend = by_revision[0]
        # points: a shape per revision; lines alone: a dash per revision, drawn as a stroke
        # (a dash on a dot symbol is invisible: two identical black dots)
        assert "shape" in legend or (legend.get("strokeDash") and
                                     legend.get("symbolType") == "stroke"), (name, legend)


def test_the_audit_plot_holds_every_point_inside_its_axes(overlays_of):
    import vl_convert

    root, shown = overlays_of([0])
    spec = vega_specs({"workspace": shown}, root / ".dvc" / "plots")["claimed_vs_audited_epsilon"]
    svg = vl_convert.vegalite_to_svg(spec, vl_version=VEGA_LITE)
    centres = [(float(x), float(y)) for x, y in re.findall(
        r'aria-roledescription="point" transform="translate\(([-\d.]+),([-\d.]+)\)"', svg)]
    assert len(centres) == 1  # dp_sgd's bound; sanitize has none
    for x, y in centres:  # a point of radius ~5 px whole inside the plot area, with room
        assert 8 <= x <= spec["width"] - 8 and 8 <= y <= spec["height"] - 8, (x, y)
    # the runs without a bound are named under the plot, with the reason
    assert "sanitize-eps8-iid-seed0 (digits) (workspace): not applicable (" \
        "replace_one_features" in svg


def test_at_one_epsilon_the_methods_stand_side_by_side(overlays_of):
    """With one target epsilon every private run sits at the same epsilon: the plots against
    epsilon once drew them as one vertical strip. Each method (each series over seeds) is
    shifted by its own fixed factor, and the axis title says so."""
    import vl_convert

    root, shown = overlays_of([0])
    specs = vega_specs({"workspace": shown}, root / ".dvc" / "plots")
    for name in ("overlays/privacy_utility.csv", "privacy_utility_accuracy"):
        svg = vl_convert.vegalite_to_svg(specs[name], vl_version=VEGA_LITE)
        xs = sorted({round(float(x)) for x, _ in re.findall(
            r'aria-roledescription="point" transform="translate\(([-\d.]+),([-\d.]+)\)"', svg)})
        assert len(xs) == 2 and xs[1] - xs[0] > 100, (name, xs)  # dp_sgd and sanitize
        assert "shifted by a fixed factor (at most 1.16x either way)" in svg, name


def test_each_roc_plot_names_its_attack(overlays_of):
    # DVC draws one ROC plot per overlays/roc/<attack>.csv under one title: each names its
    # attack in its corner, from the file's name
    import vl_convert

    root, shown = overlays_of([0])
    specs = vega_specs({"workspace": shown}, root / ".dvc" / "plots")
    rocs = {name: spec for name, spec in specs.items() if name.startswith("overlays/roc/")}
    assert rocs
    for name, spec in rocs.items():
        attack = Path(name).stem
        svg = vl_convert.vegalite_to_svg(spec, vl_version=VEGA_LITE)
        assert f"attack: {attack}" in svg, name
