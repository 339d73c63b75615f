"""The tuned-params file ``tuned/tuned.json``: what ``dpclip tune`` chose for each (method,
target epsilon) (:func:`tuned_values`), and how a run's parameters take them (:func:`with_values`).

The search itself is :mod:`dpclip.stages.tune`. This module is what the train, audit and
reference stages read, so it imports no training code. With ``tune.trials: 0`` nothing is read
and every run trains with the values in params.yaml.

Each entry carries the fingerprint of the parameters it was searched under (:func:`fingerprint`);
a run whose parameters changed since is refused rather than trained with stale values.
"""

from __future__ import annotations

import hashlib
import json

from dpclip.config import Params, option_values, with_overrides
from dpclip.errors import DpclipError
from dpclip.hashing import file_hash
from dpclip.files import read_json
from dpclip.layout import Layout
from dpclip.run_keys import epsilon_tag
from dpclip.pipeline.params import parse_params

# train.* keys that do not change what a trial measures (the run matrix, where and how often)
UNTUNED_TRAIN_KEYS = {"methods", "seeds", "device", "checkpoint_every"}


def with_values(params: Params, values: dict) -> Params:
    """``params`` with dotted keys set (``train.lr``, ``methods.dc_sgd_p.p``), validated again
    like params.yaml (a value out of its option's range is refused the same way)."""
    overrides: dict = {}
    for dotted, value in values.items():
        *sections, last = dotted.split(".")
        node = overrides
        for section in sections:
            node = node.setdefault(section, {})
        node[last] = value
    return parse_params(with_overrides(params.to_dict(), overrides))


def value_at(tree: dict, dotted: str):
    """The value of a dotted key (``train.lr``) in nested sections."""
    for part in dotted.split("."):
        tree = tree[part]
    return tree


def fingerprint(params: Params, method: str) -> str:
    """SHA-256 of what a search for ``method`` depends on besides the data: the training and
    privacy settings, the method's options and the ``tune`` section."""
    basis = {"train": params.train.model_dump(exclude=UNTUNED_TRAIN_KEYS),
             "privacy": params.privacy.model_dump(exclude={"target_epsilons"}),
             "tune": params.tune.model_dump(), "method": option_values(params.method_options(method))}
    return hashlib.sha256(json.dumps(basis, sort_keys=True, default=str).encode()).hexdigest()


def tuned_values(params: Params, layout: Layout, method: str, epsilon) -> dict | None:
    """The values ``dpclip tune`` chose for (method, target epsilon), by dotted key; None when
    tuning is off (``tune.trials: 0``). Raises :class:`DpclipError` when the file is missing,
    lacks the run, or was searched under other parameters."""
    if params.tune.trials == 0:
        return None
    path = layout.tuned
    if not path.is_file():
        raise DpclipError(f"{path} is missing but tune.trials is {params.tune.trials}: run "
                          f"`dpclip tune` first (or set tune.trials: 0)")
    record = read_json(path)
    entry = record.get("runs", {}).get(method, {}).get(epsilon_tag(epsilon))
    if entry is None:
        raise DpclipError(f"{path} has no tuned values for {method} at "
                          f"{epsilon_tag(epsilon)}: run `dpclip tune` again")
    if entry["fingerprint"] != fingerprint(params, method):
        raise DpclipError(f"{path}: the values for {method} at {epsilon_tag(epsilon)} were "
                          f"searched under other train, privacy, tune or methods.{method} "
                          f"parameters: run `dpclip tune` again")
    searched_on = (record.get("inputs") or {}).get("files", {})
    for label, current in (("data/prepared", layout.prepared),
                           ("shadow/risk.json", layout.shadow_risk)):
        if label in searched_on and searched_on[label] != file_hash(current):
            raise DpclipError(f"{path}: the values were searched on another {label} than the "
                              f"one there now: run `dpclip tune` again")
    return dict(entry["values"])
