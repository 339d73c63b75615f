"""dpclip: differentially private training methods compared under matched privacy budgets."""

__version__ = "0.1.0"
