"""``dc_sgd_p``: DC-SGD's P rule (Wei et al. 2025, dynamic clipping from a noisy histogram of
per-sample gradient norms; arXiv 2503.22988). The E rule is
:mod:`dpclip.methods.dc_sgd_e`; the shared code is :mod:`dpclip.methods.common.dc_sgd`.

Each step clips as DP-SGD does, s_i = min(1, C_t / n_i), and also releases a histogram of the
batch's norms over H fixed bins on [0, b_max] (norms >= b_max count in the last bin). Each record
adds 1 to one bin, so the histogram has L2 sensitivity 1; its counts get N(0, sigma_H^2) noise
and are clamped at 0. The step is one Gaussian mechanism with
    sigma = (sigma_T^-2 + sigma_H^-2)^(-1/2),  i.e.  sigma_T = (sigma^-2 - sigma_H^-2)^(-1/2),
with sigma_H = ratio * sigma. The next threshold is computed from the noisy histogram only:

* P rule: C_{t+1} = upper edge of the first bin whose cumulative noisy mass reaches p.
* E rule: C_{t+1} = argmin over the bin edges C of
      sigma_T^2 C^2 d / B^2 + sum_k c~_k max(m_k - C, 0)^2 / sum_k c~_k      (m_k: bin midpoint)
  The paper writes the bias term over the raw batch norms, which would make C_{t+1} a
  function of private data with no noise; dpclip evaluates it on the noisy histogram.

When the noisy histogram holds no mass, C is left unchanged.
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
