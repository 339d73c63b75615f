"""The pipeline as data: each stage declared once (:mod:`dpclip.pipeline.spec`), ``dvc.yaml``
generated from the declarations (:mod:`dpclip.pipeline.dvc_yaml`), and the stages run in
order in one process (:mod:`dpclip.pipeline.local`). Importing the package imports no stage."""
