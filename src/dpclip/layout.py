"""Where every stage reads and writes, relative to the project root (one place, used by the
stages, the CLI, the Prefect flows and the tests). Each run's outputs are read from the
stages' declarations (:data:`dpclip.catalog.RUN_FILES`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dpclip.catalog import RUN_FILES, TUNED

SPLITS = ("target_train", "target_holdout", "shadow_train", "shadow_holdout")


def _run_output(name: str):
    """The Layout method giving the output ``name`` of a run (its pattern's ``{run}``)."""
    pattern = RUN_FILES[name]

    def path(self, run: str = "") -> Path:
        return self.root / pattern.format(run=run)

    path.__name__ = name
    path.__doc__ = f"``{pattern}``"
    return path


@dataclass(frozen=True)
class Layout:
    root: Path = Path(".")

    # each run's outputs, as the stages declare them
    model, record, trace, audit = (_run_output(n) for n in ("model", "record", "trace", "audit"))
    signals, reference = _run_output("signals"), _run_output("reference")
    metrics, summary, roc = (_run_output(n) for n in ("metrics", "summary", "roc"))
    reliability, figures = _run_output("reliability"), _run_output("figures")
    attack_scores, ir_attack = _run_output("attack_scores"), _run_output("ir_attack")
    shadow_risk = property(_run_output("shadow_risk"))

    def output(self, name: str, run: str = "") -> Path:
        """The output ``name`` of a run, as its stage declares it (``Layout.trace(run)`` is
        ``Layout.output("trace", run)``)."""
        return self.root / RUN_FILES[name].format(run=run)

    def run_dir(self, run: str) -> Path:
        """``runs/<run>``: the trained model, its record and its provenance."""
        return self.model(run).parent

    def references(self, run: str) -> Path:
        """``references/<run>``: each reference model's logits on the run's members, its
        holdout and the population, which records it trained on, and ``reference.json``; its
        provenance beside them. The models themselves are not kept."""
        return self.signals(run).parent

    @property
    def shadow(self) -> Path:
        """The shadow stage's outputs: ``risk.json``, ``model.pt`` and ``risk.png``."""
        return self.shadow_risk.parent

    @property
    def prepared(self) -> Path:
        return self.root / "data" / "prepared"

    def split(self, name: str) -> Path:
        return self.prepared / f"{name}.npz"

    @property
    def sources(self) -> Path:
        """The check stage's fingerprints of the data files params.yaml names."""
        return self.root / "data" / "sources.json"

    @property
    def model_source(self) -> Path:
        """The check stage's fingerprint of a model file of the user's own (train.model)."""
        return self.root / "data" / "model_file.json"

    @property
    def prepared_meta(self) -> Path:
        return self.prepared / "meta.json"

    def partition(self, alpha_tag: str) -> Path:
        return self.root / "data" / "partitions" / alpha_tag

    def checkpoint(self, run: str) -> Path:
        """Training state saved every few epochs; outside DVC's outputs, which DVC clears
        before it runs a stage."""
        return self.root / ".dpclip" / "checkpoints" / f"{run}.pt"

    def retired(self, run: str) -> Path:
        """Where a trained run no longer configured waits (its ``runs/<run>`` folder and its
        trace), outside DVC's outputs: ``runs/`` and ``traces/`` hold exactly the configured
        runs, so their hashes in ``dvc.lock`` depend on the parameters, not on history."""
        return self.root / ".dpclip" / "retired" / run

    def timing(self, run: str) -> Path:
        """Wall-clock times of a run's training (total, per step, each step's end). Not a DVC
        output: a time differs on every run, and DVC hashes its outputs into ``dvc.lock``."""
        return self.root / "timings" / f"{run}.json"

    @property
    def tuned(self) -> Path:
        """``dpclip tune``'s chosen values per (method, target epsilon), read by training."""
        return self.root / TUNED

    @property
    def tuning_trials(self) -> Path:
        """Every trial of ``dpclip tune``: its values and its public validation accuracy."""
        return self.tuned.parent / "trials.csv"

    @property
    def overlays(self) -> Path:
        """Plot tables with every configured run in one file (a ``run`` column), tracked by git:
        the data of ``dvc plots show`` / ``dvc plots diff``."""
        return self.root / "overlays"

    @property
    def reports(self) -> Path:
        return self.root / "reports"
