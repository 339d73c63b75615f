"""Privacy accounting: Opacus accountants, target epsilon -> noise, the sigma split, the guard,
and the odometer of early-stopped runs. Every DP step is accounted as one sampled Gaussian
mechanism with (sigma_eff, q), extra Gaussian queries on the same batch included
(docs/privacy.md, "Extra noisy queries: the sigma split").
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dpclip.errors import DpclipError
from dpclip.files import write_json

ACCOUNTANTS = ("rdp", "prv")


def _accountant_classes() -> dict:
    # Opacus is imported where it is used: importing it loads about a second of modules (its
    # privacy engine, optimizers, distributed tensors), which every pipeline process would pay
    from opacus.accountants import PRVAccountant, RDPAccountant

    return {"rdp": RDPAccountant, "prv": PRVAccountant}


def _rdp_orders() -> list[float]:
    from opacus.accountants import RDPAccountant

    return RDPAccountant.DEFAULT_ALPHAS


@dataclass(frozen=True)
class ExtraQuery:
    """A Gaussian query released on the same batch: L2 sensitivity and noise std."""

    name: str
    sensitivity: float
    noise_std: float
    option: str = ""  # the params.yaml key that sets this noise, for error messages


def combined_sigma(sigma_train: float, extras: list[ExtraQuery]) -> float:
    """sigma_eff of one step that releases the noisy gradient sum and ``extras``."""
    precision = sigma_train ** -2 + sum((q.sensitivity / q.noise_std) ** 2 for q in extras)
    return precision ** -0.5


def split_sigma(sigma_eff: float, extras: list[ExtraQuery]) -> float:
    """The gradient noise multiplier sigma_T left after the extra queries take their share."""
    extra_precision = sum((q.sensitivity / q.noise_std) ** 2 for q in extras)
    remaining = sigma_eff ** -2 - extra_precision
    if remaining <= 0:
        worst = min(extras, key=lambda q: q.noise_std / q.sensitivity)
        where = f"{worst.option}: " if worst.option else ""
        raise DpclipError(
            f"{where}noise of extra query {worst.name!r} (std/sensitivity = "
            f"{worst.noise_std / worst.sensitivity:g}) is too small: the step's overall noise "
            f"multiplier is {sigma_eff:g}, and each extra query needs std/sensitivity above it "
            f"with room left for the gradient")
    return remaining ** -0.5


def make_accountant(kind: str):
    if kind not in ACCOUNTANTS:
        raise DpclipError(f"privacy.accountant: {kind!r} is not one of {list(ACCOUNTANTS)}")
    return _accountant_classes()[kind]()


@functools.lru_cache(maxsize=256)
def _rdp_per_step(sigma: float, q: float) -> np.ndarray:
    """RDP of one sampled-Gaussian step at Opacus's default orders (RDP adds over steps)."""
    from opacus.accountants.analysis import rdp as rdp_analysis

    return np.asarray(rdp_analysis.compute_rdp(q=q, noise_multiplier=sigma, steps=1,
                                               orders=_rdp_orders()))


def epsilon_of(kind: str, history: list[tuple[float, float, int]], delta: float) -> float:
    """Epsilon of a composition given as Opacus history entries (sigma, q, steps).

    RDP: the same sum of per-entry RDP curves and the same conversion that
    ``RDPAccountant.get_epsilon`` computes, with each entry's one-step curve cached (RDP is
    linear in the number of identical steps), so a per-step trace stays cheap.
    PRV: ``PRVAccountant`` on the history as given.
    """
    history = [entry for entry in history if entry[2] > 0]
    if not history:
        return 0.0
    if kind == "rdp":
        from opacus.accountants.analysis import rdp as rdp_analysis

        rdp = sum(steps * _rdp_per_step(sigma, q) for sigma, q, steps in history)
        eps, _ = rdp_analysis.get_privacy_spent(orders=_rdp_orders(), rdp=rdp, delta=delta)
        return float(eps)
    accountant = make_accountant(kind)
    accountant.history = history
    return float(accountant.get_epsilon(delta=delta))


# Orders of the early-stopping odometer: a fixed grid, since the union bound over orders costs
# log(len) in the conversion; 30 orders cover the optima of every budget this tool plans.
ODOMETER_ORDERS = (1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0, 12.0,
                   14.0, 16.0, 20.0, 24.0, 28.0, 32.0, 40.0, 48.0, 56.0, 64.0, 80.0, 96.0,
                   128.0, 160.0, 192.0, 256.0)


def stopped_epsilon(history: list[tuple[float, float, int]], delta: float) -> float:
    """Epsilon of a run that stopped at a data-dependent time: the RDP privacy odometer
    min_a rho_tau(a) + log(|A| / delta) / (a - 1) over the orders A = :data:`ODOMETER_ORDERS`
    (Ville's inequality per order, a union bound over them; Whitehouse et al., ICML 2023),
    larger than the fixed-horizon epsilon of tau steps (docs/privacy.md, "Early-stopped runs").
    """
    history = [entry for entry in history if entry[2] > 0]
    if not history:
        return 0.0
    from opacus.accountants.analysis import rdp as rdp_analysis

    orders = np.asarray(ODOMETER_ORDERS)
    rdp = sum(steps * np.asarray(rdp_analysis.compute_rdp(q=q, noise_multiplier=sigma, steps=1,
                                                          orders=orders))
              for sigma, q, steps in history)
    return float(np.min(rdp + np.log(len(orders) / delta) / (orders - 1)))


def early_stop_privacy(planned_epsilon: float, odometer_epsilon: float) -> dict:
    """The privacy keys of a run that early stopping ended.

    Two bounds hold: the planned run's epsilon (the stopped run is post-processing of the
    planned one) and the odometer's (:func:`stopped_epsilon`). The smaller is reported, and the
    budget saved is measured against the planned run.
    """
    epsilon = min(planned_epsilon, odometer_epsilon)
    return {"epsilon": epsilon, "epsilon_planned": planned_epsilon,
            "epsilon_saved": planned_epsilon - epsilon,
            "epsilon_bound": "odometer" if odometer_epsilon < planned_epsilon else "planned"}


@functools.lru_cache(maxsize=64)
def noise_for_epsilon(target_epsilon: float, delta: float, sample_rate: float, steps: int,
                      kind: str, tolerance: float = 0.01) -> float:
    """Smallest-found sigma whose epsilon after ``steps`` is <= target and within ``tolerance``
    of it (Opacus's binary search), remembered in this process and in a memo file
    (:func:`noise_memo_path`). A remembered sigma is taken only when the accountant confirms
    both properties: a stale or edited memo costs a search, never a weaker guarantee
    (docs/privacy.md, "The noise multiplier and the budget guard").
    """
    from opacus.accountants.utils import get_noise_multiplier

    key = _memo_key(target_epsilon, delta, sample_rate, steps, kind, tolerance)
    remembered = _read_memo().get(key)
    if isinstance(remembered, float) and remembered > 0 and \
            _search_would_stop_at(remembered, target_epsilon, delta, sample_rate, steps, kind,
                                  tolerance):
        return remembered
    try:
        sigma = float(get_noise_multiplier(target_epsilon=target_epsilon, target_delta=delta,
                                           sample_rate=sample_rate, steps=steps,
                                           accountant=kind, epsilon_tolerance=tolerance))
    except ValueError as exc:
        raise DpclipError(f"privacy.target_epsilons: {target_epsilon!r} cannot be reached with "
                          f"delta={delta:g}, q={sample_rate:g}, {steps} steps: {exc}") from exc
    _remember(key, sigma)
    return sigma


def noise_memo_path() -> Path:
    """``noise_multipliers.json`` in ``$DPCLIP_CACHE``, else in ``$XDG_CACHE_HOME/dpclip``
    (``~/.cache/dpclip``)."""
    folder = os.environ.get("DPCLIP_CACHE") or \
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dpclip"
    return Path(folder) / "noise_multipliers.json"


def _memo_key(target_epsilon, delta, sample_rate, steps, kind, tolerance) -> str:
    """The search's arguments and the versions of the libraries it computes with (a sigma
    searched with others could differ in its last bits and would change results)."""
    import scipy
    from opacus import __version__ as opacus_version

    return (f"{kind} eps={target_epsilon!r} delta={delta!r} q={sample_rate!r} steps={steps} "
            f"tolerance={tolerance!r} opacus={opacus_version} numpy={np.__version__} "
            f"scipy={scipy.__version__}")


def _search_would_stop_at(sigma: float, target_epsilon: float, delta: float,
                          sample_rate: float, steps: int, kind: str, tolerance: float) -> bool:
    """Whether ``sigma`` has what Opacus's search ends on: epsilon <= target, within
    ``tolerance`` of it."""
    accountant = make_accountant(kind)
    accountant.history = [(sigma, sample_rate, steps)]
    epsilon = float(accountant.get_epsilon(delta=delta))
    return epsilon <= target_epsilon and target_epsilon - epsilon <= tolerance


def _read_memo() -> dict:
    try:
        memo = json.loads(noise_memo_path().read_text())
    except (OSError, ValueError):  # none yet, unreadable or half-written: search
        return {}
    return memo if isinstance(memo, dict) else {}


def _remember(key: str, sigma: float) -> None:
    """Add one entry, replacing the file whole (workers side by side may write at once: an
    entry lost to the race is searched again). A folder that cannot be written is no error."""
    try:
        write_json(noise_memo_path(), {**_read_memo(), key: sigma})
    except OSError:
        pass


@dataclass
class BudgetGuard:
    """Tracks the accountant's history and refuses a step that would pass the target epsilon.
    :meth:`allows`: whether one more step with (sigma, q) keeps epsilon <= target; a whole
    ``horizon`` of identical steps that fits is approved at once (docs/privacy.md).
    """

    kind: str
    delta: float
    target_epsilon: float | None  # None: no DP accounting (non-private runs)
    history: list[tuple[float, float, int]] = field(default_factory=list)
    _approved: tuple[tuple[float, float], int] = field(default=((0.0, 0.0), 0), repr=False)

    @property
    def steps(self) -> int:
        return sum(entry[2] for entry in self.history)

    def _extended(self, sigma: float, q: float, n: int = 1) -> list[tuple[float, float, int]]:
        history = list(self.history)
        if history and history[-1][0] == sigma and history[-1][1] == q:
            history[-1] = (sigma, q, history[-1][2] + n)
        else:
            history.append((sigma, q, n))
        return history

    def epsilon(self) -> float | None:
        if self.target_epsilon is None:
            return None
        return epsilon_of(self.kind, self.history, self.delta)

    def allows(self, sigma: float, q: float, horizon: int = 1) -> bool:
        if self.target_epsilon is None:
            return True
        key, left = self._approved
        if key == (sigma, q) and left > 0:
            return True
        for n in dict.fromkeys((max(1, horizon), 1)):
            if epsilon_of(self.kind, self._extended(sigma, q, n), self.delta) \
                    <= self.target_epsilon:
                self._approved = ((sigma, q), n)
                return True
        return False

    def record(self, sigma: float, q: float) -> None:
        if self.target_epsilon is None:
            return
        self.history = self._extended(sigma, q)
        key, left = self._approved
        self._approved = (key, left - 1) if key == (sigma, q) else ((0.0, 0.0), 0)
