"""Training: the shared DP step and the loop around it."""

from dpclip.train.loop import (TrainConfig, TrainResult, build_run, plan_steps, resolve_device,
                               train_model)

__all__ = ["TrainConfig", "TrainResult", "build_run", "plan_steps", "resolve_device", "train_model"]
