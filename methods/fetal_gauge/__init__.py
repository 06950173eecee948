"""Fetal-Gauge (paper 16 of PAPERS.md; issue 45): a VQA benchmark harness for fetal ultrasound,
tested on generated phantoms.

- `vocab.py`, `records.py`, `parse.py`, `local_data.py`: the five tasks' vocabularies, the
  record schema and its builders, the answer parser, real data from local paths only;
- `phantoms.py`, `phantom_set.py`: the procedural fake-ultrasound benchmark;
- `scoring.py`, `scorecard.py`, `stubs.py`, `harness.py`, `run_benchmark.py`: scores, the report,
  the model interface with its stubs, the CLI;
- `model.py` and here: the small JAX VLM scored by option likelihood, trained by `core.train`:

    python -m launch.train --config=configs/fetal_gauge.py:size=cpu --workdir=/tmp/fetal_gauge
"""

import functools

from core import data
from core.errors import ConfigError
from core.method import Method
from core.nn import transformer, vlm
from methods.fetal_gauge import model, phantom_set, records


@functools.lru_cache(maxsize=4)
def benchmark_records(num_patients: int, seed: int, train_styles: str = "clinical") -> tuple:
    """The phantom benchmark's records (built once per process; callers must not mutate)."""
    styles = tuple(s for s in train_styles.split("+") if s)
    if not styles or set(styles) - set(records.STYLES):
        raise ConfigError(
            f"fetal_gauge: data.train_styles={train_styles!r}; styles of {records.STYLES} "
            "joined by '+'"
        )
    return tuple(
        phantom_set.phantom_benchmark(
            num_patients, seed, styles_by_split={**phantom_set.DEFAULT_STYLES, "train": styles}
        )
    )


@functools.lru_cache(maxsize=4)
def benchmark_arrays(num_patients: int, seed: int, train_styles: str) -> dict:
    """{"train": arrays, "validation": arrays} of the phantom benchmark (built once per process)."""
    recs = benchmark_records(num_patients, seed, train_styles)
    out = {}
    for split in ("train", "validation"):
        part = [r for r in recs if r.split == split]
        if not part:
            raise ConfigError(
                f"fetal_gauge: data.num_patients={num_patients} leaves no {split} questions"
            )
        out[split] = model.encode_records(part)
    return out


def make(config) -> Method:
    cfg = model.model_config(config)
    d = config.data

    def init(rng, batch_spec):
        del batch_spec
        return {"params": vlm.init_params(cfg, rng)}

    def eval_step(state, batch, *, rng):
        del rng
        return model.accuracy_sums(cfg, state.params, batch)

    def dataset(split, *, shard, seed):
        arrays = benchmark_arrays(d.num_patients, d.seed, d.train_styles)
        if split == "eval":
            return data.one_pass(
                arrays["validation"], global_batch=config.eval.batch_size, shard=shard
            )
        return data.in_memory(
            arrays["train"], global_batch=config.train.batch_size, seed=seed, shard=shard
        )

    return Method(
        init=init,
        loss=functools.partial(model.loss_fn, cfg),
        dataset=dataset,
        eval_step=eval_step,
        sharding_rules=transformer.SHARDING_RULES,
    )
