"""Intermediate representations (IRs): the output of every parameterised layer, per record.

The IR of layer l is the output of its module (before the activation that follows it), for a
Linear layer a vector of its width. A convolutional map C x H x W is reduced deterministically
when it has more than ``max_features`` values: adaptive average pooling to g x g cells, with g
the largest integer such that C g^2 <= max_features (at least 1, i.e. the channel means), then
flattened channel-major. Fully connected outputs are kept whole.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from dpclip.models import parameterised_layers


def reduce_map(output: torch.Tensor, max_features: int) -> torch.Tensor:
    """(B, ...) -> (B, features) as the module docstring says."""
    if output.dim() <= 2:
        return output.reshape(len(output), -1)
    channels, spatial = output.shape[1], output.shape[2:]
    if math.prod(output.shape[1:]) <= max_features:
        return output.reshape(len(output), -1)
    cells = max(1, math.isqrt(max(max_features // channels, 1)))
    cells = min(cells, *spatial)
    pooled = nn.functional.adaptive_avg_pool2d(output, (cells, cells)) if len(spatial) == 2 \
        else output.mean(dim=tuple(range(2, output.dim())), keepdim=True)
    return pooled.reshape(len(output), -1)


@torch.no_grad()
def layer_representations(model: nn.Module, x: np.ndarray, max_features: int = 512,
                          batch: int = 512) -> dict[str, np.ndarray]:
    """{layer name: float32 array (records x features)} for every parameterised layer; a layer
    called several times in a forward pass (a recurrent cell at each time step) gives its
    calls' outputs side by side."""
    names = parameterised_layers(model)
    modules = dict(model.named_modules())
    calls: dict[str, list[torch.Tensor]] = {name: [] for name in names}
    parts: dict[str, list[np.ndarray]] = {name: [] for name in names}
    hooks = [modules[name].register_forward_hook(
        lambda _m, _inp, out, name=name: calls[name].append(
            reduce_map(out.detach().float(), max_features)))
        for name in names]
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(x), batch):
            model(torch.as_tensor(x[start:start + batch]))
            for name in names:
                if calls[name]:
                    parts[name].append(torch.cat(calls[name], dim=1).cpu().numpy())
                    calls[name].clear()
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    return {name: np.concatenate(chunks) if chunks else np.zeros((0, 0), np.float32)
            for name, chunks in parts.items()}
