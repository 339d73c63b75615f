"""Run identity: (method, target epsilon, alpha, seed) -> a file-safe name (the metrics
contract), spelled the way YAML and DVC's ``${item.*}`` interpolation write the values."""

from __future__ import annotations

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
