"""Synthetic sequence tasks for small sequence models, generated on the fly in pure NumPy.

Shared by every method that trains on them (the `lm` baseline, `selective_rope`), so they live in
the core rather than in one method that the others would import. Pure NumPy (no JAX) so they run
inside data-loader workers. Every task is a frozen dataclass with

- ``vocab_size`` and ``seq_len`` properties (every example is padded to ``seq_len``);
- ``example(rng)`` -> ``{"inputs": int32[T], "targets": int32[T], "mask": float32[T]}``: the model
  reads ``inputs`` and is trained to predict ``targets[t]`` wherever ``mask[t] == 1``;
- ``batch(rng, n)`` -> the same keys with a leading ``n`` axis, generated vectorised.

Token layout: ``PAD = 0`` in every task (padding has ``inputs = targets = PAD`` and ``mask = 0``),
then task-specific special tokens, then content tokens. Next-token tasks (copy, mqar, modular) have
``targets[t] == inputs[t + 1]`` (``PAD`` at the last position); parity labels every position.

``mask`` marks exactly what the model must produce after its prompt, so a sequence is solved iff
every masked prediction is right (:func:`exact_match`). ModularArithmetic also returns
``"answer_pos"``: the single position whose target is the final answer, for answer accuracy.

Randomness comes only from the Generator passed in (callers use ``np.random.default_rng([seed,
index])``). ``example(rng)`` equals ``batch(rng, 1)[0]``; ``batch(rng, n)`` is *not* n successive
``example`` calls, since it draws each quantity for all rows at once.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

PAD = 0

Batch = dict[str, np.ndarray]


def _check(ok: bool, task: str, field: str, why: str) -> None:
    if not ok:
        raise ValueError(f"{task}.{field} {why}")


def _lengths(rng: np.random.Generator, n: int, min_length: int | None, length: int) -> np.ndarray:
    """Per-row lengths: all ``length``, or uniform on [min_length, length] when variable."""
    if min_length is None:
        return np.full((n, 1), length)
    return rng.integers(min_length, length + 1, size=(n, 1))


def _next_token(seq: np.ndarray, mask: np.ndarray, **extra: np.ndarray) -> Batch:
    """Next-token form: targets are ``seq`` shifted left by one, ``PAD`` at the end."""
    targets = np.concatenate([seq[:, 1:], np.full_like(seq[:, :1], PAD)], axis=1)
    out = {
        "inputs": seq.astype(np.int32),
        "targets": targets.astype(np.int32),
        "mask": mask.astype(np.float32),
    }
    return out | {k: v.astype(np.int32) for k, v in extra.items()}


class _Task:
    """Shared ``example``; each task implements ``batch(rng, n)``: ``n`` examples stacked on a
    leading axis, generated vectorised."""

    def example(self, rng: np.random.Generator) -> Batch:
        """One example: ``batch(rng, 1)`` without the leading axis."""
        return {k: np.array(v[0]) for k, v in self.batch(rng, 1).items()}


@dataclasses.dataclass(frozen=True)
class Copy(_Task):
    """Reproduce a random string: ``s1..sL SEP s1..sL EOS``, padded to ``2 * length + 2``.

    Layout: PAD=0, SEP=1, EOS=2, symbols 3..3+num_symbols-1. The mask covers the targets of the
    copied half plus the final EOS (the model must know when to stop), i.e. L + 1 positions. With
    ``min_length`` the string length is uniform on [min_length, length].
    """

    length: int = 16
    num_symbols: int = 32
    min_length: int | None = None

    SEP: ClassVar[int] = 1
    EOS: ClassVar[int] = 2
    FIRST_SYMBOL: ClassVar[int] = 3

    def __post_init__(self):
        _check(self.length >= 1, "Copy", "length", f"must be >= 1 (got {self.length})")
        _check(
            self.num_symbols >= 1, "Copy", "num_symbols", f"must be >= 1 (got {self.num_symbols})"
        )
        if self.min_length is not None:
            _check(
                1 <= self.min_length <= self.length,
                "Copy",
                "min_length",
                f"must be in [1, length={self.length}] (got {self.min_length})",
            )

    @property
    def vocab_size(self) -> int:
        return self.FIRST_SYMBOL + self.num_symbols

    @property
    def seq_len(self) -> int:
        return 2 * self.length + 2

    def batch(self, rng: np.random.Generator, n: int) -> Batch:
        src = self.FIRST_SYMBOL + rng.integers(0, self.num_symbols, size=(n, self.length))
        L = _lengths(rng, n, self.min_length, self.length)
        t = np.arange(self.seq_len)[None, :]
        first, second = t < L, (t > L) & (t <= 2 * L)
        idx = np.clip(np.where(first, t, t - L - 1), 0, self.length - 1)
        sym = np.take_along_axis(src, idx, axis=1)
        seq = np.select([first | second, t == L, t == 2 * L + 1], [sym, self.SEP, self.EOS], PAD)
        return _next_token(seq, (t >= L) & (t <= 2 * L))


@dataclasses.dataclass(frozen=True)
class AssociativeRecall(_Task):
    """Multi-query associative recall (Zoology's MQAR), queries packed densely after the context.

    ``k1 v1 k2 v2 ... kP vP q1 a1 ... qQ aQ``: P pairs with distinct keys and random values, then
    Q distinct keys from the context each followed by its value. Layout: PAD=0, keys
    1..num_keys, values num_keys+1..num_keys+num_values. The mask is on the Q query-key positions,
    whose targets are the recalled values. ``seq_len = 2 * (num_pairs + num_queries)``.
    """

    num_pairs: int = 8
    num_keys: int = 32
    num_values: int = 32
    num_queries: int = 8

    FIRST_KEY: ClassVar[int] = 1

    def __post_init__(self):
        name = "AssociativeRecall"
        for field in ("num_pairs", "num_keys", "num_values", "num_queries"):
            value = getattr(self, field)
            _check(value >= 1, name, field, f"must be >= 1 (got {value})")
        _check(
            self.num_pairs <= self.num_keys,
            name,
            "num_pairs",
            f"must be <= num_keys={self.num_keys} so keys are distinct (got {self.num_pairs})",
        )
        _check(
            self.num_queries <= self.num_pairs,
            name,
            "num_queries",
            f"must be <= num_pairs={self.num_pairs} (got {self.num_queries})",
        )

    @property
    def first_value(self) -> int:
        return self.FIRST_KEY + self.num_keys

    @property
    def vocab_size(self) -> int:
        return self.first_value + self.num_values

    @property
    def seq_len(self) -> int:
        return 2 * (self.num_pairs + self.num_queries)

    def batch(self, rng: np.random.Generator, n: int) -> Batch:
        P, Q = self.num_pairs, self.num_queries
        keys = rng.permuted(np.tile(np.arange(self.num_keys), (n, 1)), axis=1)[:, :P]
        keys = self.FIRST_KEY + keys
        values = self.first_value + rng.integers(0, self.num_values, size=(n, P))
        which = rng.permuted(np.tile(np.arange(P), (n, 1)), axis=1)[:, :Q]
        q_keys = np.take_along_axis(keys, which, axis=1)
        q_values = np.take_along_axis(values, which, axis=1)
        context = np.stack([keys, values], axis=-1).reshape(n, 2 * P)
        queries = np.stack([q_keys, q_values], axis=-1).reshape(n, 2 * Q)
        seq = np.concatenate([context, queries], axis=1)
        t = np.arange(self.seq_len)
        mask = np.broadcast_to((t >= 2 * P) & ((t - 2 * P) % 2 == 0), seq.shape)
        return _next_token(seq, mask)


@dataclasses.dataclass(frozen=True)
class PrefixParity(_Task):
    """Random bits labelled with their running parity: ``targets[t] = b_0 xor ... xor b_t``.

    Per-position labels, not next-token. Layout: PAD=0, bit tokens ZERO=1 and ONE=2, used for
    both inputs and targets, so vocab_size = 3. The mask covers every real position. With
    ``min_length`` the length is uniform on [min_length, length], padded to ``length``; test length
    generalisation by building a task with a larger ``length``.
    """

    length: int = 64
    min_length: int | None = None

    ZERO: ClassVar[int] = 1
    ONE: ClassVar[int] = 2

    def __post_init__(self):
        _check(self.length >= 1, "PrefixParity", "length", f"must be >= 1 (got {self.length})")
        if self.min_length is not None:
            _check(
                1 <= self.min_length <= self.length,
                "PrefixParity",
                "min_length",
                f"must be in [1, length={self.length}] (got {self.min_length})",
            )

    @property
    def vocab_size(self) -> int:
        return 3

    @property
    def seq_len(self) -> int:
        return self.length

    def batch(self, rng: np.random.Generator, n: int) -> Batch:
        bits = rng.integers(0, 2, size=(n, self.length))
        real = np.arange(self.length)[None, :] < _lengths(rng, n, self.min_length, self.length)
        parity = np.cumsum(bits, axis=1) % 2
        return {
            "inputs": np.where(real, self.ZERO + bits, PAD).astype(np.int32),
            "targets": np.where(real, self.ZERO + parity, PAD).astype(np.int32),
            "mask": real.astype(np.float32),
        }


_OPS = {"+": np.add, "-": np.subtract, "*": np.multiply}


@dataclasses.dataclass(frozen=True)
class ModularArithmetic(_Task):
    """Left-to-right modular expression with a scratchpad of running results.

    ``a1 o1 a2 ... aN = r1 ; r2 ; ... ; r_{N-1} # ans EOS`` where ``r_k = r_{k-1} o_k a_{k+1}
    (mod p)`` evaluated left to right (no precedence), ``r_0 = a1``, and ``ans = r_{N-1}``.
    Layout: PAD=0, '='=1, ';'=2, '#'=3 (answer marker), EOS=4, '+'=5, '-'=6, '*'=7, numbers
    0..p-1 at 8..8+p-1; vocab_size = 8 + modulus, seq_len = 4 * num_terms.

    The mask covers the whole completion after '=' (scratchpad, separators, marker, answer, EOS),
    so sampling from a trained model yields a parseable answer. For answer accuracy look only at
    ``"answer_pos"`` (the position whose target is ``ans``; its input is '#').
    """

    modulus: int = 11
    num_terms: int = 4
    ops: tuple[str, ...] = ("+", "-", "*")

    EQ: ClassVar[int] = 1
    SEP: ClassVar[int] = 2
    ANS: ClassVar[int] = 3
    EOS: ClassVar[int] = 4
    OP_TOKENS: ClassVar[dict[str, int]] = {"+": 5, "-": 6, "*": 7}
    FIRST_NUMBER: ClassVar[int] = 8

    def __post_init__(self):
        name = "ModularArithmetic"
        _check(self.modulus >= 2, name, "modulus", f"must be >= 2 (got {self.modulus})")
        _check(self.num_terms >= 2, name, "num_terms", f"must be >= 2 (got {self.num_terms})")
        ops = (self.ops,) if isinstance(self.ops, str) else tuple(self.ops)
        object.__setattr__(self, "ops", ops)
        _check(len(ops) > 0, name, "ops", "must be non-empty")
        bad = [op for op in ops if op not in _OPS]
        _check(not bad, name, "ops", f"has unknown op(s) {bad}; expected a subset of {list(_OPS)}")

    @property
    def vocab_size(self) -> int:
        return self.FIRST_NUMBER + self.modulus

    @property
    def seq_len(self) -> int:
        return 4 * self.num_terms

    @property
    def answer_pos(self) -> int:
        return self.seq_len - 3

    def batch(self, rng: np.random.Generator, n: int) -> Batch:
        N, p = self.num_terms, self.modulus
        nums = rng.integers(0, p, size=(n, N))
        op_idx = rng.integers(0, len(self.ops), size=(n, N - 1))
        results = np.empty((n, N - 1), dtype=np.int64)
        acc = nums[:, 0]
        for k in range(N - 1):
            step = [_OPS[op](acc, nums[:, k + 1]) for op in self.ops]
            acc = np.choose(op_idx[:, k], step) % p
            results[:, k] = acc
        op_tokens = np.array([self.OP_TOKENS[op] for op in self.ops])[op_idx]

        seq = np.empty((n, self.seq_len), dtype=np.int64)
        seq[:, 0 : 2 * N - 1 : 2] = self.FIRST_NUMBER + nums
        seq[:, 1 : 2 * N - 2 : 2] = op_tokens
        seq[:, 2 * N - 1] = self.EQ
        seq[:, 2 * N : 4 * N - 3 : 2] = self.FIRST_NUMBER + results
        seq[:, 2 * N + 1 : 4 * N - 4 : 2] = self.SEP
        seq[:, 4 * N - 3] = self.ANS
        seq[:, 4 * N - 2] = self.FIRST_NUMBER + acc
        seq[:, 4 * N - 1] = self.EOS
        t = np.arange(self.seq_len)
        mask = np.broadcast_to((t >= 2 * N - 1) & (t <= 4 * N - 2), seq.shape)
        return _next_token(seq, mask, answer_pos=np.full((n,), self.answer_pos))


TASKS: dict[str, type[_Task]] = {
    "copy": Copy,
    "mqar": AssociativeRecall,
    "parity": PrefixParity,
    "modular": ModularArithmetic,
}


def make_task(name: str, **kwargs) -> _Task:
    """Build a task by its config name, e.g. ``make_task("mqar", num_pairs=16, num_keys=64)``."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; expected one of: {', '.join(TASKS)}")
    return TASKS[name](**kwargs)


def exact_match(predictions: np.ndarray, batch: Batch) -> np.ndarray:
    """Per-sequence exact match: every masked prediction equals its target. ``bool[n]``."""
    wrong = (np.asarray(predictions) != batch["targets"]) & (batch["mask"] > 0)
    return ~wrong.any(axis=-1)
