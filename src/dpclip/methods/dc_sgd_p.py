"""``dc_sgd_p``: DC-SGD's P rule (Wei et al. 2025, dynamic clipping from a noisy histogram of
per-sample gradient norms; arXiv 2503.22988). The E rule is :mod:`dpclip.methods.dc_sgd_e`;
the shared code is :mod:`dpclip.methods.common.dc_sgd`.

DP-SGD clipping; each step also releases the batch's norm histogram (sensitivity 1, noise std
sigma_H, split from sigma), and C_{t+1} is the upper edge of the first bin whose cumulative
noisy mass reaches p. docs/methods.md, "DC-SGD: the sigma split".
"""

from __future__ import annotations

from dpclip.methods.base import Option, Tunable, register
from dpclip.methods.common.dc_sgd import DynamicClipping, noise_split, percentile_threshold


@register
class DCSGDPercentile(DynamicClipping):
    name = "dc_sgd_p"
    OPTIONS = {**DynamicClipping.OPTIONS,
               "p": Option(0.5, low=0.0, high=1.0, low_open=True, high_open=True,
                           help="P rule: quantile of the norm distribution")}
    TUNED_OPTIONS = {**DynamicClipping.TUNED_OPTIONS, "p": Tunable(0.1, 0.9)}

    def next_threshold(self, noisy_counts):
        return percentile_threshold(noisy_counts, self.options.b_max, self.options.p)


# the claims about this method's epsilon that need no runs (dpclip.reporting.accounting)
ACCOUNTING_CHECKS = {"noise_split": noise_split}
