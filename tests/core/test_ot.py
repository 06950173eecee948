"""core.ot: the exact coupling against brute force over permutations, W1 against a linear
program and a translation's closed form, the chain of maps, sampling from a plan, bad inputs."""

import itertools

import numpy as np
import pytest
from scipy.optimize import linprog
from scipy.spatial.distance import cdist

from core import ot
from core.errors import ConfigError

PERMUTATIONS_P6 = np.array(list(itertools.permutations(range(6))))  # all 720


def brute_force_permutation(x_ND, y_ND, metric):
    """The permutation p minimising sum_i cost(x_i, y_p(i)), by trying all of them."""
    C = cdist(x_ND, y_ND, metric=metric)
    totals = C[np.arange(6), PERMUTATIONS_P6].sum(axis=1)
    return PERMUTATIONS_P6[np.argmin(totals)]


@pytest.mark.parametrize("cost", ["sqeuclidean", "euclidean"])
def test_exact_coupling_is_the_best_permutation(cost):
    rng = np.random.default_rng(1)
    for _ in range(10):
        x, y = rng.normal(size=(6, 3)), rng.normal(size=(6, 3)) + 0.5
        # Random reals: the optimum is unique almost surely, so the indices must agree exactly.
        np.testing.assert_array_equal(
            ot.exact_coupling(x, y, cost), brute_force_permutation(x, y, cost)
        )


def test_exact_coupling_takes_float32_and_unequal_sizes():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(4, 2)).astype(np.float32)
    # Two copies of each x, jittered: every x's mass goes to its own two copies, half each.
    y = np.concatenate([x, x]) + rng.normal(size=(8, 2)).astype(np.float32) * 1e-3
    plan = ot.exact_plan(x, y)
    np.testing.assert_allclose(plan.sum(axis=1), 1 / 4)
    np.testing.assert_allclose(plan.sum(axis=0), 1 / 8)
    np.testing.assert_array_equal(ot.exact_coupling(x, y) % 4, np.arange(4))
    # N > M: several rows share a partner (the argmax of each row).
    np.testing.assert_array_equal(ot.exact_coupling(y, x), np.arange(8) % 4)


def lp_w1(x_ND, y_MD):
    """W1 as the transport LP: min <P, D> over P >= 0 with rows 1/N and columns 1/M."""
    N, M = len(x_ND), len(y_MD)
    D = cdist(x_ND, y_MD)
    rows = np.kron(np.eye(N), np.ones((1, M)))  # sum_j P_ij
    cols = np.kron(np.ones((1, N)), np.eye(M))  # sum_i P_ij
    A_eq = np.concatenate([rows, cols])
    b_eq = np.concatenate([np.full(N, 1 / N), np.full(M, 1 / M)])
    result = linprog(D.ravel(), A_eq=A_eq, b_eq=b_eq, bounds=(0, None), method="highs")
    assert result.status == 0
    return result.fun


def test_w1_equals_the_linear_program_on_unequal_sets():
    rng = np.random.default_rng(3)
    for _ in range(5):
        x, y = rng.normal(size=(5, 2)), rng.normal(size=(7, 2)) * 1.5 + 0.3
        assert ot.w1(x, y) == pytest.approx(lp_w1(x, y), rel=1e-9, abs=1e-12)  # both float64
        assert ot.w1(y, x) == pytest.approx(ot.w1(x, y), rel=1e-12)


def test_w1_of_a_translate_is_the_shift():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(9, 1))
    y = rng.permutation(x + 0.8)  # the same points moved by 0.8, in another order
    # Kantorovich-Rubinstein with f(z) = z gives W1 >= |mean shift| = 0.8; moving each point by
    # 0.8 costs exactly that, so W1 = 0.8.
    assert ot.w1(x, y) == pytest.approx(0.8, rel=1e-12)
    assert ot.w1(x, x) == 0.0


def test_chain_composes_the_pairwise_maps():
    rng = np.random.default_rng(5)
    clouds = [rng.normal(size=(6, 2)) + k for k in range(4)]
    idx_KN = ot.chain(clouds)
    assert idx_KN.shape == (4, 6)
    np.testing.assert_array_equal(idx_KN[0], np.arange(6))
    # Equal sizes: each step is a permutation, and a permutation of the source rows permutes the
    # plan's rows, so following the chain is composing the maps between the original clouds.
    composed = np.arange(6)
    for k in range(1, 4):
        composed = ot.exact_coupling(clouds[k - 1], clouds[k])[composed]
        np.testing.assert_array_equal(idx_KN[k], composed)
        assert sorted(idx_KN[k]) == list(range(6))


def test_chain_with_unequal_sizes_transports_the_reached_points():
    rng = np.random.default_rng(6)
    clouds = [rng.normal(size=(5, 2)), rng.normal(size=(7, 2)), rng.normal(size=(3, 2))]
    idx_KN = ot.chain(clouds)
    assert idx_KN.shape == (3, 5)
    np.testing.assert_array_equal(idx_KN[1], ot.exact_coupling(clouds[0], clouds[1]))
    np.testing.assert_array_equal(idx_KN[2], ot.exact_coupling(clouds[1][idx_KN[1]], clouds[2]))


def test_sample_plan_draws_pairs_in_proportion_to_the_plan():
    plan = np.array([[0.1, 0.0, 0.3], [0.0, 0.6, 0.0]])
    i_n, j_n = ot.sample_plan(plan, np.random.default_rng(7), 20_000)
    assert i_n.shape == j_n.shape == (20_000,)
    counts = np.zeros_like(plan)
    np.add.at(counts, (i_n, j_n), 1)
    np.testing.assert_allclose(counts / 20_000, plan, atol=0.015)  # ~4 sigma at p = 0.5
    # From an exact plan between equal sizes every draw is a coupled pair.
    rng = np.random.default_rng(8)
    x, y = rng.normal(size=(6, 2)), rng.normal(size=(6, 2))
    i_n, j_n = ot.sample_plan(ot.exact_plan(x, y), rng, 50)
    np.testing.assert_array_equal(j_n, ot.exact_coupling(x, y)[i_n])


def test_an_unfinished_solve_raises_instead_of_returning_a_suboptimal_plan():
    x = np.random.default_rng(9).normal(size=(30, 2))
    with pytest.raises(RuntimeError, match="max_iter=3"):
        ot.w1(x, x + 1, max_iter=3)


GOOD = np.zeros((4, 2))


@pytest.mark.parametrize(
    "call, names",
    [
        (lambda: ot.exact_coupling(np.zeros(4), GOOD), "exact_coupling: x: shape"),
        (lambda: ot.exact_coupling(GOOD, np.zeros((4, 3))), "x has 2 dims, y has 3"),
        (lambda: ot.exact_coupling(GOOD, np.zeros((0, 2))), "y: shape .* empty"),
        (lambda: ot.exact_coupling(GOOD, GOOD, "cosine"), "cost 'cosine'"),
        (lambda: ot.exact_plan(GOOD, np.full((4, 2), np.nan)), "y: 8 non-finite"),
        (lambda: ot.w1(np.zeros((2, 2, 2)), GOOD), "w1: x: shape"),
        (lambda: ot.w1(GOOD, np.zeros((3, 1))), "w1: x has 2 dims"),
        (lambda: ot.w1(np.zeros((4, 0)), np.zeros((4, 0))), "w1: x: shape .* empty"),
        (lambda: ot.chain([GOOD]), "chain: 1 clouds"),
        (lambda: ot.chain([GOOD, GOOD, np.zeros((4, 3))]), r"clouds\[2\] has 3 dims"),
        (lambda: ot.chain([GOOD, np.zeros((0, 2))]), r"clouds\[1\]: shape"),
        (lambda: ot.sample_plan(np.zeros((2, 2)), np.random.default_rng(0), 3), "not all zero"),
        (lambda: ot.sample_plan(np.ones(3), np.random.default_rng(0), 3), "plan shape"),
        (lambda: ot.sample_plan(np.ones((2, 2)), np.random.default_rng(0), 0), "n=0"),
    ],
)
def test_bad_inputs_raise_one_line_config_errors(call, names):
    with pytest.raises(ConfigError, match=names) as error:
        call()
    assert "\n" not in str(error.value)
