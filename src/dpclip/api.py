"""Train your own model privately with any dpclip method: your model, optimizer and
DataLoader in, the trained model, its epsilon and its clip schedule out
(``train_private(model, optimizer, loader, method="ww_dp_sgd", target_epsilon=8.0)``). As with
Opacus's ``make_private``, the loader's sampler is replaced by Poisson sampling; the model is
checked against float64 autograd first, and the run is the pipeline's own
(:func:`dpclip.train.loop.train_model`). docs/python-api.md.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from dpclip.attacks.common.layer_risk import layer_risks as risk_of_layers
from dpclip.errors import DpclipError
from dpclip.methods import get_method
from dpclip.methods.base import Method
from dpclip.models import as_model_input, last_hidden_linear
from dpclip.train import TrainConfig, TrainResult, train_model
from dpclip.trace_columns import PRIVATE_DIAGNOSTICS
from dpclip.train.book_keeping import LayerGroups
from dpclip.train.runs import run_class


@dataclass
class PrivateResult(TrainResult):
    """:class:`~dpclip.train.TrainResult` (model, trace, privacy record, times) and the
    options the method ran with."""

    options: dict | None = None

    @property
    def epsilon(self) -> float | None:
        """The epsilon spent; None without a DP claim (no privacy, or a literal rule whose
        epsilon is no bound: ``privacy["dp_guarantee"]`` false)."""
        if not self.privacy.get("dp_guarantee", False):
            return None
        return self.privacy.get("epsilon")

    @property
    def clip_thresholds(self) -> list[float]:
        """C_t of every step."""
        return [row["clip_threshold"] for row in self.trace]

    @property
    def public_trace(self) -> list[dict]:
        """The trace without the columns computed from private batches without noise
        (``train_loss``, ``batch_size``): what may be shown beside the released model."""
        return [{k: v for k, v in row.items() if k not in PRIVATE_DIAGNOSTICS}
                for row in self.trace]


def train_private(model: nn.Module, optimizer: torch.optim.Optimizer,
                  data_loader: torch.utils.data.DataLoader, *, method: str = "dp_sgd",
                  target_epsilon: float = 8.0, delta: float = 1e-5, epochs: int = 1,
                  clip_norm: float = 1.0, options: dict | None = None, seed: int = 0,
                  accountant: str = "rdp", shadow_risk: dict | None = None,
                  device: str | None = None, secure_noise: bool = True,
                  progress: bool = False) -> PrivateResult:
    """Train ``model`` in place with ``method`` at ``target_epsilon`` (and ``delta``) for
    ``epochs`` passes in expectation over ``data_loader``'s dataset, in Poisson batches of its
    ``batch_size`` in expectation, stepping ``optimizer``. ``options``: ``methods.<method>`` of
    params.yaml; ``shadow_risk``: LM-DP-SGD's (:func:`layer_risks`); ``secure_noise``: noise from
    the OS's entropy (false: from ``seed``, reproducible, and the epsilon protects nothing);
    ``device``: the model's own by default. Every argument: docs/python-api.md."""
    method_cls = get_method(method)
    if not run_class(method_cls.run_kind).takes_users_model:
        raise DpclipError(f"method: {method!r} cannot take a model of yours: its run "
                          f"({method_cls.run_kind!r}) builds or wraps the model itself; run it "
                          f"through the pipeline with a built-in train.model")
    if method_cls.needs_shadow_risk and shadow_risk is None:
        raise DpclipError(f"shadow_risk: {method!r} weights each layer by its membership risk "
                          f"on public data: pass shadow_risk=layer_risks(model, public_loader, "
                          f"public_holdout_loader) (dpclip.api.layer_risks)")
    x, y = records_of(data_loader)
    n_classes = _classes(model, x)
    batch_size = getattr(data_loader, "batch_size", None)
    if not batch_size:
        raise DpclipError("data_loader: it has no batch_size (a batch_sampler of its own); "
                          "give DataLoader(dataset, batch_size=B): B is the expected batch "
                          "of the Poisson sampling that replaces its sampler")
    chosen = resolved_options(method_cls, model, options)
    if device is None:
        device = next((p.device.type for p in model.parameters()), "cpu")
    cfg = TrainConfig.of(method, float(target_epsilon) if method_cls.private else None, seed,
                         method_options=chosen, shadow_risk=shadow_risk, delta=delta,
                         accountant=accountant, epochs=epochs, batch_size=batch_size,
                         clip_norm=clip_norm, device=device, secure_noise=secure_noise,
                         threads=torch.get_num_threads())
    result = train_model(x, y, tuple(x.shape[1:]), n_classes, cfg, progress=progress,
                         desc=method, model=model, optimizer=optimizer)
    return PrivateResult(**vars(result), options=chosen)


def layer_risks(model: nn.Module, public_loader, public_holdout_loader, *, epochs: int = 30,
                lr: float = 0.5, seed: int = 0, classifier: str = "logistic",
                evaluation: str = "cv") -> dict:
    """LM-DP-SGD's ``shadow_risk`` for ``model``: a copy of it trained without privacy on the
    public records of ``public_loader`` (a shadow model; it never sees private data), then each
    layer's membership risk against ``public_holdout_loader``'s records and its share of the
    gradient norms (:func:`dpclip.attacks.common.layer_risk.layer_risks`). Public data only:
    it costs no privacy. ``model`` is not changed."""
    shadow = copy.deepcopy(model)
    for module in shadow.modules():  # a fresh start, as the private run's own model has
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    optimizer = torch.optim.SGD(shadow.parameters(), lr=lr)
    train_private(shadow, optimizer, public_loader, method="non_private", epochs=epochs,
                  seed=seed)
    x_in, y_in = records_of(public_loader)
    x_out, _ = records_of(public_holdout_loader)
    layers = risk_of_layers(shadow, x_in, y_in, x_out, classifier=classifier,
                            evaluation=evaluation, seed=seed)
    return {"needed": True, "layer_names": list(layers), "layers": layers,
            "risk_eval": evaluation, "classifier": classifier,
            "n_members": int(len(x_in)), "n_nonmembers": int(len(x_out))}


def records_of(data_loader) -> tuple[np.ndarray, np.ndarray]:
    """Every record of the loader's dataset, as (features, labels) arrays: the Poisson
    sampling draws from all of them."""
    dataset = getattr(data_loader, "dataset", data_loader)
    sampler = getattr(data_loader, "sampler", None)
    if sampler is not None and hasattr(sampler, "__len__") and len(sampler) != len(dataset):
        raise DpclipError(f"data_loader: its sampler draws from {len(sampler)} of the "
                          f"dataset's {len(dataset)} records; Poisson sampling draws from all "
                          f"of them: pass a dataset of the records to train on "
                          f"(torch.utils.data.Subset)")
    collate = getattr(data_loader, "collate_fn", torch.utils.data.default_collate)
    if collate is not torch.utils.data.default_collate:
        raise DpclipError("data_loader: it has a collate_fn of its own, which the Poisson "
                          "batches would not run; apply it to the dataset's records instead")
    if isinstance(dataset, torch.utils.data.TensorDataset) and len(dataset.tensors) == 2:
        x, y = dataset.tensors
    else:
        try:
            pairs = [dataset[i] for i in range(len(dataset))]
        except TypeError as exc:
            raise DpclipError("data_loader: its dataset must be indexable (a map-style "
                              "dataset of (features, label) pairs), so that each record can "
                              "join each step independently") from exc
        if not pairs:
            raise DpclipError("data_loader: its dataset is empty")
        x = torch.stack([torch.as_tensor(features) for features, _ in pairs])
        y = torch.as_tensor([int(label) for _, label in pairs])
    features = as_model_input(torch.as_tensor(x).detach().cpu())
    return features.numpy(), np.asarray(torch.as_tensor(y).detach().cpu())


def _classes(model: nn.Module, x: np.ndarray) -> int:
    """The number of classes the model predicts: its output's width on a record of zeros (no
    private record passes through the model outside the DP step)."""
    was_training = model.training
    where = next(model.parameters(), torch.zeros(()))
    with torch.no_grad():
        zeros = torch.zeros((1, *x.shape[1:]), dtype=where.dtype, device=where.device)
        out = model.eval()(zeros if np.issubdtype(x.dtype, np.floating) else zeros.long())
    model.train(was_training)
    if out.dim() != 2:
        raise DpclipError(f"model: its output has shape {tuple(out.shape)} for one record; "
                          f"the DP step needs one row of class logits per record")
    return int(out.shape[1])


def resolved_options(method_cls: type[Method], model: nn.Module, options: dict | None):
    """The method's options model from ``options``, checked against the model's layers;
    WW-DP-SGD's probe defaults to the model's last hidden Linear when it names none."""
    given = dict(options or {})
    names = LayerGroups.of(model).names
    if "probe" in given and not [n for n in str(given["probe"]).split(",") if n.strip()]:
        raise DpclipError(f"options: probe {given['probe']!r} names no layer (layers: {names})")
    if "probe" in method_cls.options_model().model_fields and "probe" not in given:
        default = method_cls.options_model().model_fields["probe"].default
        if default not in names:
            probe = last_hidden_linear(model)
            if probe is None:
                raise DpclipError(f"options: {method_cls.name} reads a hidden layer's weights "
                                  f"and the model has no nn.Linear before its output; name "
                                  f"one of its layers as options['probe'] (layers: {names})")
            given["probe"] = probe
    try:
        values = method_cls.parse_options(given)
    except Exception as exc:  # pydantic's ValidationError, in the option's own words
        raise DpclipError(f"options: {exc}") from exc
    problems = method_cls.check_options(values, "options", names)
    if problems:
        raise DpclipError("; ".join(problems))
    return values
