"""Why the sound ``sanitize`` collapsed on the 6,000-record MNIST subset (accuracy 0.19 at
epsilon 1) and not on full MNIST: the private class-mean head against the public-only model.

For each member count, the frozen encoder is pre-trained on public MNIST records (the shadow
rule: Adam, stopped on a public holdout), then the head is fitted to the class means of the
members' sanitized releases at the sound accounting (10 releases, no amplification: sigma 12.8
at epsilon 1), without ``keep_public_head``. Both models are scored on the same 10,000 test
records. The class means average n / 10 releases per class whose noise has std
sigma C sqrt(k) per unit (about 84 at n = 48 units, k about 43 kept): their error shrinks as
1 / sqrt(n / 10).

    python docs/measurements/sanitize_collapse.py --mnist DIR --out docs/measurements/sanitize_collapse.csv
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
import torch

from dpclip.config import DataParams
from dpclip.data import read_source
from dpclip.methods import get_method
from dpclip.pretraining import accuracy_on
from dpclip.train import PublicData, TrainConfig, build_run


def measure(mnist: str, settings: list[tuple[int, int]], epsilon: float = 1.0) -> pd.DataFrame:
    data = read_source("mnist", mnist, DataParams(download=False))
    order = np.random.default_rng(0).permutation(len(data.y))
    test = (torch.as_tensor(data.x[order[60000:]]), torch.as_tensor(data.y[order[60000:]]))
    rows = []
    for members, public_n in settings:
        members_at = order[:members]
        public = order[members:members + public_n]
        held = order[members + public_n:members + 2 * public_n]
        options = {**get_method("sanitize").default_options(), "n": 48, "keep_public_head": False}
        cfg = TrainConfig.of("sanitize", epsilon, 0, method_options=options, model="paper_cnn",
                             hidden=[32], batch_size=256, device="cpu", threads=1)
        run = build_run((1, 28, 28), 10, members, cfg,
                        PublicData(data.x[public], data.y[public],
                                   held_out=(data.x[held], data.y[held])))
        public_only = accuracy_on(run.model, test)
        run.fit(torch.as_tensor(data.x[members_at]), torch.as_tensor(data.y[members_at]),
                progress=False, desc="")
        rows.append({"members": members, "public_records": public_n, "epsilon": epsilon,
                     "sigma": run.sigma, "public_only_accuracy": public_only,
                     "private_head_accuracy": accuracy_on(run.model, test)})
        print(rows[-1], flush=True)
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mnist", required=True, help="folder of the MNIST IDX files")
    parser.add_argument("--out", default="docs/measurements/sanitize_collapse.csv")
    args = parser.parse_args()
    torch.set_num_threads(1)
    measure(args.mnist, [(2400, 2400), (56000, 2000)]).to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
