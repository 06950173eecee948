"""C-PTP (Theorem 2 of the paper): hide u_k when predicting t_k, and the slot predicts
P(t_k | t_<k), the model's own conditional. It is trained from data (no teacher), gives a full
distribution at every slot, and is sampled in parallel by the inverse CDF of its own slots.

    logits_BLV = hidden_u_logits(cfg, params, context_BC, context_mask_BC, u_BL)  # u_k hidden
    ar_BLV = ar_logits(cfg, params, context_BC, context_mask_BC, completion_BL)   # AR pass
    loss, metrics = loss_fn(cfg, transform, params, batch, rng=rng, variant="cptp")
    method = make(config)  # config.cptp.variant: "cptp" or "ar" (the baseline)

Layout: one causal call over [context tokens ; u_emb(u_1) .. u_emb(u_{L-1})] on the student's
network (`model.sequence_logits`); completion token k is read at the position before it (the
last context token for k = 1). That is the AR pass over [context ; t_1 .. t_{L-1}] with each
completion token's embedding replaced by the embedding of its u: slot k sees the context and
u_<k, never u_k (causality; the test perturbs every u_j), and the input that predicts t_k sits
at position s + k - 1, the official code's -1 shift of auxiliary position ids, by construction.
Why u_<k suffices: given the context and the bins of t_<k, u_<k determines t_<k and carries
nothing else about t_k, so the best slot k is P(t_k | t_<k) for any bins of full support.

Where the bins come from: the model's own AR pass over the data (the same network fed the
completion's tokens), detached, after the sampling transform (T = 1 here). The official code
(mandt-lab/ptp at 261b802) has no C-PTP path: `lit.py` trains O-PTP only (slot k sees slots
<= k, so its own u), its loss is the completion cross-entropy alone (no AR term), and without
stored edges it computes them from `ar_forward` (the network with adapters off), detached.
From scratch nothing would then train that AR pass, so here the AR next-token loss is trained
jointly (`ar_weight`, 1 by default): the bins a slot learns to read its u's through are then
the model's conditional, which is what the parallel sampler uses (`proposal`: t_k = Pick(slot
k's distribution, u_k)), so training and sampling agree. u ~ Beta(0.3, 0.3) inside the bin in
training, U(0, 1) in evaluation, as in O-PTP.

The AR baseline (`variant="ar"`) is the same network and data with the next-token loss only.
"""

import functools

import jax
import jax.numpy as jnp

import methods.flow_mtp as flow_mtp
from core.errors import ConfigError
from core.method import Method
from core.nn import transformer
from methods.flow_mtp import bins, model

VARIANTS = ("cptp", "ar")


def hidden_u_logits(cfg: model.StudentConfig, params, context_BC, context_mask_BC, u_BL):
    """Slot logits [B, L, V]: slot k's distribution of t_k given the context and u_<k (u_L is
    never read: it only picks the last token when sampling)."""
    model.check_inputs(cfg, context_BC, u_BL)
    C = context_BC.shape[1]
    tail_BTD = model.u_embedding(params["u_anchors"], u_BL[:, :-1])
    return model.sequence_logits(cfg, params, context_BC, context_mask_BC, tail_BTD)[:, C - 1 :]


def ar_logits(cfg: model.StudentConfig, params, context_BC, context_mask_BC, completion_BL):
    """The same network's next-token logits [B, L, V] for the completion's tokens (AR pass)."""
    model.check_inputs(cfg, context_BC, completion_BL)
    C = context_BC.shape[1]
    tail_BTD = transformer.embed(cfg.net, params["net"], completion_BL[:, :-1])
    return model.sequence_logits(cfg, params, context_BC, context_mask_BC, tail_BTD)[:, C - 1 :]


def token_nll(logits_BLV, tokens_BL):
    """-log p(token) per position [B, L]."""
    log_probs = jax.nn.log_softmax(logits_BLV.astype(jnp.float32))
    return -jnp.take_along_axis(log_probs, tokens_BL[..., None], axis=-1)[..., 0]


def own_bins_u(cfg, transform, params, batch, rng, *, train: bool, beta: float):
    """(u_BL, ar_logits_BLV): u inside each completion token's bin under the model's own
    (detached) AR distribution after `transform`."""
    ar_BLV = ar_logits(cfg, params, batch["context"], batch["context_mask"], batch["completion"])
    probs_BLV = bins.sampling_probs(jax.lax.stop_gradient(ar_BLV), transform)
    left_BL, right_BL = bins.bins_of(probs_BLV, batch["completion"])
    return bins.sample_u(rng, left_BL, right_BL, train=train, concentration=beta), ar_BLV


def loss_fn(
    cfg, transform, params, batch, *, rng, extra=None, variant: str, ar_weight=1.0, beta=0.3
):
    """C-PTP: slot cross-entropy (u_k hidden, u_<k in the model's own bins) + ar_weight x the
    AR cross-entropy; "ar": the AR cross-entropy alone. Means over completion tokens."""
    del extra
    completion_BL = batch["completion"]
    if variant == "ar":
        ar_BLV = ar_logits(cfg, params, batch["context"], batch["context_mask"], completion_BL)
        ar_nll = token_nll(ar_BLV, completion_BL).mean()
        return ar_nll, {"ar_nll": ar_nll}
    u_BL, ar_BLV = own_bins_u(cfg, transform, params, batch, rng, train=True, beta=beta)
    slot_BLV = hidden_u_logits(cfg, params, batch["context"], batch["context_mask"], u_BL)
    slot_nll = token_nll(slot_BLV, completion_BL).mean()
    ar_nll = token_nll(ar_BLV, completion_BL).mean()
    return slot_nll + ar_weight * ar_nll, {"slot_nll": slot_nll, "ar_nll": ar_nll}


def proposal(cfg, transform, params, context_BC, context_mask_BC, u_BL):
    """Parallel sampling in one call: t_k = Pick(slot k's distribution after `transform`,
    u_k); slot k reads u_<k, the u's of the tokens picked before it."""
    logits_BLV = hidden_u_logits(cfg, params, context_BC, context_mask_BC, u_BL)
    return bins.pick(bins.cdf_edges(bins.sampling_probs(logits_BLV, transform)), u_BL)


def entropy(probs_BLV):
    """Entropy in nats [B, L] (0 log 0 = 0)."""
    logs = jnp.log(jnp.where(probs_BLV > 0, probs_BLV, 1.0))
    return -(probs_BLV * logs).sum(-1)


def eval_step(cfg, teacher, transform, variant: str, state, batch, *, rng) -> dict:
    """Held-out (sum, weight) pairs per completion token: `nll` (the variant's: C-PTP's slots
    with u ~ U(0, 1) in its own bins; the AR pass for "ar"), `ar_nll`, `entropy` (the exact
    teacher's conditional entropy at these tokens: the floor); C-PTP also `correct` (leading
    tokens of a parallel sample that the exact teacher's verification accepts, per
    completion; fresh u ~ U(0, 1)) and `accuracy` (proposed tokens equal to the teacher's
    picks)."""
    params, completion_BL = state.params, batch["completion"]
    context_BC, mask_BC = batch["context"], batch["context_mask"]
    bins_rng, sample_rng = jax.random.split(rng)
    u_BL, ar_BLV = own_bins_u(cfg, transform, params, batch, bins_rng, train=False, beta=0.3)
    ar_nll_BL = token_nll(ar_BLV, completion_BL)
    tokens = jnp.float32(completion_BL.size)
    out = {
        "ar_nll": (ar_nll_BL.sum(), tokens),
        "entropy": (entropy(flow_mtp.teacher_probs(teacher, transform, batch)).sum(), tokens),
    }
    if variant == "ar":
        return {"nll": (ar_nll_BL.sum(), tokens), **out}
    slot_BLV = hidden_u_logits(cfg, params, context_BC, mask_BC, u_BL)
    sample_u_BL = jax.random.uniform(sample_rng, completion_BL.shape, jnp.float32)
    x_BL = proposal(cfg, transform, params, context_BC, mask_BC, sample_u_BL)
    proposed = {"context": context_BC, "context_mask": mask_BC, "completion": x_BL}
    teacher_edges_BLE = bins.cdf_edges(flow_mtp.teacher_probs(teacher, transform, proposed))
    y_BL = bins.pick(teacher_edges_BLE, sample_u_BL)  # the teacher's own picks given x_<k
    rows = jnp.float32(completion_BL.shape[0])
    return {
        "nll": (token_nll(slot_BLV, completion_BL).sum(), tokens),
        "correct": (bins.leading_matches(x_BL, y_BL).sum().astype(jnp.float32), rows),
        "accuracy": ((x_BL == y_BL).sum().astype(jnp.float32), tokens),
        **out,
    }


def make(config) -> Method:
    """The toy method's data and student with the C-PTP (or AR) loss and evaluation."""
    variant = config.cptp.variant
    if variant not in VARIANTS:
        raise ConfigError(f"cptp.variant={variant!r}; expected one of: {', '.join(VARIANTS)}")
    if not config.cptp.ar_weight >= 0:
        raise ConfigError(f"cptp.ar_weight={config.cptp.ar_weight} must be >= 0")
    base = flow_mtp.make(config)
    cfg = flow_mtp.student_config(config)
    teacher = flow_mtp.make_teacher(config)
    transform = flow_mtp.sampling_transform(config)
    loss = functools.partial(
        loss_fn,
        cfg,
        transform,
        variant=variant,
        ar_weight=config.cptp.ar_weight,
        beta=config.ptp.beta,
    )
    return base._replace(
        loss=loss, eval_step=functools.partial(eval_step, cfg, teacher, transform, variant)
    )
