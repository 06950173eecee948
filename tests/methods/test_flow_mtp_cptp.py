"""C-PTP (methods/flow_mtp/cptp.py): slot k never sees its own u, the AR pass and the bins it
gives, the detached edges, parallel sampling, and the part's claims from a record."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ml_collections import ConfigDict

import methods.flow_mtp as flow_mtp
from configs import flow_mtp as flow_mtp_config
from core.errors import ConfigError
from methods.flow_mtp import bins, cptp, experiment_cptp, model


def small(context_len=3, completion_len=5, variant="cptp"):
    config = flow_mtp_config.get_config("size=smoke")
    config.ptp.context_len, config.ptp.completion_len = context_len, completion_len
    config.cptp = ConfigDict(dict(variant=variant, ar_weight=1.0))
    cfg = flow_mtp.student_config(config)
    return config, cfg, model.init_params(cfg, jax.random.PRNGKey(1))


CONTEXT = jnp.array([[0, 4, 5]])
MASK = jnp.array([[False, True, True]])


def test_slot_k_sees_the_context_and_earlier_u_but_never_its_own():
    """Theorem 2's hidden u: moving u_j changes slot k's logits iff j < k (so slot k reads
    u_1..u_{k-1}, the u's of the tokens before it); u_L is read by no slot."""
    _, cfg, params = small()
    L = cfg.completion_len
    logits = jax.jit(functools.partial(cptp.hidden_u_logits, cfg, params))
    u = jnp.linspace(0.1, 0.9, L)[None]
    base = np.asarray(logits(CONTEXT, MASK, u))[0]
    for j in range(L):
        moved = np.asarray(logits(CONTEXT, MASK, u.at[0, j].add(0.05)))[0]
        for k in range(L):
            if j >= k:  # masked keys get probability exactly 0: bitwise the same logits
                np.testing.assert_array_equal(moved[k], base[k])
            else:  # the change is far above float32 rounding
                assert np.abs(moved[k] - base[k]).max() > 1e-4, (j, k)
    other = np.asarray(logits(CONTEXT.at[0, 2].set(9), MASK, u))[0]
    assert np.all(np.abs(other - base).max(-1) > 1e-4)  # every slot sees the last context token
    padded = np.asarray(logits(CONTEXT.at[0, 0].set(9), MASK, u))[0]
    np.testing.assert_array_equal(padded, base)  # and no padded one


def test_ar_pass_predicts_each_completion_token_from_the_tokens_before_it():
    """Slot k of the AR pass sees the context and t_<k: its logits move with t_j iff j < k."""
    _, cfg, params = small()
    L = cfg.completion_len
    logits = jax.jit(functools.partial(cptp.ar_logits, cfg, params))
    completion = jnp.array([[5, 6, 6, 7, 8]])
    base = np.asarray(logits(CONTEXT, MASK, completion))[0]
    for j in range(L):
        moved = np.asarray(logits(CONTEXT, MASK, completion.at[0, j].set(1)))[0]
        for k in range(L):
            if j >= k:
                np.testing.assert_array_equal(moved[k], base[k])
            else:
                assert np.abs(moved[k] - base[k]).max() > 1e-4, (j, k)
    # The first slot is the network's next-token prediction after the context: the same
    # function as the O-PTP student's forward over the context alone.
    seq = model.sequence_logits(cfg, params, CONTEXT, MASK, jnp.zeros((1, 0, cfg.net.d_model)))
    np.testing.assert_allclose(base[0], np.asarray(seq)[0, -1], rtol=1e-5, atol=1e-5)  # f32


def test_training_u_lies_in_the_observed_tokens_bin_under_the_models_own_ar_distribution():
    config, cfg, params = small()
    batch = {
        "context": jnp.tile(CONTEXT, (64, 1)),
        "context_mask": jnp.tile(MASK, (64, 1)),
        "completion": jax.random.randint(jax.random.PRNGKey(2), (64, 5), 0, 100),
    }
    u, ar = cptp.own_bins_u(
        cfg, bins.PLAIN, params, batch, jax.random.PRNGKey(3), train=True, beta=0.3
    )
    edges = bins.cdf_edges(bins.sampling_probs(ar))
    np.testing.assert_array_equal(np.asarray(bins.pick(edges, u)), np.asarray(batch["completion"]))
    # An untrained AR pass spreads its mass: most bins are narrow (~1/V), so the check is sharp.
    width = np.diff(np.asarray(edges), axis=-1)
    assert np.median(width) < 0.05


def test_bins_are_detached_the_slot_loss_gradient_is_the_one_at_fixed_u():
    """With ar_weight = 0 the gradient is that of the slot loss at the u's the edges gave,
    held fixed: no gradient flows into the AR pass through the bins."""
    config, cfg, params = small()
    batch = {
        "context": jnp.tile(CONTEXT, (8, 1)),
        "context_mask": jnp.tile(MASK, (8, 1)),
        "completion": jnp.tile(jnp.array([[5, 6, 6, 7, 8]]), (8, 1)),
    }
    rng = jax.random.PRNGKey(4)
    loss = functools.partial(cptp.loss_fn, cfg, bins.PLAIN, variant="cptp", ar_weight=0.0)
    grad = jax.jit(jax.grad(lambda p: loss(p, batch, rng=rng)[0]))(params)
    u, _ = cptp.own_bins_u(cfg, bins.PLAIN, params, batch, rng, train=True, beta=0.3)

    def fixed_u_loss(p):
        slot = cptp.hidden_u_logits(cfg, p, batch["context"], batch["context_mask"], u)
        return cptp.token_nll(slot, batch["completion"]).mean()

    expect = jax.jit(jax.grad(fixed_u_loss))(params)
    for g, e in zip(jax.tree.leaves(grad), jax.tree.leaves(expect), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-5, atol=1e-7)  # f32


def test_parallel_sample_picks_each_token_from_its_slot_with_its_u():
    """proposal's token k is the inverse CDF of slot k's distribution (which saw u_<k) at u_k:
    sequential decoding with the same u's, one slot at a time, gives the same tokens."""
    _, cfg, params = small()
    u = jax.random.uniform(jax.random.PRNGKey(5), (4, cfg.completion_len))
    context, mask = jnp.tile(CONTEXT, (4, 1)), jnp.tile(MASK, (4, 1))
    x = np.asarray(cptp.proposal(cfg, bins.PLAIN, params, context, mask, u))
    slot = cptp.hidden_u_logits(cfg, params, context, mask, u)
    for k in range(cfg.completion_len):
        edges = bins.cdf_edges(bins.sampling_probs(slot[:, k]))
        np.testing.assert_array_equal(x[:, k], np.asarray(bins.pick(edges, u[:, k])))
    assert len(np.unique(x)) > 3  # an untrained model's near-uniform slots: varied tokens


def test_one_training_step_and_evaluation_run_for_both_variants():
    for variant in cptp.VARIANTS:
        config, cfg, params = small(variant=variant)
        method = cptp.make(config)
        batch = next(iter(method.dataset("train", shard=(0, 1), seed=0)))
        loss, metrics = method.loss(params, batch, rng=jax.random.PRNGKey(0))
        assert np.isfinite(float(loss)) and "ar_nll" in metrics
        state = type("State", (), {"params": params})
        out = method.eval_step(state, batch, rng=jax.random.PRNGKey(1))
        entropy, tokens = (float(x) for x in out["entropy"])
        assert entropy / tokens == pytest.approx(np.log(2), abs=1e-6)  # toy: 1/2, 1/2 steps
        assert ("correct" in out) == (variant == "cptp")


def test_config_errors_are_one_line():
    config, _, _ = small()
    config.cptp.variant = "diffusion"
    with pytest.raises(ConfigError, match="cptp.variant"):
        cptp.make(config)


def record(cptp_nll, ar_nll, correct, L=16, margin=0.05):
    rows = [
        {"part": "cptp", "variant": v, "seed": s, "nll": n, "correct": c, "entropy": 0.693}
        for s in range(3)
        for v, n, c in (("cptp", cptp_nll[s], correct[s]), ("ar", ar_nll[s], None))
    ]
    settings = {"completion_len": L, "nll_margin": margin, "correct_fraction": 0.5}
    return {"config": {"cptp": {"settings": settings}}, "rows": rows}


def test_claims_follow_the_record_and_can_fail():
    good = experiment_cptp.claims_cptp(record([0.70, 0.71, 0.70], [0.70, 0.70, 0.70], [9, 10, 11]))
    assert all(c.holds for c in good)
    worse = experiment_cptp.claims_cptp(record([0.80, 0.76, 0.79], [0.70, 0.70, 0.70], [9, 10, 7]))
    assert not any(c.holds for c in worse)


# ~4.5 minutes on the shared 2 cores (6 short runs, compiles included): over the default budget.
@pytest.mark.slow
def test_quick_experiment_claims_hold_and_rederive(tmp_path):
    report = experiment_cptp.run(str(tmp_path), quick=True)
    assert all(c.holds for c in report.claims), report.markdown()
    again = experiment_cptp.claims_cptp(report.results)
    assert [c.to_dict() for c in again] == [c.to_dict() for c in report.claims]
