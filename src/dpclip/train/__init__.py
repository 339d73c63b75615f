"""Training: the shared DP step, the run kinds, and the entry point around them."""

from dpclip.train.loop import build_run, train_model
from dpclip.train.setup import (PublicData, TrainConfig, TrainResult, plan_steps,
                                resolve_device)

__all__ = ["PublicData", "TrainConfig", "TrainResult", "build_run", "plan_steps", "resolve_device", "train_model"]
