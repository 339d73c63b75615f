"""``dc_sgd_e``, DC-SGD's E rule (Wei et al. 2025; the mechanism: :mod:`dpclip.methods.dc_sgd_p`):
C_{t+1} = the bin edge C minimising sigma_T^2 C^2 d / B^2 plus the clipping bias on the noisy
histogram, never on raw norms (docs/methods.md, "DC-SGD: the sigma split").
"""

from __future__ import annotations

from dpclip.methods.base import register
from dpclip.methods.common.dc_sgd import DynamicClipping, error_threshold, noise_split


@register
class DCSGDError(DynamicClipping):
    name = "dc_sgd_e"

    def next_threshold(self, noisy_counts):
        return error_threshold(noisy_counts, self.options.b_max, self.sigma_train,
                               self.context.n_params, self.context.expected_batch)


# the claims about this method's epsilon that need no runs (dpclip.reporting.accounting)
ACCOUNTING_CHECKS = {"noise_split": noise_split}
