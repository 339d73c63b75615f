"""What the stages share to run: the parameters (:mod:`~dpclip.pipeline.params`), a run's
inputs and tuned values, per-run caching (:mod:`~dpclip.pipeline.provenance`), runs side by
side, and ``dvc.yaml`` generated from the stages' declarations (:mod:`dpclip.catalog`).
Importing the package imports no stage."""
