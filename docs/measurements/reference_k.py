"""How LiRA and RMIA grow with the number of reference models K on the default pipeline.

Runs the default params.yaml (digits, every method, target epsilon 8) once into a scratch
project, then, for each K, trains the reference models of every run again (the reference
stage, forced) and evaluates (forced): one CSV row per (K, method) with the loss, LiRA and
RMIA AUC, each attack's TPR at the honest low FPR (10 false positives allowed) and at no
false positive, and the reference stage's wall time. The attacked records, the target models
and the seeds of the first K models are the same for every K.

    python docs/measurements/reference_k.py --ks 2 4 8 16 --out docs/measurements/reference_k.csv
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import yaml

from dpclip.stages.evaluate import evaluate_all
from dpclip.stages.partition import partition
from dpclip.stages.prepare import prepare
from dpclip.stages.reference import reference_all
from dpclip.stages.shadow import shadow
from dpclip.stages.train import train_all
from dpclip.stages.tune import tune
from dpclip.pipeline.params import load_params
from dpclip.files import read_json
from dpclip.layout import Layout
from dpclip.run_keys import RunKey


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--scratch", default="/tmp/dpclip-reference-k")
    parser.add_argument("--out", default="docs/measurements/reference_k.csv")
    parser.add_argument("--methods", nargs="*", help="a subset of train.methods")
    args = parser.parse_args()
    root = Path(args.scratch)
    root.mkdir(parents=True, exist_ok=True)
    raw = yaml.safe_load(Path("params.yaml").read_text())
    if args.methods:
        raw["train"]["methods"] = args.methods
    raw["audit"]["kinds"] = []  # not what is measured here
    rows = []
    layout = Layout(root)
    for k in args.ks:
        raw["attack"]["references"] = k
        (root / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
        params = load_params(root / "params.yaml")
        if k == args.ks[0]:
            prepare(params, layout)
            for alpha in params.partition.alphas:
                partition(params, alpha, layout)
            shadow(params, layout, progress=False)
            tune(params, layout, progress=False)
            list(train_all(params, layout, progress=False))
        started = time.perf_counter()
        list(reference_all(params, layout, force=True))
        seconds = time.perf_counter() - started
        list(evaluate_all(params, layout, force=True))
        for method in params.train.methods:
            run = RunKey(method, params.privacy.target_epsilons[0],
                         params.partition.alphas[0], params.train.seeds[0]).name
            mia = read_json(layout.metrics(run))["mia"]
            row = {"k": k, "method": method, "reference_s": round(seconds, 1)}
            for attack in ("loss", "lira", "rmia"):
                row[f"{attack}_auc"] = mia[attack]["auc"]
                row[f"{attack}_tpr_at_low_fpr"] = mia[attack]["low_fpr"]["tpr"]
                row[f"{attack}_tpr_at_zero_fp"] = mia[attack]["tpr_at_zero_fp"]
            row["low_fpr"] = mia["loss"]["low_fpr"]["fpr"]
            match = mia["references"]["match"]
            row["matched"] = all(match["matched"].values())
            row["target_unseen_mean_phi"] = match["target"]["unseen_mean_phi"]
            row["reference_unseen_mean_phi"] = match["references"]["unseen_mean_phi"]
            row["reference_phi_correlation"] = match["references"]["unseen_phi_correlation"]
            rows.append(row)
            print(row, flush=True)
    pd.DataFrame(rows).to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
