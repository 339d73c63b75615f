"""The membership-inference evaluation sets, and the label-only baseline.

Membership is evaluated on members and non-members with the SAME class counts, so that a label
shift alone (a label-skewed partition against the stratified holdout) cannot pass for leakage:
any score that depends on the label alone has AUC exactly 1/2 on them. The counts, the draw and
the label-only attacker's likelihood-ratio score: docs/attacks.md, "How the matched sets are
drawn".
"""

from __future__ import annotations

import hashlib

import numpy as np

from dpclip.data.splits import largest_remainder
from dpclip.errors import DpclipError


def evaluation_seed(data_seed: int, game: str) -> int:
    """One seed per (data.seed, membership game) for drawing the evaluation sets. The game is
    named by the partition and the training seed (``iid-seed0``), not by the method: every
    method trained on the same members is scored on the same records, so the comparison between
    methods carries no noise from different draws."""
    digest = int.from_bytes(hashlib.sha256(game.encode()).digest()[:8], "little")
    return int(np.random.SeedSequence([int(data_seed), digest]).generate_state(1)[0])


def matched_counts(y_members: np.ndarray, y_nonmembers: np.ndarray, n_classes: int,
                   max_per_side: int | None = None) -> np.ndarray:
    """The per-class counts c_k that both evaluation sets get (docs/attacks.md, "How the
    matched sets are drawn")."""
    h = np.bincount(y_nonmembers, minlength=n_classes)
    m = np.where(h > 0, np.bincount(y_members, minlength=n_classes), 0)  # matchable members
    total = int(m.sum())
    if total == 0:
        return np.zeros(n_classes, dtype=np.int64)
    p = m / total
    present = m > 0
    size = min(total, int(np.floor(np.min(h[present] / p[present]) + 1e-9)))
    if max_per_side is not None:
        size = min(size, int(max_per_side))
    return largest_remainder(size, p, caps=np.minimum(m, h))


def class_matched_indices(y_members: np.ndarray, y_nonmembers: np.ndarray,
                          rng: np.random.Generator, max_per_side: int | None = None
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Sorted positions into ``y_members`` and ``y_nonmembers`` of two evaluation sets with
    identical class counts (:func:`matched_counts`), drawn without replacement."""
    y_members = np.asarray(y_members, dtype=np.int64)
    y_nonmembers = np.asarray(y_nonmembers, dtype=np.int64)
    n_classes = int(max(y_members.max(initial=-1), y_nonmembers.max(initial=-1)) + 1)
    counts = matched_counts(y_members, y_nonmembers, n_classes, max_per_side)
    if counts.sum() == 0:
        raise DpclipError(f"membership evaluation: the holdout has no record of the members' "
                          f"classes {np.unique(y_members).tolist()}, so no class-matched "
                          f"non-members can be drawn")
    picks_in, picks_out = [], []
    for k in np.flatnonzero(counts):
        picks_in.append(rng.choice(np.flatnonzero(y_members == k), counts[k], replace=False))
        picks_out.append(rng.choice(np.flatnonzero(y_nonmembers == k), counts[k],
                                    replace=False))
    return np.sort(np.concatenate(picks_in)), np.sort(np.concatenate(picks_out))


def label_only_scores(labels: np.ndarray, y_members: np.ndarray, y_nonmembers: np.ndarray
                      ) -> np.ndarray:
    """s(y) = log f_in(y) - log f_out(y), with f_in, f_out the class frequencies of
    ``y_members`` and ``y_nonmembers`` (known to the attacker; a frequency of 0 floored at
    1e-300 in the logarithm)."""
    labels = np.asarray(labels, dtype=np.int64)
    n_classes = int(max(labels.max(initial=-1), np.max(y_members, initial=-1),
                        np.max(y_nonmembers, initial=-1)) + 1)
    f_in = np.bincount(y_members, minlength=n_classes) / max(len(y_members), 1)
    f_out = np.bincount(y_nonmembers, minlength=n_classes) / max(len(y_nonmembers), 1)
    ratio = np.log(np.maximum(f_in, 1e-300)) - np.log(np.maximum(f_out, 1e-300))
    return ratio[labels]


def label_only_auc(y_members: np.ndarray, y_nonmembers: np.ndarray) -> float:
    """AUC of the label-only attacker on members ``y_members`` against non-members
    ``y_nonmembers`` (ties count 1/2)."""
    y_members, y_nonmembers = np.asarray(y_members), np.asarray(y_nonmembers)
    labels = np.concatenate([y_members, y_nonmembers])
    truth = np.concatenate([np.ones(len(y_members)), np.zeros(len(y_nonmembers))])
    from sklearn.metrics import roc_auc_score  # on use: scikit-learn loads slowly

    return float(roc_auc_score(truth, label_only_scores(labels, y_members, y_nonmembers)))
