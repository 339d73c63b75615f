"""What the side-by-side workers' fork server (:mod:`dpclip.pipeline.side_by_side`) imports
first, before anything loads torch: OpenMP's passive wait for the workers it forks.

GNU OpenMP reads its wait policy once, as torch loads it, and by default its threads spin while
they wait: spinning workers side by side on a machine's cores slow each other down several
times over (docs/measurements.md). A policy the environment chose (``OMP_WAIT_POLICY``,
``GOMP_SPINCOUNT``) is kept, and the command's own process keeps its own. The policy changes
when a thread sleeps, not what it computes.
"""

import os

if not any(os.environ.get(name) for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")):
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
