"""Teachers: exact next-token distributions the PTP student is distilled from.

A teacher is anything with `logits(tokens_BT) -> logits_BTV`, the next-token logits after each
position (one call scores a whole sequence, as an AR transformer's forward does), and a sampler
for training data. The student and the loss only call `logits`, so a learned teacher (the code
teacher of a later session: a byte-level transformer) plugs in beside the toy one here.

`MarkovTeacher` is a first-order chain given by a table of next-token probabilities;
`increasing_sequence()` is the toy teacher of the official code (mandt-lab/ptp,
`data/toy_increasing_sequence.py`): sequences start at token 0; the next token is the same or
+1 with probability 1/2 each, absorbing at V - 1 (V = 100). Exact, so nothing is trained.
"""

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np

from methods.flow_mtp import bins


@dataclasses.dataclass(frozen=True, eq=False)
class MarkovTeacher:
    """next-token probabilities table_VV[prev] (rows sum to 1) and the first token."""

    table_VV: np.ndarray
    start_token: int = 0

    def __post_init__(self):
        t = np.asarray(self.table_VV, np.float64)
        if t.ndim != 2 or t.shape[0] != t.shape[1]:
            raise ValueError(f"table_VV must be square [V, V], got shape {t.shape}")
        if (t < 0).any() or not np.allclose(t.sum(1), 1.0, atol=1e-6):
            raise ValueError("table_VV rows must be probabilities (>= 0, summing to 1)")
        if not 0 <= self.start_token < t.shape[0]:
            raise ValueError(f"start_token={self.start_token} outside the vocabulary [0, V)")

    @property
    def vocab_size(self) -> int:
        return self.table_VV.shape[0]

    @functools.cached_property
    def _log_table_VV(self) -> np.ndarray:
        with np.errstate(divide="ignore"):  # impossible transitions are -inf logits
            return np.log(np.asarray(self.table_VV, np.float32))

    def logits(self, tokens_BT):
        """Next-token logits [B, T, V] after each position (float32; -inf where impossible)."""
        return jnp.asarray(self._log_table_VV)[tokens_BT]

    def edges_VE(self, transform: bins.SamplingTransform = bins.PLAIN):
        """Every row's float32 bin edges after `transform` (host numpy), for sampling data."""
        probs_VV = bins.sampling_probs(jnp.asarray(self._log_table_VV), transform)
        return np.asarray(bins.cdf_edges(probs_VV))

    def sample(self, rng: np.random.Generator, length: int, edges_VE=None) -> np.ndarray:
        """One sequence of `length` tokens from the start token, each next token the inverse
        CDF of a float32 u ~ U(0, 1) under the same edges the loss and verification use."""
        return self.sample_many([rng], [length], edges_VE)[0]

    def sample_many(self, rngs, lengths, edges_VE=None) -> list[np.ndarray]:
        """`sample` for several generators at once: each draws its own u's as `sample` does,
        and every position's inverse CDF runs over all rows in one NumPy call (a Python loop
        per token cost ~0.7 ms per training example)."""
        edges_VE = self.edges_VE() if edges_VE is None else edges_VE
        T = max(lengths)
        u_BT = np.zeros((len(rngs), T - 1), np.float32)  # rows shorter than T: u = 0, cut off
        for row, (rng, length) in enumerate(zip(rngs, lengths, strict=True)):
            u_BT[row, : length - 1] = rng.random(length - 1, dtype=np.float32)
        out_BT = np.empty((len(rngs), T), np.int32)
        out_BT[:, 0] = self.start_token
        for t in range(1, T):
            # searchsorted(edges[1:], u, side="right") = how many of those edges are <= u
            out_BT[:, t] = (edges_VE[out_BT[:, t - 1], 1:] <= u_BT[:, t - 1, None]).sum(1)
        return [out_BT[row, :length] for row, length in enumerate(lengths)]


def increasing_sequence(vocab_size: int = 100) -> MarkovTeacher:
    """The official toy teacher: next = same or +1 with probability 1/2, absorbing at V - 1."""
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    table = np.zeros((vocab_size, vocab_size), np.float64)
    ids = np.arange(vocab_size - 1)
    table[ids, ids] = table[ids, ids + 1] = 0.5
    table[-1, -1] = 1.0
    return MarkovTeacher(table, start_token=0)


def random_markov(vocab_size: int, seed: int, *, spread: float = 1.5) -> MarkovTeacher:
    """A chain with random, unequal transition probabilities (softmax of N(0, spread^2)
    logits): a small-vocabulary teacher on which temperature matters, for tests."""
    logits = np.random.default_rng(seed).normal(0.0, spread, (vocab_size, vocab_size))
    table = np.exp(logits - logits.max(1, keepdims=True))
    return MarkovTeacher(table / table.sum(1, keepdims=True), start_token=0)
