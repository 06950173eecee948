"""Parallel Token Prediction (methods/flow_mtp): bin edges, lossless verification, the slot
mask, the toy teacher, and the quick experiment."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import methods.flow_mtp as flow_mtp
from configs import flow_mtp as flow_mtp_config
from core.errors import ConfigError
from methods.flow_mtp import bins, decode, experiment, model
from methods.flow_mtp import teacher as teachers

# ------------------------------------------------------------------ bins


def tiny_bin_probs() -> np.ndarray:
    """A distribution with bins from 0.6 down to 1e-30, several of them narrower than 1e-6 at
    CDF values (0.6-0.8) where float32 spacing is 6e-8: a few ulps wide."""
    p = np.array(
        [0.6, 2e-7, 3e-7, 1e-6, 4e-7, 0.2, 1.5e-7, 5e-7, 1e-30, 0.15, 8e-7, 1e-3, 0.0, 0.04899]
    )
    return (p / p.sum()).astype(np.float32)


def test_every_bin_decodes_to_its_token_including_bins_narrower_than_1e_6():
    edges = bins.cdf_edges(jnp.asarray(tiny_bin_probs()))
    assert float(edges[-1]) == 1.0  # every u in [0, 1) lands in some bin
    width = np.diff(np.asarray(edges))
    nonempty = np.flatnonzero(width > 0)
    tiny = [j for j in nonempty if width[j] < 1e-6]
    assert len(tiny) >= 5, width  # the test is about them
    # z = 1 (Beta(.3, .3) puts mass there) would round u onto the right edge without the clamp.
    z = np.concatenate(
        [[0.0, 1e-7, 0.5, 1 - 1e-7, 1.0], np.random.default_rng(0).beta(0.3, 0.3, 200)]
    )
    for j in nonempty:
        tokens = jnp.full(z.shape, j)
        left, right = bins.token_bin(jnp.broadcast_to(edges, (*z.shape, edges.shape[0])), tokens)
        u = bins.u_in_bin(left, right, jnp.asarray(z, jnp.float32))
        picked = bins.pick(jnp.broadcast_to(edges, (*z.shape, edges.shape[0])), u)
        assert np.all(np.asarray(picked) == j), (j, width[j], np.asarray(picked))
    # Zero-width bins (probability 0, or below float32 resolution at its CDF) are never picked.
    u = jax.random.uniform(jax.random.PRNGKey(0), (20000,))
    picked = np.asarray(bins.pick(jnp.broadcast_to(edges, (20000, edges.shape[0])), u))
    assert set(picked) <= set(nonempty)


def test_sampling_transform_top_k_and_top_p():
    logits = jnp.log(jnp.array([0.1, 0.4, 0.05, 0.3, 0.15]))
    top2 = np.asarray(bins.sampling_probs(logits, bins.SamplingTransform(top_k=2)))
    np.testing.assert_allclose(top2, [0, 4 / 7, 0, 3 / 7, 0], rtol=1e-6)  # float32 softmax
    # top-p 0.75: 0.4 + 0.3 = 0.7 < 0.75, so 0.15 (the token that crosses it) is kept too.
    top_p = np.asarray(bins.sampling_probs(logits, bins.SamplingTransform(top_p=0.75)))
    np.testing.assert_allclose(top_p, [0, 0.4 / 0.85, 0, 0.3 / 0.85, 0.15 / 0.85], rtol=1e-6)
    # Ties at the k-th logit: exactly k tokens stay, the lower ids first (the shared sampler's
    # rule, `core.nn.sampler.filter_logits`, so edges and sampling agree on which tokens).
    tied = jnp.log(jnp.array([0.1, 0.3, 0.3, 0.3]))
    kept = np.asarray(bins.sampling_probs(tied, bins.SamplingTransform(top_k=2)))
    np.testing.assert_allclose(kept, [0, 0.5, 0.5, 0], rtol=1e-6)  # float32 softmax
    hot = np.asarray(bins.sampling_probs(logits, bins.SamplingTransform(temperature=0.5)))
    expect = np.array([0.1, 0.4, 0.05, 0.3, 0.15]) ** 2
    np.testing.assert_allclose(hot, expect / expect.sum(), rtol=1e-5)  # float32 exp/log


# ------------------------------------------------------------------ verification


V_SMALL, N_TOKENS, DRAWS = 4, 2, 20000


def oracle(teacher, transform):
    """What a perfectly trained student gives: the teacher's own inverse-CDF rollout from the
    u's under the transform its training bins were computed with."""
    edges_VE = jnp.asarray(teacher.edges_VE(transform))

    def propose(context_BC, context_mask_BC, u_BL):
        del context_mask_BC

        def step(prev_B, u_B):
            nxt = bins.pick(edges_VE[prev_B], u_B)
            return nxt, nxt

        _, out_LB = jax.lax.scan(step, context_BC[:, -1], u_BL.T)
        return out_LB.T

    return propose


def generated_counts(propose, teacher, verify_transform, L):
    prompt = jnp.zeros((DRAWS, 2), jnp.int32)
    mask = jnp.array([[False, True]] * DRAWS)
    run = jax.jit(
        functools.partial(
            decode.generate,
            propose,
            decode.markov_teacher_probs(teacher, verify_transform),
            num_tokens=N_TOKENS,
            completion_len=L,
        )
    )
    out = jax.device_get(run(prompt, mask, jax.random.PRNGKey(7)))
    cells = np.asarray(out.tokens_BN) @ (V_SMALL ** np.arange(N_TOKENS)[::-1])
    return np.bincount(cells, minlength=V_SMALL**N_TOKENS), out


def teacher_cell_probs(teacher, transform):
    """Exact probability of every N_TOKENS-token continuation of the start token."""
    table = np.asarray(
        bins.sampling_probs(jnp.log(jnp.asarray(teacher.table_VV, jnp.float32)), transform),
        np.float64,
    )
    probs = np.zeros(V_SMALL**N_TOKENS)
    for cell in range(V_SMALL**N_TOKENS):
        seq = [teacher.start_token] + [
            (cell // V_SMALL ** (N_TOKENS - 1 - i)) % V_SMALL for i in range(N_TOKENS)
        ]
        probs[cell] = np.prod([table[a, b] for a, b in zip(seq, seq[1:], strict=False)])
    return probs / probs.sum()


def chi_square_p(counts, probs) -> float:
    """Pearson's test; cells expecting fewer than 5 draws pooled into one."""
    expected = probs * counts.sum()
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    return float(stats.chisquare(obs[keep], exp[keep]).pvalue)


# A lossless decoder fails this test with probability 1e-3 (the test's level); the draws are
# seeded, so the outcome is fixed. A 20 % change in one transition probability moves the
# statistic far past it at 20,000 draws (see the mismatch test: p < 1e-12).
ALPHA = 1e-3


def test_verification_is_lossless_for_any_student():
    """An untrained student (arbitrary proposals) and the oracle both give exact teacher
    samples: the distribution of the generated continuations equals the teacher's."""
    teacher = teachers.random_markov(V_SMALL, seed=3)
    transform = bins.SamplingTransform(temperature=0.7)
    config = flow_mtp_config.get_config("size=smoke")
    config.teacher.vocab_size, config.ptp.context_len, config.ptp.completion_len = V_SMALL, 2, 3
    cfg = flow_mtp.student_config(config)
    params = model.init_params(cfg, jax.random.PRNGKey(0))
    probs = teacher_cell_probs(teacher, transform)
    for propose in (
        functools.partial(decode.student_proposal, cfg, params),
        oracle(teacher, transform),
    ):
        counts, _ = generated_counts(propose, teacher, transform, L=3)
        assert chi_square_p(counts, probs) > ALPHA


def test_temperature_in_only_one_of_edges_and_verification_breaks_losslessness():
    """The oracle student of bins at temperature 0.7 is accepted in full (L + 1 tokens per call)
    when verification uses 0.7 too; verified at 1.0 it is sometimes rejected, and the output is
    no longer the temperature-0.7 teacher's distribution."""
    teacher = teachers.random_markov(V_SMALL, seed=3)
    edges_transform = bins.SamplingTransform(temperature=0.7)
    propose = oracle(teacher, edges_transform)
    probs = teacher_cell_probs(teacher, edges_transform)
    L = 3

    counts, out = generated_counts(propose, teacher, edges_transform, L)
    assert int(out.accepted) == int(out.calls) * (L + 1)  # every proposal accepted
    assert chi_square_p(counts, probs) > ALPHA

    counts, out = generated_counts(propose, teacher, bins.SamplingTransform(temperature=1.0), L)
    assert int(out.calls) > DRAWS  # some rows needed a second round: a proposal was rejected
    assert int(out.accepted) < int(out.calls) * (L + 1)
    assert chi_square_p(counts, probs) < 1e-12


# ------------------------------------------------------------------ the student's mask


def small_student(context_len=3, completion_len=5):
    config = flow_mtp_config.get_config("size=smoke")
    config.ptp.context_len, config.ptp.completion_len = context_len, completion_len
    cfg = flow_mtp.student_config(config)
    return cfg, model.init_params(cfg, jax.random.PRNGKey(1))


@pytest.mark.parametrize("shift", [False, True])
def test_slot_k_sees_the_context_and_slots_up_to_k_only(shift):
    cfg, params = small_student()
    cfg = dataclasses.replace(cfg, shift_positions=shift)
    L = cfg.completion_len
    logits = jax.jit(functools.partial(model.student_logits, cfg, params))
    context = jnp.array([[0, 4, 5]])
    mask = jnp.array([[False, True, True]])
    u = jnp.linspace(0.1, 0.9, L)[None]
    base = np.asarray(logits(context, mask, u))[0]
    for j in range(L):
        moved = np.asarray(logits(context, mask, u.at[0, j].add(0.05)))[0]
        for k in range(L):
            if j > k:  # masked keys get probability exactly 0: bitwise the same logits
                np.testing.assert_array_equal(moved[k], base[k])
            else:  # slot k reads u_j (j <= k); the change is far above float32 rounding
                assert np.abs(moved[k] - base[k]).max() > 1e-4, (j, k)
    # Every slot sees the real context; no slot sees a padded (masked) context token.
    other = np.asarray(logits(context.at[0, 2].set(9), mask, u))[0]
    assert np.all(np.abs(other - base).max(-1) > 1e-4)
    padded = np.asarray(logits(context.at[0, 0].set(9), mask, u))[0]
    np.testing.assert_array_equal(padded, base)


def test_shift_positions_moves_the_slots_only_and_reaches_the_student():
    """shift_positions (the official -1): the slots' positions change (their logits move), the
    context's do not (bitwise: causal), and the student's option is this forward's."""
    cfg, params = small_student()
    context, mask = jnp.array([[0, 4, 5]]), jnp.array([[False, True, True]])
    u = jnp.linspace(0.1, 0.9, cfg.completion_len)[None]
    tail = model.u_embedding(params["u_anchors"], u)
    plain = np.asarray(model.sequence_logits(cfg, params, context, mask, tail))
    shifted = np.asarray(model.sequence_logits(cfg, params, context, mask, tail, shift_tail=True))
    C = context.shape[1]
    np.testing.assert_array_equal(plain[:, :C], shifted[:, :C])
    assert np.abs(plain[:, C:] - shifted[:, C:]).max() > 1e-4  # far above float32 rounding
    student = dataclasses.replace(cfg, shift_positions=True)
    np.testing.assert_array_equal(
        np.asarray(model.student_logits(student, params, context, mask, u)), shifted[:, C:]
    )


def test_no_u_baseline_ignores_u():
    cfg, params = small_student()
    cfg = dataclasses.replace(cfg, use_u=False)
    context, mask = jnp.array([[0, 4, 5]]), jnp.ones((1, 3), bool)
    a = model.student_logits(cfg, params, context, mask, jnp.full((1, 5), 0.2))
    b = model.student_logits(cfg, params, context, mask, jnp.full((1, 5), 0.8))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ------------------------------------------------------------------ teacher and data


def test_toy_teacher_is_the_official_increasing_sequence():
    t = teachers.increasing_sequence(100)
    table = np.asarray(t.table_VV)
    assert table[7, 7] == table[7, 8] == 0.5 and table[7].sum() == 1.0
    assert table[99, 99] == 1.0  # absorbing at V - 1
    seqs = np.stack([t.sample(np.random.default_rng(i), 40) for i in range(500)])
    assert np.all(seqs[:, 0] == 0)  # sequences start at token 0
    steps = np.diff(seqs, axis=1)
    assert set(np.unique(steps)) == {0, 1}
    # Half the steps go up: 500 x 39 fair coin flips have a standard error of 0.0036.
    assert abs(steps.mean() - 0.5) < 0.02


def test_vectorised_sampling_is_the_inverse_cdf_of_each_generators_draws():
    """`sample_many` (the training data's path) equals a per-token searchsorted of each row's
    own u's, rows of different lengths together (a random teacher: unequal bins)."""
    t = teachers.random_markov(7, seed=1)
    edges_VE = t.edges_VE()
    lengths = [3, 9, 1, 6]
    got = t.sample_many([np.random.default_rng(i) for i in range(4)], lengths, edges_VE)
    for i, length in enumerate(lengths):
        u = np.random.default_rng(i).random(length - 1, dtype=np.float32)
        want = [t.start_token]
        for u_t in u:
            want.append(np.searchsorted(edges_VE[want[-1], 1:], u_t, side="right"))
        np.testing.assert_array_equal(got[i], want)


def test_edges_for_a_completion_token_come_from_the_distribution_after_the_previous_token():
    config = flow_mtp_config.get_config("size=smoke")
    teacher = flow_mtp.make_teacher(config)
    batch = {
        "context": jnp.array([[0, 0, 3, 4]]),
        "context_mask": jnp.array([[False, True, True, True]]),
        "completion": jnp.array([[4, 5, 6, 6]]),
    }
    probs = np.asarray(flow_mtp.teacher_probs(teacher, bins.PLAIN, batch))[0]
    previous = [4, 4, 5, 6]  # the last context token, then completion tokens 0..L-2
    for k, prev in enumerate(previous):
        np.testing.assert_array_equal(np.flatnonzero(probs[k]), [prev, prev + 1])
    left, right = bins.bins_of(jnp.asarray(probs)[None], batch["completion"])
    # Token 4 after 4 ("same") owns [0, .5); 5 after 4 and 6 after 5 ("+1") own [.5, 1).
    np.testing.assert_array_equal(np.asarray(left)[0], [0.0, 0.5, 0.5, 0.0])
    np.testing.assert_array_equal(np.asarray(right)[0], [0.5, 1.0, 1.0, 0.5])


def test_config_errors_are_one_line():
    config = flow_mtp_config.get_config("size=smoke")
    config.teacher.temperature = 0.0
    with pytest.raises(ConfigError, match="temperature"):
        flow_mtp.make(config)
    with pytest.raises(ConfigError, match="u="):
        flow_mtp_config.get_config("u=maybe")
    config = flow_mtp_config.get_config("size=smoke")
    config.model.d_model = 30  # 2 heads of 15: rotary needs an even head dim
    with pytest.raises(ConfigError, match="model/ptp"):
        flow_mtp.student_config(config)


# ------------------------------------------------------------------ the quick experiment


# 82 s from an empty compile cache on 2 idle cores, over the ~45 s a method's default tests may
# take: run it with -m slow (or `python -m launch.reproduce --methods=flow_mtp --quick`).
@pytest.mark.slow
def test_quick_experiment_correct_prefix_with_u_far_above_without(tmp_path):
    report = experiment.run(str(tmp_path), quick=True)
    by_metric = {c.metric: c for c in report.claims}
    assert all(c.holds for c in report.claims), report.markdown()
    gap = by_metric["correct prefix: ptp - no_u"].interval
    assert gap.n == 3 and gap.low > 1.0
    again = experiment.claims_from_results(report.results)
    assert [c.to_dict() for c in again] == [c.to_dict() for c in report.claims]


def test_a_full_run_reports_every_part_with_its_own_record(tmp_path, monkeypatch):
    """The composition alone (the parts' training is their own modules' and tests'): a full run
    returns the toy record then one record per part, in RESULT_RUNS order, and every part's
    claims after the toy's; a quick run is the toy part alone."""
    from core import results
    from core.claims import IntervalClaim, Report

    toy_rows = [
        {"variant": v, "seed": seed, "correct": value}
        for v, base in (("ptp", 15.0), ("no_u", 1.0))
        for seed, value in enumerate((base, base + 0.1, base + 0.2))
    ]
    settings = {"completion_len": 16, "margin_fraction": 0.25, "target_fraction": 0.5}
    toy = results.record("flow_mtp", "full", config={"settings": settings}, rows=toy_rows)
    toy["correct_curves"] = {"ptp/0": [(1, 1.0)], "no_u/0": [(1, 1.0)]}
    monkeypatch.setattr(experiment, "measure", lambda workdir, quick=False: toy)

    class Part:
        def __init__(self, part):
            self.part = part

        def run(self, workdir, quick=False):
            assert not quick
            record = results.record("flow_mtp", f"full_{self.part}", config={}, rows=[])
            claim = IntervalClaim.at_least(self.part, f"{self.part}/x", [1.0, 1.1, 1.2], 0.5)
            return Report("flow_mtp", [claim], {}, results=record)

    parts = ("code", "cptp", "code_v2", "cptp_v2")
    monkeypatch.setattr(experiment, "PARTS", {part: Part(part) for part in parts})
    report = experiment.run(str(tmp_path), quick=False)
    assert [r["run"] for r in report.results] == list(experiment.RESULT_RUNS)
    assert [c.metric for c in report.claims][3:] == [f"{part}/x" for part in parts]
    quick = experiment.run(str(tmp_path), quick=True)
    assert isinstance(quick.results, dict) and len(quick.claims) == 3
