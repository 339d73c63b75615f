"""Every registered attack against the contract of an attack: the list comes from the
registry, so a new attack module is covered without editing this file. An attack declares a
name, label and description; its default options validate; it returns one finite score per
attacked record, the same score for a record wherever it sits among the others (it cannot
learn membership from the order), and the same scores when run twice."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from dpclip.attacks import AttackEvidence, ReferenceEvidence, available_attacks, get_attack
from dpclip.attacks.base import Attack, register

ATTACKS = available_attacks()
N, K, P, C = 40, 4, 30, 3


def evidence(permutation: np.ndarray | None = None) -> AttackEvidence:
    """Random evidence of N records (4 online reference models, P population records)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 5)).astype(np.float32)
    labels = rng.integers(0, C, N)
    logits = rng.normal(size=(N, C))
    reference = rng.normal(size=(K, N, C))
    inside = np.zeros((K, N), bool)
    inside[:2, : N // 2] = inside[2:, N // 2:] = True  # each record IN for two models
    pop_y = rng.integers(0, C, P)
    pop_logits, pop_reference = rng.normal(size=(P, C)), rng.normal(size=(K, P, C))
    order = np.arange(N) if permutation is None else permutation
    model = torch.nn.Sequential(torch.nn.Linear(5, C)).eval()
    return AttackEvidence(x=x[order], labels=labels[order], logits=logits[order], model=model,
                          references=ReferenceEvidence(
                              logits=reference[:, order], inside=inside[:, order],
                              population_labels=pop_y, population_logits=pop_logits,
                              population_reference_logits=pop_reference))


@pytest.mark.parametrize("name", ATTACKS)
def test_declaration_and_default_options(name):
    attack = get_attack(name)
    assert attack.name == name and attack.label and attack.description
    assert issubclass(attack, Attack) and isinstance(attack.needs_references, bool)
    attack(attack.Options.model_validate({}))  # the defaults are valid


@pytest.mark.parametrize("name", ATTACKS)
def test_one_finite_score_per_record_wherever_it_sits(name):
    attack = get_attack(name)()
    scores = attack.scores(evidence())
    assert scores.shape == (N,) and np.isfinite(scores).all()
    assert np.array_equal(scores, attack.scores(evidence()))  # deterministic
    permutation = np.random.default_rng(1).permutation(N)
    moved = attack.scores(evidence(permutation))
    # the same record, the same score, up to float rounding
    assert moved == pytest.approx(scores[permutation], rel=1e-9, abs=1e-12)


def test_exactly_one_baseline_attack():
    assert [n for n in ATTACKS if get_attack(n).baseline] == ["loss"]


def test_a_registration_that_would_confuse_the_metrics_is_refused():
    class Nameless(Attack):
        label, description = "x", "y"

        def scores(self, evidence):
            return np.zeros(len(evidence.labels))

    with pytest.raises(ValueError, match="lower-case identifier"):
        register(Nameless)
    impostor = type("Impostor", (Nameless,), {"name": "lira", "__module__": "plugin.fake"})
    with pytest.raises(ValueError, match="already registered"):
        register(impostor)
    assert get_attack("lira") is not impostor


def test_the_evaluate_stage_shuffles_so_position_tells_nothing(tiny_raw):
    """An attack that scores the first records highest would find every member if the members
    came first; the stage hands the records over shuffled, so it scores chance, while every
    score comes back to its own record (the loss attack's, computed in the stage's order)."""
    from dpclip.attacks.base import REGISTRY, register
    from dpclip.pipeline.params import parse_params
    from dpclip.metrics import attack_metrics
    from dpclip.stages.evaluate import run_attacks

    class ByPosition(Attack):
        name, label, description = "by_position", "By position", "the first records first"

        def scores(self, evidence):
            return -np.arange(len(evidence.labels), dtype=float)

    register(ByPosition)
    try:
        params = parse_params(tiny_raw(attack={"kinds": ["loss", "by_position"],
                                               "references": 0}))
        rng, n = np.random.default_rng(3), 400
        given = AttackEvidence(x=rng.normal(size=(n, 2)), labels=rng.integers(0, 3, n),
                               logits=rng.normal(size=(n, 3)), model=None)
        scores, not_run = run_attacks(params, given, n // 2, seed=0)
        assert abs(attack_metrics(*scores["by_position"])["auc"] - 0.5) < 0.1
        assert np.concatenate(scores["loss"]) == pytest.approx(
            get_attack("loss")().scores(given))
        assert not_run == {}
    finally:
        REGISTRY.pop("by_position", None)


def test_a_name_the_records_use_for_something_else_is_refused():
    """``mode`` would be read as the attack section's key, ``mia`` would write mia_auc over
    the loss attack's column, ``member`` over a column of the scores file."""
    from dpclip.attacks.base import RESERVED_NAMES

    for name in ("mode", "mia", "member", "label_only"):
        assert name in RESERVED_NAMES
        clash = type("Clash", (Attack,), {"name": name, "label": "x", "description": "y",
                                          "scores": lambda self, evidence: None,
                                          "__module__": "plugin.fake"})
        with pytest.raises(ValueError, match="is taken"):
            register(clash)
        assert name not in ATTACKS


def test_an_attack_cannot_change_what_the_next_one_sees(tiny_raw):
    """The evidence's arrays are read-only and each attack gets its own copy of the model."""
    from dpclip.attacks.base import REGISTRY
    from dpclip.pipeline.params import parse_params
    from dpclip.stages.evaluate import run_attacks

    class Writer(Attack):
        name, label, description = "writer", "Writer", "writes into its evidence"

        def scores(self, evidence):
            with torch.no_grad():
                for p in evidence.model.parameters():
                    p.zero_()  # its own copy: harmless
            evidence.logits[0, 0] = 1.0  # read-only: refused
            return np.zeros(len(evidence.labels))

    register(Writer)
    try:
        params = parse_params(tiny_raw(attack={"kinds": ["loss", "writer"], "references": 0}))
        given = evidence()
        before = [p.detach().clone() for p in given.model.parameters()]
        with pytest.raises(ValueError, match="read-only"):
            run_attacks(params, replace(given, references=None), N // 2, seed=0)
        assert all(torch.equal(a, b) for a, b in zip(before, given.model.parameters()))
    finally:
        REGISTRY.pop("writer", None)


def test_loss_scores_are_float64_log_probabilities_that_do_not_tie():
    """A confident model: float32 softmax rounds p_y to 1.0 for both records (a tie, and the
    loss attack's AUC moved by 0.003 on a default run); the float64 log-softmax tells them
    apart, and matches log p_y worked out by hand."""
    import numpy as np

    from dpclip.attacks.loss import log_true_class_probability

    logits = np.array([[20.0, 0.0], [25.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    scores = log_true_class_probability(logits, np.array([0, 0, 1]))
    assert scores.dtype == np.float64 and scores[0] != scores[1]
    np.testing.assert_allclose(scores, [-np.log1p(np.exp(-20.0)), -np.log1p(np.exp(-25.0)),
                                        -np.log1p(np.exp(-1.0))], rtol=1e-12)
