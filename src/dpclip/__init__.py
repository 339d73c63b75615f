"""dpclip: differentially private training methods compared under matched privacy budgets."""

from dpclip.numerics import pin_cpu_kernels

pin_cpu_kernels()  # before torch is imported: the same kernels, so the same numbers, everywhere

__version__ = "0.1.0"
