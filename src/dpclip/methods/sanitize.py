"""``sanitize`` (papers/sanitization-layer_private-features-public-labels.txt): private
features, public labels. Noise goes on one intermediate layer, not on the gradients.

The model is the funnel 8n, 4n, 2n, n on the dataset's trunk (``train.model``), with the
mechanism of :mod:`dpclip.sanitization` after the n-wide layer's ReLU. Encoder modes:

* ``frozen`` (default, sound): every layer up to the sanitization layer is trained on the
  public shadow split, then frozen; only the head trains on sanitized activations of the
  private records, so the released model is post-processing of per-record Gaussian releases.
* ``joint`` (the paper's setting): the encoder also trains on the raw private features; its
  weights are not protected, so runs are flagged ``dp_guarantee: false`` and their epsilon
  covers the sanitized activations only.

Accounting: each epoch releases every record once (shuffled batches, no subsampling claimed),
so epsilon is that of ``epochs`` Gaussian releases at sigma (:func:`record_epsilon`); the target
epsilon sets sigma like every other method's. The method has its own ``epochs`` (not
``train.epochs``): by Gaussian composition, E releases at sigma sqrt(E) carry what one release
at sigma does, so more epochs buy no signal, only more steps on noisier inputs. With ``adaptive: true``, C = t ||W||_F of the
sanitization layer's weights after each epoch (paper Alg. 3; post-processing). In ``frozen``
mode W is fixed, so C stays t ||W||_F.
"""

from __future__ import annotations

from dpclip.methods.base import Method, Option, register
from dpclip.sanitization import funnel_widths

ENCODER_MODES = ("frozen", "joint")


@register
class Sanitize(Method):
    name = "sanitize"
    options_key = "sanitize"
    step_kind = "sanitize"  # its own run (dpclip.train.sanitize_run), not the DP-SGD step
    adjacency = "replace_one_features"  # labels public, one record's features replaced
    OPTIONS = {
        "n": Option(8, low=1, integer=True, help="width n of the sanitization layer"),
        "drop_p": Option(0.1, low=0.0, high=1.0, high_open=True,
                         help="dropout probability p, mask drawn before the noise"),
        "clip": Option(1.0, low=0.0, low_open=True, help="C: activations clipped to [0, C]"),
        "adaptive": Option(False, help="C = t ||W||_F after each epoch (paper Alg. 3)"),
        "t": Option(0.05, low=0.0, low_open=True, help="the constant t of the adaptive C"),
        "encoder": Option("frozen", choices=ENCODER_MODES,
                          help="frozen (trained on public data; sound) | joint (literal)"),
        "public_epochs": Option(100, low=1, integer=True,
                                help="frozen: epochs of public pre-training of the encoder"),
        "public_lr": Option(0.003, low=0.0, low_open=True,
                            help="frozen: Adam learning rate of the public pre-training"),
        "epochs": Option(10, low=1, integer=True,
                         help="private epochs: each one releases every record once"),
        "head_lr": Option(0.002, low=0.0, low_open=True,
                          help="learning rate (train.optimizer) on the sanitized activations"),
    }

    def __init__(self, context):
        super().__init__(context)
        self.clip_threshold = float(self.options["clip"])
        self.dp_guarantee = self.options["encoder"] == "frozen"

    def data_use(self) -> dict[str, str]:
        encoder = ("the public shadow_train split (pre-trained without noise, then frozen)"
                   if self.options["encoder"] == "frozen" else
                   "members' raw features without noise (joint mode: no DP for the encoder)")
        clip = ("the sanitization layer's released weights (post-processing)"
                if self.options["adaptive"] else "nothing: C is constant")
        return {"encoder": encoder,
                "head": "members' sanitized activations (clipped, masked, noised per record) "
                        "and their labels in the clear (public by the threat model)",
                "clip_threshold": clip}

    @classmethod
    def model_hidden(cls, options: dict, hidden) -> list[int]:
        return funnel_widths(int({**{k: o.default for k, o in cls.OPTIONS.items()},
                                  **options}["n"]))

    @classmethod
    def needs_public_data(cls, options: dict) -> bool:
        return options.get("encoder", cls.OPTIONS["encoder"].default) == "frozen"
