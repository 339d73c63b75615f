"""Each layer's membership risk on public data, as LM-DP-SGD weighs it: a model trained
without privacy on public members, a member / non-member classifier on each layer's
representations (its error rate ER^(l): 0.5 = no signal), and each layer's share of the
members' gradient norms. The shadow stage computes it for the pipeline's model, and
:func:`dpclip.api.layer_risks` for a model of the user's own."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from dpclip.attacks.common.layerwise import attack_every_layer
from dpclip.attacks.common.representations import layer_representations
from dpclip.models import as_model_input
from dpclip.train.book_keeping import LayerGroups
from dpclip.train.step import layer_norms_of


def layer_risks(model: nn.Module, x_in: np.ndarray, y_in: np.ndarray, x_out: np.ndarray, *,
                classifier: str = "logistic", evaluation: str = "cv", folds: int = 5,
                max_features: int = 512, max_records: int = 2000, seed: int = 0
                ) -> dict[str, dict]:
    """{layer: its attack's accuracy, AUC, error rate, features and ``norm_share``} of the
    trained (public, non-private) ``model`` on its members ``x_in, y_in`` against the
    non-members ``x_out``, in model order."""
    model = model.eval()
    layers = attack_every_layer(layer_representations(model, x_in, max_features),
                                layer_representations(model, x_out, max_features),
                                classifier=classifier, evaluation=evaluation, folds=folds,
                                max_records=max_records, seed=seed)
    # the layers the DP step clips (trainable ones), in the order layer_norms_of gives them
    for name, share in zip(LayerGroups.of(model).names, norm_shares(model, x_in, y_in)):
        layers[name]["norm_share"] = float(share)
    return layers


def norm_shares(model: nn.Module, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """mean_i n_i^(l) / n_i: each record's gradient split over the layers, averaged."""
    norms = layer_norms_of(model, nn.CrossEntropyLoss(reduction="none"),
                           as_model_input(x),
                           torch.as_tensor(y, dtype=torch.int64)).double()
    total = norms.pow(2).sum(dim=1, keepdim=True).sqrt()
    unit = torch.where(total > 0, norms / total.clamp_min(1e-300), torch.zeros_like(norms))
    return unit.mean(dim=0).numpy()
