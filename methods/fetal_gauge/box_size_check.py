"""A diagnosis of the failed box-size claim: the trained VLM's test VG accuracy per asked
structure, box bin and style (one model: the experiment's chosen recipe, seed 0).

    python -m methods.fetal_gauge.box_size_check [--steps 1500] [--lr 1e-3]

On phantoms a box's size bin is largely the structure it holds (the spine is always small, the
abdomen always large: phantoms.py), so a bin's accuracy is mostly its structures' accuracy; this
table separates the two.
"""

import argparse
import collections

import jax
import numpy as np

from configs import fetal_gauge as fg_config
from core import train
from methods.fetal_gauge import benchmark_records, harness, make
from methods.fetal_gauge.model import VLMModel, model_config


def table(recs, predictions) -> str:
    cells = collections.defaultdict(list)
    for r, p in zip(recs, predictions, strict=True):
        cells[(r.answer, r.bbox_bin, r.style)].append(p == r.answer_idx)
    lines = ["| structure | bin | clinical | phantom |", "|---|---|---|---|"]
    for structure, box in sorted({(s, b) for s, b, _ in cells}):
        row = []
        for style in ("clinical", "phantom"):
            hits = cells.get((structure, box, style), [])
            row.append(f"{np.mean(hits):.3f} (n {len(hits)})" if hits else "-")
        lines.append(f"| {structure} | {box} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--workdir", default="/tmp/fetal_gauge_box_size_check")
    args = parser.parse_args(argv)
    config = fg_config.get_config("size=cpu")
    config.train.steps, config.optim.lr = args.steps, args.lr
    config.train.eval_every, config.train.checkpoint_every = 0, 0
    result = train.run(config, make(config), args.workdir, devices=jax.devices()[:1])
    test = [
        r
        for r in benchmark_records(config.data.num_patients, config.data.seed)
        if r.split == "test" and r.task == "VG"
    ]
    model = VLMModel(model_config(config), result.state.params)
    print(table(test, harness.evaluate(model, test, progress=False).indices))


if __name__ == "__main__":
    main()
