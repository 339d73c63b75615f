"""The ``sanitize`` run kind (the method, the mechanism and its accounting:
:mod:`dpclip.methods.sanitize`): epochs of shuffled batches through the sanitization layer,
then after each one the epsilon so far, the adaptive C and the early-stopping rule
(docs/methods.md, "`sanitize`: private features, public labels", "The run").
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import torch

from dpclip.errors import DpclipError
from dpclip.methods.sanitize import (ClassMeans, SanitizationLayer, funnel_widths,
                                     noise_for_record_epsilon, record_epsilon, with_sanitizer)
from dpclip.privacy import early_stop_privacy, stopped_epsilon
from dpclip.pretraining import accuracy_on, held_out_check, pretrain
from dpclip.train.runs.base import Run, register_run_kind
from dpclip.train.setup import RunSetup, make_optimizer
from dpclip.train.book_keeping import LayerGroups
from dpclip.train.step import plain_step


@register_run_kind
class SanitizeRun(Run):
    kind = "sanitize"

    @classmethod
    def model_hidden(cls, options, hidden) -> list[int]:
        return funnel_widths(int(options.n))

    @classmethod
    def needs_public_data(cls, options) -> bool:
        return options.encoder == "frozen"

    @classmethod
    def rebuild_for_evaluation(cls, model, architecture: dict):
        """The sanitization layer as clip-only (no noise) at evaluation."""
        sanitizer = architecture["sanitizer"]
        return with_sanitizer(model, sanitizer["after"], SanitizationLayer(sanitizer["clip"]))

    @classmethod
    def plan(cls, n_records: int, cfg, options) -> tuple[float, int, int]:
        """Shuffled batches of the method's own size and its own epochs: every record is in
        every epoch (q = 1), one batch at a time."""
        batch = min(options.batch_size or cfg.train.batch_size, n_records)
        steps_per_epoch = math.ceil(n_records / batch)
        return 1.0, steps_per_epoch, options.epochs * steps_per_epoch

    def __init__(self, setup: RunSetup):
        method, n_records = setup.method, setup.n_records
        opts = method.options
        cfg = setup.cfg.with_train(epochs=opts.epochs,  # the method's own epochs and batch
                                   batch_size=opts.batch_size or setup.cfg.train.batch_size)
        # the paper's accounting: one Poisson-subsampled use per step (not what the run gives)
        paper = opts.accounting == "paper"
        self.sample_rate = min(cfg.train.batch_size, n_records) / n_records if paper else 1.0
        self.uses_per_epoch = setup.steps_per_epoch if paper else 1
        self.sigma = noise_for_record_epsilon(cfg.target_epsilon, cfg.privacy.delta,
                                              cfg.train.epochs * self.uses_per_epoch,
                                              cfg.privacy.epsilon_tolerance, self.sample_rate)
        self.sanitizer = SanitizationLayer(method.clip_threshold, opts.drop_p, self.sigma)
        self.after = f"act{len(setup.hidden)}"  # the n-wide layer's ReLU
        self.san_layer = f"fc{len(setup.hidden)}"
        model = with_sanitizer(setup.model, self.after, self.sanitizer)
        super().__init__(dataclasses.replace(setup, model=model, groups=LayerGroups.of(model),
                                             cfg=cfg))
        self.hidden = list(setup.hidden)
        self.epoch_stds: list[float] = []  # this epoch's batch means of sanitized stds
        self.public_pretrain_s = 0.0
        self.public_fit: dict = {}
        self.class_means: ClassMeans | None = None  # head_fit class_means (frozen encoder)
        self.encoded: torch.Tensor | None = None  # the frozen encoder's output, per record
        self.public_check = None  # frozen: public holdout records that choose the head
        if opts.encoder == "frozen":
            tic = time.perf_counter()
            self._pretrain_and_freeze(setup.public)
            self.public_pretrain_s = round(time.perf_counter() - tic, 4)
        else:
            self.optimizer = make_optimizer(self._private_cfg(), self.model.parameters())
        self._adapt_clip()

    def watch_public(self, public) -> None:
        """Nothing to watch: the series is the released sanitized outputs' std."""

    def _private_cfg(self):
        """train.* with the method's learning rate (and optimizer, unless ``train``) for the
        layers trained on private data."""
        optimizer = self.method.options.optimizer
        return self.cfg.with_train(lr=self.method.options.head_lr, **(
            {} if optimizer == "train" else {"optimizer": optimizer}))

    # --- frozen encoder --------------------------------------------------------------------
    def _pretrain_and_freeze(self, public) -> None:
        """Train the whole funnel on public data (no noise, clip-only sanitizer), then freeze
        all but the head. Adam: plain SGD at a fixed rate often kills the narrow funnel's
        ReLUs (digits, lr 0.1 to 0.5: holdout accuracy 0.41 to 0.93 by the clip range)."""
        if public is None or len(public[0]) == 0:
            raise DpclipError("methods.sanitize.encoder: 'frozen' trains the encoder on the "
                              "public shadow split, which is empty (data.split.shadow_train)")
        self.public_fit = pretrain(self.model, self.loss_fn, public, self.method.options,
                                   min(self.cfg.train.batch_size, len(public[0])),
                                   self.rng.sampling, self.device)
        self.public_head = {k: v.detach().clone() for k, v in self.model.head.state_dict().items()}
        self.public_check = held_out_check(public, self.device, "choose")
        for name, param in self.model.named_parameters():
            param.requires_grad_(name.startswith("head."))
        self.optimizer = make_optimizer(self._private_cfg(), [p for p in self.model.parameters()
                                                              if p.requires_grad])
        if self.method.options.head_fit == "class_means":
            self.class_means = ClassMeans(self.model.head, 1.0 - self.method.options.drop_p)

    # --- training --------------------------------------------------------------------------
    def run_epoch(self, x, y, epoch: int, bar) -> bool:
        n, b = len(x), min(self.cfg.train.batch_size, len(x))
        order = torch.randperm(n, generator=self.rng.sampling).to(self.device)
        if self.class_means is not None and self.encoded is None:
            self.encoded = self._encode(x)
        self.sanitizer.noisy, self.sanitizer.generator = True, self.rng.noise
        self.epoch_stds = []
        try:
            for k in range(self.steps_per_epoch):
                idx = order[k * b:(k + 1) * b]
                tic = time.perf_counter()
                if self.class_means is not None:
                    loss = self.class_means.step(self.sanitizer, self.encoded[idx], y[idx],
                                                 self.loss_fn)
                else:
                    loss = plain_step(self.model, self.loss_fn, x[idx], y[idx], self.optimizer)
                self.clock_step(tic)
                self.epoch_stds.append(self.sanitizer.last_std)
                step = len(self.trace) + 1
                self.trace.append({"step": step, "epoch": epoch, "batch_size": len(idx),
                                   "clip_threshold": self.sanitizer.clip, "train_loss": loss,
                                   "epsilon_spent": math.nan})
                self.advance(bar, step, epoch=epoch, loss=f"{loss:.3f}",
                             C=f"{self.sanitizer.clip:.3g}")
        finally:
            self.sanitizer.noisy, self.sanitizer.generator = False, None
        return True

    def finish(self) -> None:
        """``keep_public_head``: release the better of the private head and the public
        pre-training's head, by accuracy on the public holdout split (public data only)."""
        keep = self.method.options.keep_public_head  # as chosen for the setting (auto resolved)
        keep = keep if isinstance(keep, bool) else True  # a run built outside the pipeline
        self.public_fit["keep_public_head"] = keep
        if self.public_check is None or not keep:
            return
        private_head = {k: v.detach().clone() for k, v in self.model.head.state_dict().items()}
        private = accuracy_on(self.model, self.public_check)
        self.model.head.load_state_dict(self.public_head)
        public = accuracy_on(self.model, self.public_check)
        kept = "public" if public > private else "private"
        if kept == "private":
            self.model.head.load_state_dict(private_head)
        self.public_fit.update(head_kept=kept, private_head_public_accuracy=private,
                               public_head_public_accuracy=public)

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        """The frozen encoder's output for every record, computed once: it is deterministic,
        so each epoch only draws new masks and noise on it."""
        encoder = self.model[:list(dict(self.model.named_children())).index("sanitizer")]
        b = max(self.cfg.train.batch_size, 1024)
        with torch.no_grad():
            return torch.cat([encoder(x[k:k + b]) for k in range(0, len(x), b)])

    def epoch_std(self) -> float:
        """The watched series is the sanitized outputs' std (released; paper Alg. 2 and 4)."""
        return float(np.mean(self.epoch_stds))

    def end_epoch(self, epoch: int) -> bool:
        """Epsilon so far, the adaptive C, then the early-stopping rule."""
        self.trace[-1]["epsilon_spent"] = self._epsilon(epoch)
        self._adapt_clip()
        return super().end_epoch(epoch)

    def _epsilon(self, epochs: int) -> float:
        return record_epsilon(self.sigma, epochs * self.uses_per_epoch, self.cfg.privacy.delta,
                              self.sample_rate)

    def _adapt_clip(self) -> None:
        if self.method.options.adaptive:
            weight = dict(self.model.named_modules())[self.san_layer].weight.detach()
            self.method.clip_threshold = self.method.options.t * float(weight.norm())
        self.sanitizer.clip = self.method.clip_threshold

    # --- records ---------------------------------------------------------------------------
    def epochs_run(self) -> int:
        return self.stopped_epoch or (len(self.trace) // self.steps_per_epoch)

    def privacy_record(self) -> dict:
        epochs, planned = self.epochs_run(), self.cfg.train.epochs
        epsilon = self._epsilon(epochs)
        paper = self.method.options.accounting == "paper"
        record = {"dp_guarantee": bool(self.method.claim.dp_guarantee),
                  "accountant": "rdp-poisson-as-the-paper" if paper else "rdp-per-record",
                  "target_epsilon": self.cfg.target_epsilon,
                  "epsilon": epsilon, "delta": self.cfg.privacy.delta,
                  "sample_rate": self.sample_rate,
                  "noise_multiplier": self.sigma, "steps": len(self.trace),
                  "releases_per_record": epochs, "epsilon_bound": "fixed_horizon",
                  **self.randomness_record(),
                  "epsilon_covers": "the model (frozen public encoder, head on sanitized "
                                    "activations)" if self.method.claim.dp_guarantee else
                                    "the sanitized activations only (joint encoder)"}
        if paper:  # what the releases give without the claimed amplification
            record["epsilon_of_the_releases"] = record_epsilon(self.sigma, epochs,
                                                               self.cfg.privacy.delta)
            record["epsilon_covers"] = ("nothing the run gives: the paper's accounting claims "
                                        "Poisson amplification for shuffled batches, "
                                        + ("and the encoder sees raw features"
                                           if self.method.options.encoder == "joint" else
                                           "with a public encoder"))
        if self.stopped_epoch is not None:
            record.update(early_stop_privacy(
                self._epsilon(planned),
                stopped_epsilon([(self.sigma, self.sample_rate, epochs * self.uses_per_epoch)],
                                self.cfg.privacy.delta)))
        return record

    def training_extras(self) -> dict:
        return {"encoder": self.method.options.encoder, **self.public_fit,
                **super().training_extras()}

    def timing_extras(self) -> dict:
        return {"public_pretrain_s": self.public_pretrain_s, **super().timing_extras()}

    def architecture(self) -> dict:
        return {"hidden": self.hidden,
                "sanitizer": {"after": self.after, "clip": self.sanitizer.clip}}

    def state_dict(self) -> dict:
        state = super().state_dict()
        if self.class_means is not None:
            state["class_means"] = self.class_means.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if self.class_means is not None:
            self.class_means.load_state_dict(state["class_means"])
        self._adapt_clip()
