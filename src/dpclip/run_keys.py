"""Run identity: (method, target epsilon, alpha, seed) -> a file-safe name (the metrics
contract), spelled the way YAML and DVC's ``${item.*}`` interpolation write the values."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import yaml


def alpha_tag(alpha) -> str:
    """The partition's name in paths: 'iid', or the concentration as written ('0.5')."""
    return str(alpha)

def parse_scalar(text: str):
    """Read a CLI value the way YAML (and DVC's ${...} interpolation) wrote it: '8' -> 8."""
    return yaml.safe_load(str(text))

def epsilon_tag(epsilon) -> str:
    return f"eps{epsilon}"

def run_name(method: str, epsilon, alpha, seed: int) -> str:
    """The run's identity, e.g. ``dp_sgd-eps8-iid-seed0`` (the metrics contract).

    Values are written as YAML wrote them (``target_epsilons: [8]`` gives ``eps8``), which is
    also how dvc.yaml's ${item.*} interpolation spells the output paths.
    """
    return f"{method}-{epsilon_tag(epsilon)}-{alpha_tag(alpha)}-seed{int(seed)}"


@dataclass(frozen=True)
class RunKey:
    """One configured run: (method, target epsilon, alpha, seed)."""

    method: str
    epsilon: object
    alpha: object
    seed: int

    @property
    def name(self) -> str:
        return run_name(self.method, self.epsilon, self.alpha, self.seed)


def configured_runs(params) -> list[RunKey]:
    """Every (method, target epsilon, alpha, seed) the parameters ask for, in the order of
    dvc.yaml's axes (``params``: :class:`dpclip.config.Params`)."""
    return [RunKey(m, e, a, s) for m, e, a, s in itertools.product(
        params.train.methods, params.privacy.target_epsilons, params.partition.alphas,
        params.train.seeds)]
