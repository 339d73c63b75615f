"""Model architectures with named layers.

Every parameterised module has a stable name (``fc1``, ``conv1``, ``head``...), so per-layer
probes, per-layer gradient groups and intermediate-representation attacks all address layers by
the same names. No BatchNorm: per-sample gradients need layers whose output for one record does
not depend on the other records of the batch.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn

from dpclip.errors import DpclipError


def _mlp_layers(in_features: int, hidden: list[int], n_classes: int) -> OrderedDict:
    layers: OrderedDict[str, nn.Module] = OrderedDict(flatten=nn.Flatten())
    width = in_features
    for i, h in enumerate(hidden, start=1):
        layers[f"fc{i}"] = nn.Linear(width, h)
        layers[f"act{i}"] = nn.ReLU()
        width = h
    layers["head"] = nn.Linear(width, n_classes)
    return layers


def build_model(name: str, feature_shape: tuple[int, ...], n_classes: int,
                hidden: list[int]) -> nn.Sequential:
    """``mlp``: Flatten -> [Linear -> ReLU] * len(hidden) -> Linear head.

    ``cnn`` (images C x H x W): conv1 (16 ch, 3x3) -> ReLU -> 2x2 max-pool -> conv2 (32 ch, 3x3)
    -> ReLU -> 2x2 max-pool (skipped when the map is already smaller than 4x4) -> the MLP above
    on the flattened map.
    """
    if name not in MODELS:
        return _users_model(name, tuple(feature_shape), n_classes)
    in_features = int(torch.tensor(feature_shape).prod())
    if name == "mlp":
        return nn.Sequential(_mlp_layers(in_features, hidden, n_classes))
    if name == "cnn":
        if len(feature_shape) != 3:
            raise DpclipError(f"train.model: 'cnn' needs image data (C x H x W), this dataset "
                              f"has feature shape {feature_shape}")
        channels, height, width = feature_shape
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        for i, out_ch in enumerate((16, 32), start=1):
            layers[f"conv{i}"] = nn.Conv2d(channels, out_ch, kernel_size=3, padding=1)
            layers[f"cact{i}"] = nn.ReLU()
            if min(height, width) >= 4:
                layers[f"pool{i}"] = nn.MaxPool2d(2)
                height, width = height // 2, width // 2
            channels = out_ch
        body = _mlp_layers(channels * height * width, hidden, n_classes)
        layers.update(body)
        return nn.Sequential(layers)
    if name == "paper_cnn":
        return _paper_cnn(feature_shape, n_classes, hidden)
    if name == "resnet":
        return _resnet(feature_shape, n_classes, hidden)
    raise DpclipError(f"train.model: {name!r} is not one of {list(MODELS)}")


MODELS = ("mlp", "cnn", "paper_cnn", "resnet")


class ResidualBlock(nn.Module):
    """conv1 3x3 -> GroupNorm -> ReLU -> conv2 3x3 -> GroupNorm, plus the input (through a 1x1
    ``shortcut`` convolution and GroupNorm where the width or the stride changes), -> ReLU."""

    def __init__(self, in_ch: int, out_ch: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)
        self.norm1 = _group_norm(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1, bias=False)
        self.norm2 = _group_norm(out_ch)
        self.shortcut = nn.Sequential() if stride == 1 and in_ch == out_ch else nn.Sequential(
            OrderedDict(conv=nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False),
                        norm=_group_norm(out_ch)))

    def forward(self, x):
        h = torch.relu(self.norm1(self.conv1(x)))
        return torch.relu(self.norm2(self.conv2(h)) + self.shortcut(x))


def _group_norm(channels: int) -> nn.GroupNorm:
    """GroupNorm with groups of 4 channels (at most 16 groups), in place of the batch norm of
    non-private ResNets, whose output for one record depends on the others of its batch."""
    return nn.GroupNorm(min(16, channels // 4), channels)


def _resnet(feature_shape: tuple[int, ...], n_classes: int, hidden: list[int]) -> nn.Sequential:
    """A ResNet of the kind DP image classifiers use on CIFAR-10 (He et al. 2016's CIFAR
    ResNet, batch norm replaced by GroupNorm as in Klause et al. 2022 and De et al. 2022):
    stem conv 3x3 16 ch -> GroupNorm -> ReLU, three stages of one :class:`ResidualBlock`
    (16, 32 and 64 channels, the last two at stride 2), global average pooling, then the MLP
    (``hidden: []`` gives the linear head alone). On 3x32x32 inputs with ``hidden: []`` and 10
    classes, 78,042 parameters."""
    if len(feature_shape) != 3 or min(feature_shape[1:]) < 8:
        raise DpclipError(f"train.model: 'resnet' needs images of at least 8x8 pixels "
                          f"(C x H x W), this dataset has feature shape {feature_shape}")
    layers: OrderedDict[str, nn.Module] = OrderedDict(
        stem=nn.Conv2d(feature_shape[0], 16, 3, padding=1, bias=False),
        stem_norm=_group_norm(16), stem_act=nn.ReLU())
    channels = 16
    for i, (width, stride) in enumerate(((16, 1), (32, 2), (64, 2)), start=1):
        layers[f"stage{i}"] = ResidualBlock(channels, width, stride)
        channels = width
    layers["pool"] = nn.AdaptiveAvgPool2d(1)
    layers.update(_mlp_layers(channels, hidden, n_classes))
    return nn.Sequential(layers)


def _paper_cnn(feature_shape: tuple[int, ...], n_classes: int, hidden: list[int]) -> nn.Sequential:
    """The DP MNIST CNN of the literature (Papernot et al. 2021, Tramer & Boneh 2021; Opacus's
    MNIST example, whose published DP-SGD accuracy is our external check): two conv blocks,
    conv1 16 ch 8x8 stride 2 padding 3 -> ReLU -> 2x2 max-pool stride 1 -> conv2 32 ch 4x4
    stride 2 -> ReLU -> 2x2 max-pool stride 1, then the MLP (``hidden: [32]`` gives its two fully
    connected layers). On 28x28 inputs the maps are 14 -> 13 -> 5 -> 4; 26,010 parameters."""
    if len(feature_shape) != 3 or min(feature_shape[1:]) < 16:
        raise DpclipError(f"train.model: 'paper_cnn' needs images of at least 16x16 pixels "
                          f"(C x H x W), this dataset has feature shape {feature_shape}")
    channels, height, width = feature_shape
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    for i, (out_ch, kernel, padding) in enumerate(((16, 8, 3), (32, 4, 0)), start=1):
        layers[f"conv{i}"] = nn.Conv2d(channels, out_ch, kernel_size=kernel, stride=2,
                                       padding=padding)
        layers[f"cact{i}"] = nn.ReLU()
        layers[f"pool{i}"] = nn.MaxPool2d(2, stride=1)
        height = (height + 2 * padding - kernel) // 2 + 1 - 1
        width = (width + 2 * padding - kernel) // 2 + 1 - 1
        channels = out_ch
    layers.update(_mlp_layers(channels * height * width, hidden, n_classes))
    return nn.Sequential(layers)


def own_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The parameters a module holds itself, less any it registers again under a name of its
    own while one of its submodules holds it (Opacus's DPLSTM names its cells' weights as
    nn.LSTM does): those belong to the submodule, whose calls use them."""
    below = {id(p) for child in module.children() for p in child.parameters()}
    return [p for p in module.parameters(recurse=False) if id(p) not in below]


def parameterised_layers(model: nn.Module) -> list[str]:
    """Names of modules that own parameters directly (weight and bias together), in order."""
    return [name for name, module in model.named_modules() if name and own_parameters(module)]


def as_model_input(x, device=None) -> torch.Tensor:
    """Records as a model takes them: integer features (token ids for an Embedding) as int64,
    every other kind, bytes (uint8 pixels) included, as float32."""
    kind = torch.as_tensor(x[:0]).dtype
    integer = not kind.is_floating_point and kind not in (torch.uint8, torch.bool)
    return torch.as_tensor(x, dtype=torch.int64 if integer else torch.float32, device=device)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def layer_names(name: str, hidden: list[int], feature_shape: tuple | None = None,
                n_classes: int = 2) -> list[str] | None:
    """The parameterised layer names a model will have: a built-in model's do not depend on
    the data; a model of the user's own is built for ``feature_shape`` (None without it)."""
    if name not in MODELS:
        if feature_shape is None:
            return None
        return parameterised_layers(build_model(name, tuple(feature_shape), n_classes, []))
    shape = {"cnn": (1, 8, 8), "paper_cnn": (1, 28, 28), "resnet": (3, 8, 8)}.get(name, (4,))
    return parameterised_layers(build_model(name, shape, 2, list(hidden)))


def last_hidden_linear(model: nn.Module) -> str | None:
    """The name of the model's last ``nn.Linear`` before its output layer (the last one)."""
    linears = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    return linears[-2] if len(linears) >= 2 else None


def model_file(name: str) -> Path | None:
    """The file of a ``train.model`` of the user's own (``path/to/file.py:factory``, relative
    to the project root, or ``package.module:factory``); None for a built-in model."""
    if name in MODELS:
        return None
    where = name.rpartition(":")[0]
    if where.endswith(".py"):
        return Path(where)
    spec = importlib.util.find_spec(where)
    if spec is None or spec.origin is None:
        raise DpclipError(f"train.model: {name!r}: no module {where!r} can be imported")
    return Path(spec.origin)


def _module_of_file(path: Path):
    """The module a model file defines, imported once per process under a name of its own
    (the file's stem and a hash of its resolved path: two ``net.py`` never share one), and
    registered, so that its classes pickle; its folder is on ``sys.path`` while it runs, so
    that it may import the files beside it."""
    resolved = path.resolve()
    name = f"dpclip_model_{resolved.stem}_{hashlib.sha256(str(resolved).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, resolved)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(resolved.parent))
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        sys.path.remove(str(resolved.parent))
    return module


def _users_model(name: str, feature_shape: tuple, n_classes: int) -> nn.Module:
    """``factory(feature_shape, n_classes)`` of the file or module ``train.model`` names."""
    where, _, factory = name.rpartition(":")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise DpclipError(f"train.model: {name!r}: {where} is not a file (paths are "
                              f"relative to the project root)")
        module = _module_of_file(path)
    else:
        module = importlib.import_module(where)
    build = getattr(module, factory, None)
    if not callable(build):
        raise DpclipError(f"train.model: {name!r}: {where} has no function {factory!r}")
    try:
        model = build(feature_shape, n_classes)
    except Exception as exc:  # the user's code: any error, named with what it was given
        raise DpclipError(f"train.model: {name!r}: {factory}(feature_shape={feature_shape}, "
                          f"n_classes={n_classes}) failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, nn.Module):
        raise DpclipError(f"train.model: {name!r}: {factory}(feature_shape, n_classes) "
                          f"returned {type(model).__name__}, not a torch.nn.Module")
    return model


def per_record_std(z: torch.Tensor) -> float:
    """Mean over records (rows) of each record's standard deviation over its units."""
    if z.shape[1] < 2:
        return 0.0
    return float(z.detach().std(dim=1).mean())


@torch.no_grad()
def logits_of(model: nn.Module, x, batch: int = 512):
    """The model's logits on the records ``x`` (a float array), as a numpy array, in batches
    whose activations stay in the CPU's caches."""
    model = model.eval()
    return torch.cat([model(torch.as_tensor(x[i:i + batch], dtype=torch.float32))
                      for i in range(0, len(x), batch)]).numpy()
