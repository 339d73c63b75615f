"""How many CPU threads torch's operators use: a parameter (``train.threads``), not whatever
the process inherited, because results depend on it. A matrix product or a convolution split
across a different number of threads sums in a different order, so the same configuration
trained with 1 and with 2 threads gives different weights. Dask starts its workers with one
thread (``OMP_NUM_THREADS=1``); setting the count from the parameters makes a run in a worker
equal the same run in the flow's process, bit for bit."""

from __future__ import annotations

import os

import torch


def thread_count(threads: int | None) -> int:
    """The count ``train.threads`` asks for on this machine (None: one per CPU)."""
    return int(threads or os.cpu_count() or 1)


def use_threads(threads: int | None) -> int:
    """Set torch's intra-op thread count to ``threads`` (None: one per CPU of the machine);
    returns the count."""
    count = thread_count(threads)
    torch.set_num_threads(count)
    return count
