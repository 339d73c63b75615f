"""What people read and compare: figures (:mod:`~dpclip.reporting.plots`), the terminal summary
(:mod:`~dpclip.reporting.summary_table`), statistics over seeds
(:mod:`~dpclip.reporting.seed_stats`), the verdicts on the papers' claims
(:mod:`~dpclip.reporting.evidence`), DVC experiments side by side
(:mod:`~dpclip.reporting.compare`), a fresh run checked against the committed results
(:mod:`~dpclip.reporting.verify`), stage timings (:mod:`~dpclip.reporting.stage_times`) and
``dvc plots`` without a network (:mod:`~dpclip.reporting.offline_plots`). It imports none of its
modules, so that code importing one depends on that one only."""
