"""``dc_sgd_e``, DC-SGD's E rule (Wei et al. 2025; the mechanism, the histogram and its
accounting are in :mod:`dpclip.methods.dc_sgd_p` and :mod:`dpclip.methods.common.dc_sgd`):

    C_{t+1} = argmin over the bin edges C of
        sigma_T^2 C^2 d / B^2 + sum_k c~_k max(m_k - C, 0)^2 / sum_k c~_k   (m_k: bin midpoint)

evaluated on the noisy histogram (the paper writes the bias over the raw batch norms, which
would make C_{t+1} a function of private data with no noise).
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
