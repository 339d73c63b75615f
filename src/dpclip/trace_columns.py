"""The columns of a run's step trace (``traces/<run>.csv``) that are computed from the private
batch without noise: local diagnostics for the data owner, kept out of MLflow unless
``tracking.private_diagnostics`` asks for them. A leaf module: the tracking code reads it
without importing the training code (whose edits would then make the report stage stale)."""

PRIVATE_DIAGNOSTICS = ("train_loss", "batch_size")
