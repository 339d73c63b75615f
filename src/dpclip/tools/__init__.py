"""The user commands that are no pipeline stage, standing side by side on the pipeline:
``dpclip preset`` (:mod:`~dpclip.tools.presets`), ``dpclip advise``
(:mod:`~dpclip.tools.advise`), both running the pipeline in a folder of their own
(:mod:`~dpclip.tools.folder_run`, with the training time measured first: :mod:`~dpclip.tools.cost`),
and ``dpclip bench`` (:mod:`~dpclip.tools.bench`). The CLI loads them by name
(:mod:`~dpclip.tools.commands`), so no stage depends on their code."""
