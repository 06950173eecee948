"""Host-side training batches for ALI-CFM: one draw from every training marginal per example,
the local batch coupled across time by exact OT (`core.ot.chain`, the official "full"
coupling), plus the GAN's intermediate marginal.

    m = data.load("rotating_gmm", seed=0)
    split = split_marginals(m, held_out=3)             # Split(train, held_time, held_samples)
    fn = examples_fn(split.train, seed=0)              # for core.data.synthetic(indexed=True)
    it = core.data.synthetic(examples_fn=fn, global_batch=128, seed=0, indexed=True)
    batch = next(it)   # {"x_BKD": [B, K, D] float32, "i_B": [B] int32}

`x_BKD[b, k]` is trajectory b's point at training time `split.train.times[k]` (static, so not in
the batch). `i_B` is the intermediate knot the GAN and pretraining regress to: as the official
`sample_full_batch`, ONE random intermediate training time per global batch (every row the same
index), drawn from (seed, batch index) so every process picks the same one. With
`couple=False` the knots are independent draws (I-CFM's x0, x1).

The coupling is over this process's share of the batch: per example the draws are deterministic
(its own generator), but the pairing depends on the batch (and, across processes, on the
process count), as minibatch OT does.
"""

from typing import NamedTuple

import numpy as np

from core import ot
from core.errors import ConfigError
from methods.ali_cfm.data import Marginals, leave_one_out


class Split(NamedTuple):
    train: Marginals  # the marginals a model is trained on (times keep their gaps)
    held_time: float | None  # the left-out marginal's time (None: nothing held out)
    held_samples: np.ndarray | None  # its samples [n, D], normalised


def split_marginals(m: Marginals, held_out: int) -> Split:
    """`m` without marginal `held_out` (-1: keep all), as the leave-one-out evaluation."""
    if held_out == -1:
        return Split(m, None, None)
    try:
        train, t, x = leave_one_out(m, held_out)
    except ConfigError:
        raise ConfigError(
            f"held_out={held_out}: -1 (none) or an intermediate index 0 < k < {len(m.times) - 1}"
        ) from None
    return Split(train, t, x)


def draw(train: Marginals, rngs) -> np.ndarray:
    """[K, B, D]: for example b, one uniform draw from each marginal with its own generator."""
    sizes = [len(x) for x in train.samples]
    idx_BK = np.array([[r.integers(n) for n in sizes] for r in rngs])
    return np.stack([x[idx_BK[:, k]] for k, x in enumerate(train.samples)])


def couple(clouds_KBD: np.ndarray) -> np.ndarray:
    """The clouds re-ordered along the OT chain: row b of the result is one trajectory."""
    idx_KB = ot.chain(list(clouds_KBD))
    return np.stack([c[i] for c, i in zip(clouds_KBD, idx_KB, strict=True)])


def intermediate(train: Marginals, seed: int, b: int) -> int:
    """The intermediate training index of global batch b (same on every process)."""
    K = len(train.times)
    if K < 3:
        raise ConfigError("no intermediate training marginal (the GAN needs one); keep one in")
    return int(np.random.default_rng([seed, b, 7]).integers(1, K - 1))


def examples_fn(train: Marginals, seed: int, *, couple_knots: bool = True, gan: bool = True):
    """`examples_fn(rngs, b)` for `core.data.synthetic(..., indexed=True)` (see the module)."""
    if gan:
        intermediate(train, seed, 0)  # refuse at build time, not in the pipeline

    def fn(rngs, b):
        clouds_KBD = draw(train, rngs)
        x_KBD = couple(clouds_KBD) if couple_knots else clouds_KBD
        i = intermediate(train, seed, b) if gan else 0
        return {
            "x_BKD": np.ascontiguousarray(x_KBD.transpose(1, 0, 2), np.float32),
            "i_B": np.full(len(rngs), i, np.int32),
        }

    return fn


def coupled_cost(x_BKD: np.ndarray) -> float:
    """Mean squared length of the trajectories' consecutive steps (what the OT chain lowers)."""
    return float(np.mean(np.sum(np.diff(x_BKD, axis=1) ** 2, axis=-1)))
