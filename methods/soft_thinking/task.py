"""A chain-of-thought task with several valid traces per prompt: a shuffled modular sum.

    a1 a2 ... aN =  t1 s1 t2 s2 ... tN sN  </think>  ans  EOS
    `----prompt---' `------scratchpad-----'

The prompt is N terms in [0, p) and "="; the answer is their sum mod p. The scratchpad adds the
terms one at a time in ANY order: t1..tN is a permutation of the prompt's terms (drawn at
random per example, so the training data shows every order) and s_k = t1 + ... + tk mod p is the
running sum. A prompt with N distinct terms has N! valid traces; at step k the model may pick
any term it has not used yet, so greedy decoding follows one path among many and sampling
explores them. `</think>` closes the scratchpad (the soft-thinking delimiter), then the answer
and EOS.

Layout: PAD=0, EQ=1, THINK_END=2, EOS=3, numbers 0..p-1 at 4..4+p-1; seq_len = 3N + 4.

Splits: a prompt belongs to train, validation or test by a hash of its SORTED terms (the
multiset), so two prompts with the same answer and the same set of valid traces are always in
the same split: validation and test multisets are never trained on. Training examples are drawn
from the train part by rejection (deterministic per example: everything comes from the
Generator passed in); validation and test are fixed arrays of prompts (`prompts`).

Pure NumPy, like `core/tasks.py`: `example(rng)` returns {"inputs", "targets", "mask"} in
next-token form with the mask on the whole completion after "=" (scratchpad, delimiter, answer,
EOS).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import ClassVar

import numpy as np

PAD, EQ, THINK_END, EOS, FIRST_NUMBER = 0, 1, 2, 3, 4
SPLITS = ("train", "validation", "test")
# Out of every 10 hash buckets: 1 validation, 1 test, the rest train.
_BUCKETS = {"validation": (0,), "test": (1,), "train": tuple(range(2, 10))}


@dataclasses.dataclass(frozen=True)
class ShuffledSum:
    modulus: int = 11
    num_terms: int = 5

    TRAIN_TRIES: ClassVar[int] = 64  # rejection draws per train example (8 of 10 buckets accept)

    def __post_init__(self):
        if self.modulus < 2:
            raise ValueError(f"ShuffledSum.modulus must be >= 2 (got {self.modulus})")
        if self.num_terms < 2:
            raise ValueError(f"ShuffledSum.num_terms must be >= 2 (got {self.num_terms})")

    @property
    def vocab_size(self) -> int:
        return FIRST_NUMBER + self.modulus

    @property
    def prompt_len(self) -> int:
        return self.num_terms + 1

    @property
    def completion_len(self) -> int:
        return 2 * self.num_terms + 3  # scratchpad, delimiter, answer, EOS

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.completion_len

    def split_of(self, terms_BN: np.ndarray) -> np.ndarray:
        """The split index (into SPLITS) of each prompt, from its sorted terms."""
        key_B = np.zeros(len(terms_BN), np.uint64)
        for term_B in np.sort(terms_BN, axis=1).T.astype(np.uint64):
            key_B = key_B * np.uint64(self.modulus) + term_B
        # Knuth's multiplicative hash spreads neighbouring multisets over the buckets.
        bucket_B = (key_B * np.uint64(2654435761)) % np.uint64(2**32) % np.uint64(10)
        out = np.full(len(terms_BN), -1)
        for index, name in enumerate(SPLITS):
            out[np.isin(bucket_B, _BUCKETS[name])] = index
        return out

    def prompts(self, split: str, n: int, seed: int) -> np.ndarray:
        """n prompts' terms [n, N] of `split`, drawn (with replacement) from its hash buckets."""
        if split not in SPLITS:
            raise ValueError(f"split {split!r}; expected one of {SPLITS}")
        rng = np.random.default_rng([seed, SPLITS.index(split)])
        found = np.zeros((0, self.num_terms), np.int64)
        while len(found) < n:
            draw = rng.integers(0, self.modulus, size=(4 * n, self.num_terms))
            found = np.concatenate([found, draw[self.split_of(draw) == SPLITS.index(split)]])
        return found[:n]

    def answer(self, terms_BN: np.ndarray) -> np.ndarray:
        return np.asarray(terms_BN).sum(axis=-1) % self.modulus

    def prompt_tokens(self, terms_BN: np.ndarray) -> np.ndarray:
        terms_BN = np.asarray(terms_BN)
        eq_B1 = np.full((len(terms_BN), 1), EQ)
        return np.concatenate([FIRST_NUMBER + terms_BN, eq_B1], axis=1).astype(np.int32)

    def sequence(self, terms_BN: np.ndarray, order_BN: np.ndarray) -> np.ndarray:
        """Whole sequences [B, seq_len] with the scratchpad visiting terms in `order_BN`."""
        terms_BN = np.asarray(terms_BN)
        visited_BN = np.take_along_axis(terms_BN, np.asarray(order_BN), axis=1)
        running_BN = np.cumsum(visited_BN, axis=1) % self.modulus
        pad_BN = np.stack([visited_BN, running_BN], axis=2).reshape(len(terms_BN), -1)
        tail_B3 = np.stack(
            [
                np.full(len(terms_BN), THINK_END),
                FIRST_NUMBER + self.answer(terms_BN),
                np.full(len(terms_BN), EOS),
            ],
            axis=1,
        )
        completion = np.concatenate([FIRST_NUMBER + pad_BN, tail_B3], axis=1)
        return np.concatenate([self.prompt_tokens(terms_BN), completion], axis=1).astype(np.int32)

    def draw_orders(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n random scratchpad orders [n, N] (permutations of the term positions)."""
        return rng.permuted(np.tile(np.arange(self.num_terms), (n, 1)), axis=1)

    def batch_from(self, terms_BN: np.ndarray, rng: np.random.Generator) -> dict:
        """Training examples for given prompts, each with a random scratchpad order."""
        return self.examples_of(terms_BN, self.draw_orders(rng, len(terms_BN)))

    def examples_of(self, terms_BN: np.ndarray, order_BN: np.ndarray) -> dict:
        """{"inputs", "targets", "mask"} for prompts whose scratchpads visit `order_BN`."""
        seq = self.sequence(terms_BN, order_BN)
        targets = np.concatenate([seq[:, 1:], np.full_like(seq[:, :1], PAD)], axis=1)
        t = np.arange(self.seq_len)
        mask = np.broadcast_to(t >= self.prompt_len - 1, seq.shape) & (t < self.seq_len - 1)
        return {"inputs": seq, "targets": targets, "mask": mask.astype(np.float32)}

    def examples(self, rngs: list[np.random.Generator]) -> dict:
        """One training example per generator (`core.data.synthetic(examples_fn=)`): each
        generator draws its prompt from the train split by rejection, then its order, exactly
        as `example` does; the sequences are then built in one vectorised call."""
        terms, orders = [], []
        for rng in rngs:
            terms.append(self._train_terms(rng))
            orders.append(self.draw_orders(rng, 1))
        return self.examples_of(np.concatenate(terms), np.concatenate(orders))

    def example(self, rng: np.random.Generator) -> dict:
        """One training example from the train split (rejection on the split hash)."""
        return {k: v[0] for k, v in self.examples([rng]).items()}

    def _train_terms(self, rng: np.random.Generator) -> np.ndarray:
        for _ in range(self.TRAIN_TRIES):
            terms = rng.integers(0, self.modulus, size=(1, self.num_terms))
            if _split_index(self, tuple(sorted(terms[0].tolist()))) == SPLITS.index("train"):
                return terms
        raise RuntimeError(f"no train prompt in {self.TRAIN_TRIES} draws")  # p < 1e-40

    def traces(self, terms: np.ndarray) -> set[tuple[int, ...]]:
        """Every valid scratchpad (token ids, t1 s1 ... tN sN) of one prompt."""
        terms = np.asarray(terms)
        orders = np.array(sorted(set(itertools.permutations(range(self.num_terms)))))
        seq = self.sequence(np.tile(terms, (len(orders), 1)), orders)
        return {
            tuple(row) for row in seq[:, self.prompt_len : self.prompt_len + 2 * self.num_terms]
        }

    def score(self, terms_BN: np.ndarray, completion_BC: np.ndarray) -> dict[str, np.ndarray]:
        """Per row: `correct` (the token after the first </think> is the answer) and
        `valid_trace` (the scratchpad before it is one of the prompt's valid traces).
        `completion_BC` is what came after "=" (pad after the end)."""
        terms_BN, completion_BC = np.asarray(terms_BN), np.asarray(completion_BC)
        correct, valid = [], []
        for terms, tokens in zip(terms_BN, completion_BC, strict=True):
            ends = np.flatnonzero(tokens == THINK_END)
            if len(ends) == 0 or ends[0] + 1 >= len(tokens):
                correct.append(False)
                valid.append(False)
                continue
            end = ends[0]
            correct.append(tokens[end + 1] == FIRST_NUMBER + self.answer(terms))
            valid.append(self.valid_trace(terms, tokens[:end]))
        return {"correct": np.array(correct, bool), "valid_trace": np.array(valid, bool)}

    def valid_trace(self, terms: np.ndarray, trace: np.ndarray) -> bool:
        """t1 s1 ... tN sN: the t's are the prompt's terms in some order, the s's running sums.
        Checked step by step (no enumeration of all N! orders)."""
        N, p = self.num_terms, self.modulus
        trace = np.asarray(trace) - FIRST_NUMBER
        if len(trace) != 2 * N or np.any(trace < 0) or np.any(trace >= p):
            return False
        visited, running = trace[0::2], trace[1::2]
        same_terms = np.array_equal(np.sort(visited), np.sort(np.asarray(terms)))
        return bool(same_terms and np.array_equal(np.cumsum(visited) % p, running))


@functools.lru_cache(maxsize=1 << 16)
def _split_index(task: ShuffledSum, sorted_terms: tuple[int, ...]) -> int:
    """A multiset's split, remembered: training draws meet the same few multisets again and
    again, and the vectorised hash costs more than the rest of an example."""
    return int(task.split_of(np.array([sorted_terms]))[0])
