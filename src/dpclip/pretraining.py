"""Pre-training on public data, without noise: the sound ``sanitize`` encoder's and the start of
any run with ``train.public_init`` (so a DP-SGD baseline gets the same public knowledge as a
method that uses public data).

Adam on the public shadow train split, stopped early on the public shadow holdout; it reads no
member, so it costs no privacy (the public-data assumption).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn



@dataclass(frozen=True)
class PublicPretraining:
    """How :func:`pretrain` runs; ``sanitize``'s options carry the same four names, so its
    validated options are passed as they are."""

    public_steps: int = 1000
    public_patience: int = 5
    public_check_every: int = 50
    public_lr: float = 0.003


PUBLIC_PRETRAINING = PublicPretraining()  # the defaults (train.public_init uses them)
# held-out public records checked during the pre-training (a fixed seeded subset)
HELD_OUT_CHECK = 2000


def held_out_check(public, device,
                   part: str = "stop") -> tuple[torch.Tensor, torch.Tensor] | None:
    """At most :data:`HELD_OUT_CHECK` records of one half of the public held-out split (a fixed
    seeded division), as tensors; None without one. ``stop``: the half that stops the
    pre-training (and keeps its best weights); ``choose``: the other half, which scores models
    after it (sanitize's head choice), so that choice is not biased towards the pre-training's
    own pick."""
    held = getattr(public, "held_out", None)
    if held is None or len(held[0]) < 2:
        return None
    pick = torch.randperm(len(held[0]), generator=torch.Generator().manual_seed(0))
    half = len(pick) // 2
    pick = (pick[:half] if part == "stop" else pick[half:])[:HELD_OUT_CHECK].numpy()
    return (torch.as_tensor(held[0][pick], dtype=torch.float32, device=device),
            torch.as_tensor(held[1][pick], dtype=torch.int64, device=device))


def accuracy_on(model: nn.Module, records: tuple[torch.Tensor, torch.Tensor]) -> float:
    with torch.no_grad():
        return float((model(records[0]).argmax(1) == records[1]).float().mean())


def pretrain(model: nn.Module, loss_fn, public, options: PublicPretraining, batch: int,
             generator: torch.Generator, device) -> dict:
    """Adam on the public train split for at most ``public_steps`` steps, in shuffled passes;
    with a public held-out split (``public.held_out``), its loss (on at most
    ``HELD_OUT_CHECK`` records) is checked every ``public_check_every`` steps and training stops
    after ``public_patience`` checks without improvement, keeping the best weights. Returns
    what happened, for the run's record."""
    x = torch.as_tensor(public[0], dtype=torch.float32, device=device)
    y = torch.as_tensor(public[1], dtype=torch.int64, device=device)
    held = held_out_check(public, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=options.public_lr)
    best, best_state, since_best, step = math.inf, None, 0, 0
    while step < options.public_steps and since_best < options.public_patience:
        order = torch.randperm(len(x), generator=generator).to(device)
        for k in range(math.ceil(len(x) / batch)):
            idx = order[k * batch:(k + 1) * batch]
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(x[idx]), y[idx]).mean().backward()
            optimizer.step()
            step += 1
            if held is not None and step % options.public_check_every == 0:
                with torch.no_grad():
                    held_loss = float(loss_fn(model(held[0]), held[1]).mean())
                if held_loss < best:
                    best, since_best = held_loss, 0
                    best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
                else:
                    since_best += 1
            if step >= options.public_steps or since_best >= options.public_patience:
                break
    if best_state is not None:
        model.load_state_dict(best_state)
    record = {"public_steps_run": step}
    if held is not None:
        with torch.no_grad():
            loss = float(loss_fn(model(held[0]), held[1]).mean())
        record.update(public_held_out_loss=loss,
                      public_held_out_accuracy=accuracy_on(model, held))
    return record
