"""A diagnostic beside the full run (no claim): the ssl arm pretrained for more steps.

    python -m methods.brain_semantoks.longer --steps=1500 --workdir=/tmp/bs_longer

The full run pretrains for 500 steps (`configs/brain_semantoks.py`: what its 24 runs allow on
2 cores). This reruns its ssl arm, same seeds, cohort, probes and splits, with `--steps` steps
(warm-up, cosine decays and the teacher's momentum all stretched over them), and saves the rows
as `methods/brain_semantoks/results/longer.json`, so that the README can pair each seed with the
full run's random-init row: does pretraining's gain over random init grow with training?
"""

import os

from absl import app, flags

from configs import brain_semantoks as bs_config
from core import results
from methods.brain_semantoks import experiment, runs

_STEPS = flags.DEFINE_integer("steps", 1500, "Pretraining steps.")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/bs_longer", "Where the runs go.")


def config(steps: int, seed: int):
    c = bs_config.get_config("size=small")
    c.train.steps = steps
    c.train.log_every = max(1, steps // 20)
    c.train.eval_every = max(1, steps // 10)
    c.train.checkpoint_every = steps
    c.optim.warmup_steps = max(1, round(0.03 * steps))
    c.seed = seed
    c.arm_kind = "ssl"
    return c


def main(argv):
    del argv
    rows = []
    for seed in experiment.SEEDS:
        c = config(_STEPS.value, seed)
        row = runs.run(c, os.path.join(_WORKDIR.value, f"seed{seed}"))
        rows.append({"arm": "ssl", "steps": _STEPS.value, "seed": seed, **row})
        print(f"seed {seed}: test/id a {row['test/id/a']:.3f} b {row['test/id/b']:.3f}", flush=True)
    record = results.record("brain_semantoks", "longer", config={"steps": _STEPS.value},
                            rows=rows)  # fmt: skip
    print("saved", results.save(record))


if __name__ == "__main__":
    app.run(main)
