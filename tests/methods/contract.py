"""The contract every registered method keeps (like Opacus's per-extension contract tests):
each check is a plain function of the method's name, so the parametrized tests of
``test_contract.py`` and the test that adds the documented method (docs/adding-a-method.md)
run the same checks.

Settings are tiny (6 features, 3 classes, 100 records, B = 10) and a method gets the options
that make its controller act within them (:data:`TINY_OPTIONS`)."""

from __future__ import annotations

import functools
import math

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import gaussian_records, tiny_train_config

from dpclip.pipeline.params import parse_params
from dpclip.errors import ConfigError
from dpclip.methods import get_method
from dpclip.methods.base import Method, Option
from dpclip.train import build_run, train_model
from dpclip.train.runs import RUN_KINDS, run_class
from dpclip.train.runs.private import PrivateRun

# options that make each controller act within a few tiny epochs
TINY_OPTIONS = {
    "ww_dp_sgd": {"probe_every": 3, "min_tail": 4, "kappa": 0.5},
    "adaclip": {"count_noise_fraction": 0.2},
    "adaclip_opacus": {"count_noise_fraction": 0.2},
    "dc_sgd_p": {"hist_every": 5},
    "dc_sgd_e": {"hist_every": 5},
    "sanitize": {"n": 2, "public_steps": 20, "epochs": 3},
}


def scales_gradients(name: str) -> bool:
    """Whether the method's run kind is the private kind or one built on it (an accounted
    ``step`` on a batch, clipping with the method's rule): then it has a rule to check.
    Read from the kind's class, so a new kind on PrivateRun is checked without an edit here."""
    return issubclass(run_class(get_method(name).run_kind), PrivateRun)


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def config(name: str, **overrides):
    return tiny_train_config(name, epochs=3, method_options=TINY_OPTIONS.get(name, {}),
                             **overrides)


def public_data():
    return gaussian_records(60, seed=1)


def same_thresholds(a: list[dict], b: list[dict]) -> bool:
    """The C_t columns of two traces agree (NaN, a non-private run's C, equals NaN)."""
    return np.array_equal([r["clip_threshold"] for r in a], [r["clip_threshold"] for r in b],
                          equal_nan=True)


def train(name: str, device: str = "cpu", **kw):
    x, y = gaussian_records(100)
    return train_model(x, y, (6,), 3, config(name, device=device), progress=False,
                       public=public_data(), **kw)


@functools.lru_cache(maxsize=None)
def reference(name: str):
    """One uninterrupted CPU run per method, shared by the checks that only read it."""
    return train(name)


# --------------------------------------------------------------------------------------------


def check_declaration(name: str) -> None:
    """Registered under its own name, a known run kind, options declared as Option, and a
    scaling rule wherever the shared DP step will call one."""
    cls = get_method(name)
    assert issubclass(cls, Method) and cls.name == name
    assert cls.run_kind in RUN_KINDS
    assert all(isinstance(option, Option) for option in cls.OPTIONS.values())
    if scales_gradients(name):
        assert cls.scale is not Method.scale, f"{name} has run kind {cls.run_kind} but no scale"
    assert cls.adjacency in (None, "add_remove", "replace_one_features")
    assert cls.private == (cls.run_kind != "plain")


def check_clip_bound(name: str) -> None:
    """||gbar_i|| <= C_t for every record, at C_0 and after the controller has moved C, for
    norms spanning six orders of magnitude (the accountant relies on it)."""
    if not scales_gradients(name):
        pytest.skip(f"{name} does not scale gradients")
    x, y = gaussian_records(100)
    run = build_run((6,), 3, len(x), config(name), public_data())
    generator = torch.Generator().manual_seed(0)
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)
    for step in range(4):
        layers = len(run.method.layer_names)
        norms = torch.rand(64, layers, generator=generator, dtype=torch.float64) * \
            10.0 ** torch.randint(-3, 4, (64, layers), generator=generator)
        factors = run.method.scale(norms)
        scaled = factors[:, None] * norms if factors.dim() == 1 else factors * norms
        totals = scaled.pow(2).sum(dim=1).sqrt()
        assert float(totals.max()) <= run.method.clip_threshold * (1 + 1e-6), (name, step)
        run.step(xt, yt, list(range(10 * step, 10 * step + 10)), epoch=1)


def check_matched_budget(name: str) -> None:
    """A private method spends its target epsilon, not more (within the search's tolerance,
    never above); a non-private one claims nothing."""
    privacy = reference(name).privacy
    if not get_method(name).private:
        assert privacy["epsilon"] is None and privacy["dp_guarantee"] is False
        return
    assert privacy["epsilon"] <= 4.0 + 1e-9
    assert privacy["epsilon"] >= 4.0 - 0.05, privacy
    claim = get_method(name).privacy_claim()  # the defaults' claim, as the record states it
    assert (privacy["dp_guarantee"], privacy["adjacency"]) == (claim.dp_guarantee, claim.adjacency)
    assert privacy["data_use"] and all(isinstance(v, str) for v in privacy["data_use"].values())


def check_empty_batch(name: str, device: str = "cpu") -> None:
    """An empty Poisson batch is a full, accounted, noise-only step (docs/privacy.md,
    "Empty batches": skipping it would reveal the empty batch), on the run's device."""
    if not scales_gradients(name):
        pytest.skip(f"{name} has no Poisson batches")
    x, y = gaussian_records(100)
    run = build_run((6,), 3, len(x), config(name, device=device), public_data())
    before = [p.detach().clone() for p in run.groups.flat()]
    row = run.step(torch.as_tensor(x, device=device), torch.as_tensor(y, device=device), [],
                   epoch=1)
    assert row["batch_size"] == 0 and run.guard.steps == 1
    assert math.isnan(row["train_loss"]) and row["epsilon_spent"] > 0  # accounted
    assert all(not torch.equal(b, p) for b, p in zip(before, run.groups.flat()))


def check_adversarial_records(name: str) -> None:
    """No record can stop a private run or change its control flow (an audit: a NaN feature
    or a gradient norm above ~1.8e19 made DC-SGD's histogram index negative, and lm_dp_sgd's
    private layer weights NaN): records with NaN and huge features go through the real step,
    contribute nothing, and every release (the noisy sum, the extra queries, the controller's
    state) stays finite, step after step. (``adaclip_opacus`` is Opacus's optimizer as it is,
    with no DP guarantee: not dpclip's step.)"""
    if not run_class(get_method(name).run_kind).takes_gradient_canaries:
        pytest.skip(f"{name} does not run dpclip's DP step")
    x, y = gaussian_records(100)
    x[0], x[1], x[2] = np.nan, 1e25, -3e30
    run = build_run((6,), 3, len(x), config(name), public_data())
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)
    for step in range(12):  # past every controller's first update (hist_every 5, probes 3)
        run.step(xt, yt, [0, 1, 2] + list(range(3 + 7 * step, 10 + 7 * step)), epoch=1)
        assert math.isfinite(run.method.clip_threshold) and run.method.clip_threshold > 0
        assert all(torch.isfinite(p).all() for p in run.groups.flat()), (name, step)


def check_determinism(name: str) -> None:
    """The same configuration and data give the same weights, the same trace in every column,
    the same training facts and privacy record: a wall-clock time in any of them would make
    DVC see a new output on every run. Times live in ``time`` only, one end per step."""
    first, second = reference(name), train(name)
    for a, b in zip(first.model.parameters(), second.model.parameters()):
        assert torch.equal(a, b)
    assert same_thresholds(first.trace, second.trace)
    assert pd.DataFrame(first.trace).equals(pd.DataFrame(second.trace))
    assert first.training == second.training and first.privacy == second.privacy
    assert len(first.time["step_ended_at"]) == len(first.trace)
    assert first.time["step_ended_at"] == sorted(first.time["step_ended_at"])


def check_resume(name: str, monkeypatch, tmp_path, device: str = "cpu") -> None:
    """A run that crashed in epoch 3 resumes from its epoch-2 checkpoint to the model, trace
    and privacy record an uninterrupted run gives."""
    uninterrupted = train(name, device) if device != "cpu" else reference(name)
    runner = run_class(get_method(name).run_kind)
    original = runner.run_epoch

    def crash_in_epoch_3(self, x, y, epoch, bar):
        if epoch == 3:
            raise KeyboardInterrupt
        return original(self, x, y, epoch, bar)

    monkeypatch.setattr(runner, "run_epoch", crash_in_epoch_3)
    path = tmp_path / f"{name}.pt"
    with pytest.raises(KeyboardInterrupt):
        train(name, device, checkpoint_path=path, checkpoint_every=1)
    assert path.exists()
    monkeypatch.setattr(runner, "run_epoch", original)
    resumed = train(name, device, checkpoint_path=path, checkpoint_every=1)
    for a, b in zip(uninterrupted.model.parameters(), resumed.model.parameters()):
        assert torch.equal(a, b)
    assert same_thresholds(resumed.trace, uninterrupted.trace)
    assert resumed.privacy == uninterrupted.privacy
    assert not path.exists()  # discarded once training completed


def _outside(option: Option):
    """A value the option must refuse, or None when every value of its type is allowed (an
    unbounded number)."""
    if option.choices is not None:
        return "not-a-choice"
    if isinstance(option.default, bool):
        return "yes"
    if isinstance(option.default, str):
        return ""
    if option.low is not None:
        return option.low - 1 if not option.low_open else option.low
    if option.high is not None:
        return option.high + 1
    return "not-a-number"


def check_option_validation(name: str, tiny_raw) -> None:
    """Each option refuses a value outside its range with the key and the value named; an
    unknown option is refused too."""
    cls = get_method(name)
    for option_name, option in cls.OPTIONS.items():
        bad = _outside(option)
        if bad is None:
            continue
        with pytest.raises(ConfigError) as info:
            parse_params(tiny_raw(methods={name: {option_name: bad}}))
        assert f"methods.{name}.{option_name}" in str(info.value)
        assert repr(bad) in str(info.value)
    with pytest.raises(ConfigError, match=rf"methods\.{name}\.no_such_option"):
        parse_params(tiny_raw(methods={name: {"no_such_option": 1}}))


def check_tuning_space(name: str, tiny_raw) -> None:
    """What ``dpclip tune`` searches for the method are keys of params.yaml, and both ends of
    every range are values the method accepts (a trial never tries a refused value); the
    method's own knobs are options it declares."""
    from dpclip.methods.base import Tunable
    from dpclip.pipeline.tuned import with_values

    cls = get_method(name)
    params = parse_params(tiny_raw())
    space = cls.tuning_space(cls.default_options(), Tunable(0.01, 2.0, log=True),
                             Tunable(0.1, 10.0, log=True))
    assert space, "a method with nothing to tune"
    assert set(cls.TUNED_OPTIONS) <= set(cls.OPTIONS) or cls.__dict__.get("Options")
    for key, t in space.items():
        assert key.startswith(("train.", f"methods.{name}.")), key
        assert t.low < t.high
        for value in (t.low, t.high):
            tuned = with_values(params, {key: int(value) if t.integer else value})
            section, *rest = key.split(".")
            got = getattr(tuned.method_options(name), rest[-1]) if section == "methods" else \
                getattr(tuned.train, rest[0])
            assert got == value


def check_step_metrics(name: str) -> None:
    """The columns the method asks MLflow to log are columns its trace has."""
    result = reference(name)
    columns = set().union(*(row.keys() for row in result.trace))
    cls = get_method(name)
    assert set(cls.STEP_METRICS) <= columns, "a declared step metric the trace never has"
    assert set(cls.step_metrics(sorted(columns))) <= columns

CHECKS = {"declaration": check_declaration, "clip_bound": check_clip_bound,
          "matched_budget": check_matched_budget, "empty_batch": check_empty_batch,
          "determinism": check_determinism, "step_metrics": check_step_metrics}
