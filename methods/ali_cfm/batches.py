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
coupling="independent" the knots are independent draws (I-CFM's x0, x1); "triple" chains only
x0 -> x_i -> x1 (the GAN's three knots).

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


COUPLINGS = ("full", "triple", "independent")


def couple_triple(clouds_KBD: np.ndarray, i: int) -> np.ndarray:
    """Only x0 -> x_i -> x1 chained by OT (two solves, whatever K); the other knots stay
    independent draws. The GAN and pretraining read no other knot, and on the knot set (K in
    the hundreds) the full chain is most of a step's time."""
    K = len(clouds_KBD)
    idx_3B = ot.chain([clouds_KBD[0], clouds_KBD[i], clouds_KBD[K - 1]])
    out_KBD = clouds_KBD.copy()
    for k, row in zip((0, i, K - 1), idx_3B, strict=True):
        out_KBD[k] = clouds_KBD[k][row]
    return out_KBD


def examples_fn(train: Marginals, seed: int, *, coupling: str = "full", gan: bool = True):
    """`examples_fn(rngs, b)` for `core.data.synthetic(..., indexed=True)` (see the module).
    `coupling`: "full" (the OT chain through every training marginal, the official), "triple"
    (only x0 -> x_i -> x1, for the GAN: see `couple_triple`) or "independent" (I-CFM)."""
    if coupling not in COUPLINGS:
        raise ConfigError(f"coupling={coupling!r}; expected one of: {', '.join(COUPLINGS)}")
    if gan or coupling == "triple":
        intermediate(train, seed, 0)  # refuse at build time, not in the pipeline

    def fn(rngs, b):
        clouds_KBD = draw(train, rngs)
        i = intermediate(train, seed, b) if gan or coupling == "triple" else 0
        if coupling == "full":
            x_KBD = couple(clouds_KBD)
        elif coupling == "triple":
            x_KBD = couple_triple(clouds_KBD, i)
        else:
            x_KBD = clouds_KBD
        return {
            "x_BKD": np.ascontiguousarray(x_KBD.transpose(1, 0, 2), np.float32),
            "i_B": np.full(len(rngs), i, np.int32),
        }

    return fn


def coupled_cost(x_BKD: np.ndarray) -> float:
    """Mean squared length of the trajectories' consecutive steps (what the OT chain lowers)."""
    return float(np.mean(np.sum(np.diff(x_BKD, axis=1) ** 2, axis=-1)))
