"""Where every stage reads and writes, relative to the project root (one place, used by the
stages, the CLI, the Prefect flows, dvc.yaml and the tests)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SPLITS = ("target_train", "target_holdout", "shadow_train", "shadow_holdout")


@dataclass(frozen=True)
class Layout:
    root: Path = Path(".")

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
    def prepared_meta(self) -> Path:
        return self.prepared / "meta.json"

    def partition(self, alpha_tag: str) -> Path:
        return self.root / "data" / "partitions" / alpha_tag

    def run_dir(self, run: str) -> Path:
        return self.root / "runs" / run

    def checkpoint(self, run: str) -> Path:
        """Training state saved every few epochs; outside DVC's outputs, which DVC clears
        before it runs a stage."""
        return self.root / ".dpclip" / "checkpoints" / f"{run}.pt"

    def retired(self, run: str) -> Path:
        """Where a trained run no longer configured waits (its ``runs/<run>`` folder and its
        trace), outside DVC's outputs: ``runs/`` and ``traces/`` hold exactly the configured
        runs, so their hashes in ``dvc.lock`` depend on the parameters, not on history."""
        return self.root / ".dpclip" / "retired" / run

    def trace(self, run: str) -> Path:
        return self.root / "traces" / f"{run}.csv"

    def timing(self, run: str) -> Path:
        """Wall-clock times of a run's training (total, per step, each step's end). Not a DVC
        output: a time differs on every run, and DVC hashes its outputs into ``dvc.lock``."""
        return self.root / "timings" / f"{run}.json"

    @property
    def tuned(self) -> Path:
        """``dpclip tune``'s chosen values per (method, target epsilon), read by training."""
        return self.root / "tuned" / "tuned.json"

    @property
    def tuning_trials(self) -> Path:
        """Every trial of ``dpclip tune``: its values and its public validation accuracy."""
        return self.root / "tuned" / "trials.csv"

    def audit(self, run: str) -> Path:
        """The run's one-run privacy audit (``audits/<run>/audit.json``), one entry per canary
        kind; its provenance beside it."""
        return self.root / "audits" / run / "audit.json"

    def references(self, run: str) -> Path:
        """The run's reference models' signals (``references/<run>/``): each model's logits on
        the run's members, its holdout and the population, which records it trained on, and
        ``reference.json``; its provenance beside them. The models themselves are not kept."""
        return self.root / "references" / run

    def metrics(self, run: str) -> Path:
        return self.root / "metrics" / f"{run}.json"

    def attack_scores(self, run: str) -> Path:
        """Per-record membership scores of every attack on the run's evaluation sets."""
        return self.root / "scores" / f"{run}.csv"

    def summary(self, run: str) -> Path:
        """The run's scalar summary, tracked by git: DVC's ``metrics:`` (``dvc exp show``,
        ``dvc metrics diff``)."""
        return self.root / "summary" / f"{run}.json"

    @property
    def overlays(self) -> Path:
        """Plot tables with every configured run in one file (a ``run`` column), tracked by git:
        the data of ``dvc plots show`` / ``dvc plots diff``."""
        return self.root / "overlays"

    def roc(self, run: str) -> Path:
        return self.root / "plots" / "roc" / f"{run}.csv"

    def reliability(self, run: str) -> Path:
        return self.root / "plots" / "reliability" / f"{run}.csv"

    def figures(self, run: str) -> Path:
        return self.root / "figures" / run

    @property
    def shadow(self) -> Path:
        """The shadow stage's outputs: ``risk.json``, ``model.pt`` and ``risk.png``."""
        return self.root / "shadow"

    @property
    def shadow_risk(self) -> Path:
        return self.shadow / "risk.json"

    def ir_attack(self, run: str) -> Path:
        """Per-layer IR membership-inference results of one run, for ``dvc plots``."""
        return self.root / "plots" / "ir_mia" / f"{run}.csv"

    @property
    def reports(self) -> Path:
        return self.root / "reports"
