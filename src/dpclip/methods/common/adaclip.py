"""The options of quantile-based adaptive clipping (Andrew et al. 2021), shared by ``adaclip``
and ``adaclip_opacus`` (each reads its own section ``methods.<name>``)."""

from __future__ import annotations

from dpclip.methods.base import Option, Tunable

ADACLIP_OPTIONS = {
    "target_quantile": Option(0.5, low=0.0, high=1.0, low_open=True, high_open=True,
                              help="gamma: the fraction of records left unclipped"),
    # The paper's eta_C = 0.2 is per federated round; applied every DP-SGD step it
    # overshoots (digits: C rose to 38 within 50 steps, accuracy 0.14); 0.05 tracks the
    # target quantile (accuracy 0.89).
    "clip_lr": Option(0.05, low=0.0, low_open=True, help="eta_C: geometric step of C"),
    "count_noise_fraction": Option(0.05, low=0.0, low_open=True,
                                   help="sigma_b / B (the paper suggests B / 20)"),
    "c_min": Option(0.01, low=0.0, low_open=True),
    "c_max": Option(100.0, low=0.0, low_open=True),
}

def check_clip_range(values, prefix: str) -> list[str]:
    """c_min must lie below c_max."""
    if values.c_min >= values.c_max:
        return [f"{prefix}.c_min: {values.c_min!r} must be below {prefix}.c_max "
                f"({values.c_max!r})"]
    return []

# dpclip tune: the quantile and the controller's step (train.clip_norm is C_0)
ADACLIP_TUNED = {"target_quantile": Tunable(0.1, 0.9), "clip_lr": Tunable(0.01, 0.5, log=True)}
