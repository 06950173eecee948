"""Synthetic LM tasks: each answer is recomputed independently from the inputs, in plain Python."""

import numpy as np
import pytest

from core.tasks import (
    PAD,
    TASKS,
    AssociativeRecall,
    Copy,
    ModularArithmetic,
    PrefixParity,
    exact_match,
    make_task,
)

N = 64

# Small vocabularies so collisions, repeats and short lengths all occur within one batch.
VARIANTS = {
    "copy": Copy(length=6, num_symbols=4),
    "copy_var": Copy(length=6, num_symbols=4, min_length=1),
    "mqar": AssociativeRecall(num_pairs=4, num_keys=6, num_values=3, num_queries=3),
    "parity": PrefixParity(length=16),
    "parity_var": PrefixParity(length=16, min_length=1),
    "modular": ModularArithmetic(modulus=7, num_terms=5),
    "default_copy": Copy(),
    "default_mqar": AssociativeRecall(),
    "default_parity": PrefixParity(),
    "default_modular": ModularArithmetic(),
}
NEXT_TOKEN = [k for k, t in VARIANTS.items() if not isinstance(t, PrefixParity)]


def _batch(key, seed=0, n=N):
    return VARIANTS[key].batch(np.random.default_rng(seed), n)


@pytest.mark.parametrize("key", VARIANTS)
def test_shapes_dtypes_token_range_and_padding(key):
    task = VARIANTS[key]
    b = _batch(key)
    T = task.seq_len
    for name, dtype in [("inputs", np.int32), ("targets", np.int32), ("mask", np.float32)]:
        assert b[name].shape == (N, T) and b[name].dtype == dtype, name
    for name in ("inputs", "targets"):
        assert b[name].min() >= 0 and b[name].max() < task.vocab_size, name
    assert set(np.unique(b["mask"])) <= {0.0, 1.0}
    assert (b["mask"].sum(1) > 0).all()
    assert (b["mask"][b["inputs"] == PAD] == 0).all()
    assert (b["targets"][b["mask"] == 1] != PAD).all()
    ex = task.example(np.random.default_rng(0))
    assert ex.keys() == b.keys()
    assert all(ex[k].shape == b[k].shape[1:] and ex[k].dtype == b[k].dtype for k in b)


@pytest.mark.parametrize("key", VARIANTS)
def test_deterministic_in_the_generator(key):
    task = VARIANTS[key]
    a, b, c = _batch(key, 1), _batch(key, 1), _batch(key, 2)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["inputs"], c["inputs"])
    one = task.example(np.random.default_rng([7, 3]))
    first = task.batch(np.random.default_rng([7, 3]), 1)
    assert all(np.array_equal(one[k], first[k][0]) for k in one)
    assert not np.array_equal(one["inputs"], task.example(np.random.default_rng([7, 4]))["inputs"])


@pytest.mark.parametrize("key", NEXT_TOKEN)
def test_next_token_form(key):
    b = _batch(key)
    assert np.array_equal(b["targets"][:, :-1], b["inputs"][:, 1:])
    assert (b["targets"][:, -1] == PAD).all() and (b["mask"][:, -1] == 0).all()


@pytest.mark.parametrize("key", ["copy", "copy_var", "default_copy"])
def test_copy_reproduces_the_source(key):
    task, b = VARIANTS[key], _batch(key)
    lengths = set()
    for x, y, m in zip(b["inputs"], b["targets"], b["mask"], strict=True):
        L = int(np.argmax(x == Copy.SEP))
        lengths.add(L)
        src = x[:L]
        assert ((src >= Copy.FIRST_SYMBOL) & (src < task.vocab_size)).all()
        assert list(y[m == 1]) == [*src, Copy.EOS]
        assert np.flatnonzero(m).tolist() == list(range(L, 2 * L + 1))
        assert (x[2 * L + 2 :] == PAD).all()
    if task.min_length is None:
        assert lengths == {task.length}
    else:
        assert len(lengths) > 3 and max(lengths) <= task.length


@pytest.mark.parametrize("key", ["mqar", "default_mqar"])
def test_mqar_masked_targets_are_the_queried_values(key):
    task, b = VARIANTS[key], _batch(key)
    P = task.num_pairs
    for x, y, m in zip(b["inputs"], b["targets"], b["mask"], strict=True):
        keys, values = x[: 2 * P : 2].tolist(), x[1 : 2 * P : 2].tolist()
        assert len(set(keys)) == P
        assert min(keys) >= AssociativeRecall.FIRST_KEY and max(keys) < task.first_value
        assert min(values) >= task.first_value and max(values) < task.vocab_size
        table = dict(zip(keys, values, strict=True))
        queried = x[m == 1].tolist()
        assert len(queried) == len(set(queried)) == task.num_queries
        assert y[m == 1].tolist() == [table[k] for k in queried]


@pytest.mark.parametrize("key", ["parity", "parity_var"])
def test_parity_targets_are_running_xor(key):
    task, b = VARIANTS[key], _batch(key)
    lengths = set()
    for x, y, m in zip(b["inputs"], b["targets"], b["mask"], strict=True):
        real = int(m.sum())
        lengths.add(real)
        assert (m[:real] == 1).all() and (x[real:] == PAD).all() and (y[real:] == PAD).all()
        acc, want = 0, []
        for tok in x[:real]:
            acc ^= {PrefixParity.ZERO: 0, PrefixParity.ONE: 1}[int(tok)]
            want.append(PrefixParity.ONE if acc else PrefixParity.ZERO)
        assert y[:real].tolist() == want
    if task.min_length is None:
        assert lengths == {task.length}
    else:
        assert len(lengths) > 5


def test_parity_longer_task_for_length_generalisation():
    train = make_task("parity", length=64, min_length=32)
    test = make_task("parity", length=512)
    assert test.seq_len == 512 and test.vocab_size == train.vocab_size == 3
    b = test.batch(np.random.default_rng(0), 4)
    assert b["mask"].sum() == 4 * 512
    assert np.array_equal(b["targets"] - 1, np.cumsum(b["inputs"] - 1, axis=1) % 2)


def _evaluate(x, task):
    """Parse ``a1 o1 a2 ... aN =`` and evaluate left to right mod p, in Python ints."""
    first, ops = task.FIRST_NUMBER, {v: k for k, v in task.OP_TOKENS.items()}
    acc, results = int(x[0]) - first, []
    for k in range(1, task.num_terms):
        op, a = ops[int(x[2 * k - 1])], int(x[2 * k]) - first
        acc = {"+": acc + a, "-": acc - a, "*": acc * a}[op] % task.modulus
        results.append(acc + first)
    return results


@pytest.mark.parametrize("key", ["modular", "default_modular"])
def test_modular_scratchpad_is_left_to_right_evaluation(key):
    task, b = VARIANTS[key], _batch(key)
    N = task.num_terms
    seen_ops = set()
    for x, y, m, pos in zip(b["inputs"], b["targets"], b["mask"], b["answer_pos"], strict=True):
        seen_ops.update(x[1 : 2 * N - 2 : 2].tolist())
        assert x[2 * N - 1] == task.EQ
        results = _evaluate(x, task)
        completion = x[2 * N :].tolist()
        assert completion[0:-3:2] == results
        assert completion[1:-3:2] == [task.SEP] * (N - 2)
        assert completion[-3:] == [task.ANS, results[-1], task.EOS]
        assert x[pos] == task.ANS and y[pos] == results[-1]
        assert np.flatnonzero(m).tolist() == list(range(2 * N - 1, 4 * N - 1))
    assert seen_ops == set(task.OP_TOKENS.values())


def test_modular_respects_the_op_subset():
    task = ModularArithmetic(modulus=5, num_terms=6, ops=["-"])
    assert task.ops == ("-",)
    x = task.batch(np.random.default_rng(0), 16)["inputs"]
    assert (x[:, 1:10:2] == task.OP_TOKENS["-"]).all()


def test_exact_match_uses_only_masked_positions():
    b = _batch("modular", n=4)
    pred = b["targets"].copy()
    pred[:, 0] = 1  # unmasked: ignored
    pred[2, b["answer_pos"][2]] += 1  # masked: sequence 2 is now wrong
    assert exact_match(pred, b).tolist() == [True, True, False, True]


def test_make_task_and_unknown_name():
    assert set(TASKS) == {"copy", "mqar", "parity", "modular"}
    assert make_task("mqar", num_pairs=2, num_keys=2, num_queries=1) == AssociativeRecall(
        num_pairs=2, num_keys=2, num_queries=1
    )
    with pytest.raises(ValueError) as err:
        make_task("foo")
    assert str(err.value) == "unknown task 'foo'; expected one of: copy, mqar, parity, modular"


@pytest.mark.parametrize(
    "name, kwargs, field",
    [
        ("copy", dict(length=0), "length"),
        ("copy", dict(num_symbols=0), "num_symbols"),
        ("copy", dict(length=4, min_length=5), "min_length"),
        ("copy", dict(min_length=0), "min_length"),
        ("mqar", dict(num_pairs=9, num_keys=8), "num_pairs"),
        ("mqar", dict(num_pairs=4, num_queries=5), "num_queries"),
        ("mqar", dict(num_values=0), "num_values"),
        ("parity", dict(length=-1), "length"),
        ("parity", dict(length=8, min_length=9), "min_length"),
        ("modular", dict(modulus=1), "modulus"),
        ("modular", dict(num_terms=1), "num_terms"),
        ("modular", dict(ops=("+", "/")), "ops"),
        ("modular", dict(ops=()), "ops"),
    ],
)
def test_invalid_parameters_name_the_field(name, kwargs, field):
    with pytest.raises(ValueError, match=rf"\.{field} ") as err:
        make_task(name, **kwargs)
    assert "\n" not in str(err.value)
