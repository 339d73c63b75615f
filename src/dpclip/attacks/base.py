"""What a membership attack is, and what it may see.

An attack is one module of :mod:`dpclip.attacks`: a subclass of :class:`Attack` decorated with
:func:`register`, run when ``attack.kinds`` names it, with its options in ``attack.<name>``
(its ``Options`` model). It gets an :class:`AttackEvidence` of the class-matched members and
non-members, shuffled, and returns one score per record, higher = member; the evaluate stage
turns the scores into the ROC, AUC, low-FPR TPRs and DP-bound check. See
docs/adding-an-attack.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from pydantic import BaseModel
from torch import nn

from dpclip.param_types import Section
from dpclip.registry import Registry


@dataclass(frozen=True)
class ReferenceEvidence:
    """The K reference models' view of the attacked records (the ``reference`` stage).

    ``logits`` (K, n, C) on the n attacked records; ``inside`` (K, n): whether each model
    trained on each record (None offline: all OUT); ``population_*``: RMIA's population records
    z, their labels, the target's logits (p, C) and the models' (K, p, C). Offline they are
    public records, none attacked; online the target holdout, which holds the attacked
    non-members too: an attack must not look records up in it (docs/adding-an-attack.md)."""

    logits: np.ndarray
    inside: np.ndarray | None
    population_labels: np.ndarray
    population_logits: np.ndarray
    population_reference_logits: np.ndarray

    @property
    def online(self) -> bool:
        return self.inside is not None


@dataclass(frozen=True)
class AttackEvidence:
    """What every attack sees of the n attacked records: the inputs ``x``, their ``labels``,
    the target model's ``logits`` (n, C) on them, the target ``model`` itself (white-box
    attacks; eval mode, do not train it) and, with ``attack.references`` > 0, the reference
    models' :class:`ReferenceEvidence` (else None)."""

    x: np.ndarray
    labels: np.ndarray
    logits: np.ndarray
    model: nn.Module
    references: ReferenceEvidence | None = None


class NoOptions(Section):
    """An attack without options: ``attack.<name>`` may only be empty."""


class Attack(ABC):
    """Base class. A subclass sets ``name``, ``label`` and ``description`` and implements
    :meth:`scores`; ``needs_references`` when it calibrates against reference models (it is
    then skipped, with the reason in the metrics file, for a run that has none)."""

    name: ClassVar[str] = ""  # the key in attack.kinds, metrics (mia.<name>) and file names
    label: ClassVar[str] = ""  # how figures and tables name it ("LiRA")
    description: ClassVar[str] = ""  # one or two sentences for the report's notes
    needs_references: ClassVar[bool] = False
    # the baseline attack every run reports: its numbers keep the unprefixed contract names
    # (mia_auc in MLflow and comparison.csv, reports/roc.png); the others are prefixed by name
    baseline: ClassVar[bool] = False
    Options: ClassVar[type[BaseModel]] = NoOptions  # attack.<name> in params.yaml

    def __init__(self, options: BaseModel | dict | None = None):
        self.options = options if isinstance(options, BaseModel) else \
            self.Options.model_validate(options or {})

    @abstractmethod
    def scores(self, evidence: AttackEvidence) -> np.ndarray:
        """One membership score per attacked record (n,), higher = member."""

    @classmethod
    def check_options(cls, options: BaseModel, references: int, mode: str) -> list[str]:
        """Problems of the options together with ``attack.references`` and ``attack.mode``
        (one line each naming ``attack.<name>.<option>`` and the value); none by default."""
        return []

    # names derived from ``name``, the same everywhere
    @classmethod
    def prefix(cls) -> str:
        """The prefix of its columns and MLflow metrics: "" for the baseline, else the name."""
        return "" if cls.baseline else cls.name

    @classmethod
    def figure_stem(cls) -> str:
        """Its report figure and plot table: ``roc`` for the baseline, else ``roc_<name>``."""
        return "roc" if cls.baseline else f"roc_{cls.name}"


# names an attack may not take: keys of the attack section, of a metrics file's ``mia``, of
# ``scores/<run>.csv`` and prefixes of the comparison table's other columns
RESERVED_NAMES = frozenset({
    "kinds", "classifier", "folds", "max_features", "max_records", "references", "mode",
    "population", "headline", "options", "mia", "ir", "ir_train", "label_only", "matching", "not_run",
    "dp_bound_family", "split", "position", "label", "member", "strongest", "attack", "test",
    "audit", "peak_ir", "epsilon", "dp_bound", "tpr_bound"})


def declaration_problems(cls: type) -> list[str]:
    """What would make an attack's metrics, files or columns ambiguous."""
    if not (isinstance(cls, type) and issubclass(cls, Attack)):
        return ["is not an Attack subclass"]
    problems = []
    if not cls.name.isidentifier() or cls.name != cls.name.lower():
        problems.append(f"name must be a lower-case identifier, not {cls.name!r} (it names "
                        f"files and metrics)")
    elif cls.name in RESERVED_NAMES:
        problems.append(f"name {cls.name!r} is taken by a key of the attack section, the "
                        f"metrics file or the report's columns")
    if not cls.label or not cls.description:
        problems.append("needs a label and a description")
    if "scores" in getattr(cls, "__abstractmethods__", ()):
        problems.append("does not implement scores()")
    return problems


REGISTRY = Registry("attack", "dpclip.attacks", "Attack", "dpclip.attacks",
                    check=declaration_problems)
register = REGISTRY.register  # the class decorator of every attack module
