"""Soft-thinking decoding (paper 2) as a next-input rule of the shared sampler.

    dec = Decoder("gumbel", tau=0.5)
    gen = generate_jit(policy, params, prompt_BP, rng=key, decoder=dec, think_end_id=THINK_END,
                       eos_id=EOS, max_new_tokens=64, prompt_mask_BP=mask_BP, probe=True)
    gen.tokens_BN, gen.think_end_B, gen.soft_BN, gen.js_top1_BN

Kinds: "greedy" (argmax everywhere), "sample" (discrete sampling everywhere: temperature, then
top-k, top-p, min-p), and the soft kinds "soft", "dirichlet", "gumbel": until the delimiter the
input fed next is the concept token e = sum_k w_k E[id_k] (E the policy's INPUT embedding, via
`policy.embed`; summed in float32), w from `soft_weights`; the token recorded for that step is
the post-noise top-1 id_0. The delimiter is detected on that post-noise top-1 (or forced by Cold
Stop) and fed as a discrete token; from then on decoding is discrete sampling exactly as
"sample" does, with no noise, from the same per-row key stream. A row that never emits the
delimiter thinks until max_new_tokens. eos ends a row in either phase (the sampler's rule).

The truncation pipeline, as the official sampler (WJMacro/Randomized-Soft-Thinking,
sglang/srt/layers/sampler.py): p = softmax(logits / T) over the whole vocabulary (T = 0: the
argmax alone), then top-k, top-p, min-p (relative to the largest kept p), each followed by
renormalisation (`truncate`); discrete tokens are sampled from that. Soft weights go on:
"dirichlet" replaces p by a Dir(alpha * p) draw on p's support (before max_topk, as the official
code orders it), then every soft kind keeps the `max_topk` largest and renormalises to pi;
"gumbel" then takes y = softmax((log pi + g) / tau), g = -log(-log u), u ~ U clipped to
(eps, 1 - eps), pruned entries -inf; the (weight, id) pairs are re-sorted by weight.

Keys: the sampler's step key fold_in(rng, step), then fold_in(row) per row, then fold_in(0)
for the discrete draw and fold_in(1) for the noise, so a row's draws depend on neither its batch
nor the kind's noise.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from core.errors import ConfigError
from core.nn import sampler
from core.nn.policy import as_policy
from methods.soft_thinking import probes

KINDS = ("greedy", "sample", "soft", "dirichlet", "gumbel")
SOFT_KINDS = ("soft", "dirichlet", "gumbel")
# u is clipped to (EPS, 1 - EPS) in -log(-log u): u = 0 would give -inf noise. float32's eps is
# the spacing just below 1, so 1 - EPS is still < 1.
EPS = float(jnp.finfo(jnp.float32).eps)


class Decoder(NamedTuple):
    kind: str  # one of KINDS
    temperature: float = 0.6  # applied before every filter; 0 = the argmax alone
    top_k: int = 30  # 0 = off
    top_p: float = 0.95  # 1 = off
    min_p: float = 0.0  # keep p >= min_p * max p; 0 = off
    max_topk: int = 10  # soft kinds: the largest weights kept in the concept token; 0 = all
    alpha: float = 4.0  # dirichlet concentration scale
    tau: float = 0.5  # gumbel-softmax temperature
    cold_stop_steps: int = 0  # 0 = off; else force the delimiter after this many consecutive
    cold_stop_entropy: float = 0.01  # thinking steps with H(p) / log V below this


def check(decoder: Decoder) -> None:
    """ConfigError (one line) for a decoder setting out of range."""
    d = decoder
    problems = [
        (d.kind not in KINDS, f"kind must be one of {', '.join(KINDS)}"),
        (not d.temperature >= 0, "temperature must be >= 0 (0 = argmax)"),
        (not (isinstance(d.top_k, int) and d.top_k >= 0), "top_k must be an int >= 0 (0 = off)"),
        (not 0 < d.top_p <= 1, "top_p must be in (0, 1]"),
        (not 0 <= d.min_p < 1, "min_p must be in [0, 1)"),
        (not (isinstance(d.max_topk, int) and d.max_topk >= 0), "max_topk must be an int >= 0"),
        (not d.alpha > 0, "alpha must be > 0"),
        (not d.tau > 0, "tau must be > 0"),
        (
            not (isinstance(d.cold_stop_steps, int) and d.cold_stop_steps >= 0),
            "cold_stop_steps must be an int >= 0 (0 = off)",
        ),
        (not 0 < d.cold_stop_entropy <= 1, "cold_stop_entropy must be in (0, 1]"),
    ]
    for bad, message in problems:
        if bad:
            raise ConfigError(f"Decoder: {message}; got {decoder}")


def _renormalise(p_BK):
    return p_BK / jnp.sum(p_BK, axis=-1, keepdims=True)


def tempered_probs(logits_BV, temperature: float):
    """softmax(logits / T) in float32; T = 0: one-hot on the argmax (the T -> 0 limit)."""
    logits_BV = logits_BV.astype(jnp.float32)
    if temperature == 0:
        return jax.nn.one_hot(jnp.argmax(logits_BV, axis=-1), logits_BV.shape[-1])
    return jax.nn.softmax(logits_BV / temperature, axis=-1)


def truncate(logits_BV, decoder: Decoder):
    """(probs_BK, ids_BK): p = softmax(logits / T), then top-k, top-p and min-p, renormalised
    after each; the K = top_k (V when off) most likely ids, descending (ties: lower id first;
    ranked by the logits, so at T = 0 too), filtered-out entries 0. top-p keeps the smallest
    prefix whose mass is >= top_p (the top token always); min-p keeps p >= min_p * max p."""
    V = logits_BV.shape[-1]
    K = decoder.top_k if 0 < decoder.top_k < V else V
    _, ids_BK = lax.top_k(logits_BV.astype(jnp.float32), K)
    # A barrier: XLA:CPU otherwise turns top_k into a full sort of the vocabulary when its ids
    # are sliced again (the soft kinds' [:, :max_topk]): 0.5 s a step at V = 49152, B = 64.
    ids_BK = lax.optimization_barrier(ids_BK)
    probs_BV = tempered_probs(logits_BV, decoder.temperature)
    probs_BK = _renormalise(jnp.take_along_axis(probs_BV, ids_BK, axis=-1))
    if decoder.top_p < 1:
        mass_before_BK = jnp.cumsum(probs_BK, axis=-1) - probs_BK
        probs_BK = _renormalise(jnp.where(mass_before_BK < decoder.top_p, probs_BK, 0.0))
    if decoder.min_p > 0:
        keep_BK = probs_BK >= decoder.min_p * probs_BK[:, :1]
        probs_BK = _renormalise(jnp.where(keep_BK, probs_BK, 0.0))
    return probs_BK, ids_BK


def _sort_by_weight(weights_BK, ids_BK, k: int):
    weights_BK, order_BK = lax.top_k(weights_BK, k)
    return weights_BK, jnp.take_along_axis(ids_BK, order_BK, axis=-1)


def dirichlet(keys_B, probs_BK, alpha: float):
    """A Dir(alpha * p) draw per row on p's support (0 elsewhere), as normalised Gamma draws
    taken in log space (`loggamma`): plain Gamma draws underflow to 0 for tiny alpha * p and
    0 / 0 is NaN; here an underflow only makes the draw more one-hot."""
    support_BK = probs_BK > 0
    tiny = jnp.finfo(jnp.float32).tiny
    conc_BK = jnp.where(support_BK, jnp.maximum(alpha * probs_BK, tiny), 1.0)
    log_gamma_BK = jax.vmap(jax.random.loggamma)(keys_B, conc_BK)
    # -inf from an underflow on the support would leave a row of -inf (NaN after softmax).
    log_gamma_BK = jnp.maximum(log_gamma_BK, jnp.finfo(jnp.float32).min)
    return jax.nn.softmax(jnp.where(support_BK, log_gamma_BK, -jnp.inf), axis=-1)


def gumbel_softmax(keys_B, pi_BK, tau: float):
    """softmax((log pi + g) / tau) per row, g Gumbel(0, 1) from clipped uniforms; pi = 0 stays
    0 (log 0 = -inf: the noise never revives a pruned token)."""
    u_BK = jax.vmap(lambda key: jax.random.uniform(key, pi_BK.shape[1:]))(keys_B)
    g_BK = -jnp.log(-jnp.log(jnp.clip(u_BK, EPS, 1 - EPS)))
    log_pi_BK = jnp.where(pi_BK > 0, jnp.log(jnp.where(pi_BK > 0, pi_BK, 1.0)), -jnp.inf)
    return jax.nn.softmax((log_pi_BK + g_BK) / tau, axis=-1)


def normalised_entropy(probs_BV):
    """H(p) / log V per row (Cold Stop's measure); 0 log 0 = 0."""
    p_log_p_BV = jnp.where(
        probs_BV > 0, probs_BV * jnp.log(jnp.where(probs_BV > 0, probs_BV, 1)), 0
    )
    return -jnp.sum(p_log_p_BV, axis=-1) / jnp.log(probs_BV.shape[-1])


def soft_weights(logits_BV, decoder: Decoder, keys_B):
    """(weights_BK, ids_BK): a concept token's weights (sum 1, descending, float32) and token
    ids, K = max_topk capped by top_k and V (0s: off); keys_B one key per row, used by
    "dirichlet" and "gumbel". Entries pruned by top-p / min-p inside the K have weight 0."""
    return _soft_from_truncated(*truncate(logits_BV, decoder), decoder, keys_B)


def _soft_from_truncated(probs_BK, ids_BK, decoder: Decoder, keys_B):
    K = min(decoder.max_topk or probs_BK.shape[-1], probs_BK.shape[-1])
    if decoder.kind == "dirichlet":
        probs_BK, ids_BK = _sort_by_weight(dirichlet(keys_B, probs_BK, decoder.alpha), ids_BK, K)
    pi_BK, ids_BK = _renormalise(probs_BK[:, :K]), ids_BK[:, :K]
    if decoder.kind == "gumbel":
        pi_BK, ids_BK = _sort_by_weight(gumbel_softmax(keys_B, pi_BK, decoder.tau), ids_BK, K)
    return pi_BK, ids_BK


def concept_embedding(embed, weights_BK, ids_BK):
    """sum_k w_k E[id_k] [B, D] in float32 (elementwise products and a sum: no matmul pass
    at a lower precision); `embed` maps token ids [B, K] to their input embeddings."""
    rows_BKD = embed(ids_BK).astype(jnp.float32)
    return jnp.sum(weights_BK.astype(jnp.float32)[..., None] * rows_BKD, axis=1)


class ThinkState(NamedTuple):
    """The rule's state, carried through the sampler's loop."""

    thinking_B: jax.Array  # bool: before the delimiter
    think_end_B: jax.Array  # int32: index of the delimiter in tokens_BN, -1 before
    cold_count_B: jax.Array  # int32: consecutive low-entropy thinking steps so far
    cold_stop_B: jax.Array  # bool: the delimiter was forced by Cold Stop
    soft_BN: jax.Array  # bool: the input fed after token n was a concept token
    js_top1_BN: jax.Array | None  # float32 probes (probe=True), valid where soft_BN
    js_top2_BN: jax.Array | None


def _row_keys(key, batch_size: int, stream: int):
    rows_B = jax.vmap(jax.random.fold_in, (None, 0))(key, jnp.arange(batch_size))
    return jax.vmap(jax.random.fold_in, (0, None))(rows_B, stream)


def _logprob(logits_BV, tokens_B, temperature: float):
    """The sampler's convention: log softmax(logits / T) at the token (T = 0: logits as is)."""
    scaled_BV = logits_BV / temperature if temperature > 0 else logits_BV
    logprobs_BV = jax.nn.log_softmax(scaled_BV, axis=-1)
    return jnp.take_along_axis(logprobs_BV, tokens_B[:, None], axis=-1)[:, 0]


def next_input_rule(decoder: Decoder, think_end_id: int | None, probe: bool = False):
    """The `core.nn.sampler.NextInputRule` of `decoder` (module docstring)."""
    check(decoder)
    soft = decoder.kind in SOFT_KINDS
    if soft and decoder.cold_stop_steps and think_end_id is None:
        raise ConfigError("Decoder.cold_stop_steps needs a think_end_id to force")
    T = decoder.temperature
    logprob_T = 0.0 if decoder.kind == "greedy" else T  # greedy: temperature-1 log-probs

    def init(batch_size, max_new_tokens):
        B, N = batch_size, max_new_tokens
        js = jnp.zeros((B, N), jnp.float32) if probe else None
        zeros_B = jnp.zeros((B,), jnp.int32)
        return ThinkState(
            jnp.ones((B,), bool),
            zeros_B - 1,
            zeros_B,
            jnp.zeros((B,), bool),
            jnp.zeros((B, N), bool),
            js,
            js,
        )

    def step(logits_BV, state: ThinkState, ctx: sampler.StepContext) -> sampler.NextInput:
        B, i = logits_BV.shape[0], ctx.index
        logits_BV = logits_BV.astype(jnp.float32)
        probs_BK, ids_BK = truncate(logits_BV, decoder)
        if decoder.kind == "greedy" or T == 0:
            sampled_B = jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
        else:
            keys_B = _row_keys(ctx.key, B, 0)
            rank_B = jax.vmap(jax.random.categorical)(keys_B, jnp.log(probs_BK))  # log 0: -inf
            sampled_B = jnp.take_along_axis(ids_BK, rank_B[:, None], axis=-1)[:, 0]
        thinking_B = state.thinking_B
        ends_B = forced_B = jnp.zeros((B,), bool)
        cold_count_B = state.cold_count_B
        if soft:
            weights_BK, soft_ids_BK = _soft_from_truncated(
                probs_BK, ids_BK, decoder, _row_keys(ctx.key, B, 1)
            )
            top1_B = soft_ids_BK[:, 0]
            if decoder.cold_stop_steps:
                entropy_B = normalised_entropy(tempered_probs(logits_BV, T))
                low_B = entropy_B < decoder.cold_stop_entropy
                cold_count_B = jnp.where(thinking_B & low_B, cold_count_B + 1, 0)
                forced_B = thinking_B & (cold_count_B >= decoder.cold_stop_steps)
            hit_B = forced_B if think_end_id is None else forced_B | (top1_B == think_end_id)
            ends_B = thinking_B & hit_B
            tokens_B = jnp.where(thinking_B, top1_B, sampled_B).astype(jnp.int32)
            if decoder.cold_stop_steps:
                tokens_B = jnp.where(forced_B, jnp.int32(think_end_id), tokens_B)
        else:
            tokens_B = sampled_B.astype(jnp.int32)
            if think_end_id is not None:
                ends_B = thinking_B & (tokens_B == think_end_id)
        live_B = ctx.live_B
        soft_B = thinking_B & ~ends_B & live_B if soft else jnp.zeros((B,), bool)
        new = state._replace(
            thinking_B=thinking_B & ~ends_B,
            think_end_B=jnp.where(ends_B & live_B, i, state.think_end_B),
            cold_count_B=cold_count_B,
            cold_stop_B=state.cold_stop_B | (forced_B & ends_B & live_B),
            soft_BN=state.soft_BN.at[:, i].set(soft_B),
        )
        embeddings_BD = None
        if soft:
            concept_BD = concept_embedding(ctx.embed, weights_BK, soft_ids_BK)
            token_BD = ctx.embed(tokens_B[:, None])[:, 0].astype(jnp.float32)
            embeddings_BD = jnp.where(soft_B[:, None], concept_BD, token_BD)
            if probe:
                js1_B, js2_B = _probe(ctx, concept_BD, soft_ids_BK, T)
                new = new._replace(
                    js_top1_BN=new.js_top1_BN.at[:, i].set(jnp.where(soft_B, js1_B, 0.0)),
                    js_top2_BN=new.js_top2_BN.at[:, i].set(jnp.where(soft_B, js2_B, 0.0)),
                )
        logprobs_B = _logprob(logits_BV, tokens_B, logprob_T)
        return sampler.NextInput(tokens_B, logprobs_B, embeddings_BD, new)

    return sampler.NextInputRule(init=init, step=step)


def _probe(ctx: sampler.StepContext, concept_BD, ids_BK, temperature: float):
    """JS(P_soft, P_top1) and JS(P_soft, P_top2) [B]: the next-token distributions (at the
    decoding temperature, as the official probe) after the concept token and after its top-1
    or top-2 token alone, all three from the same cache."""
    scale = temperature if temperature > 0 else 1.0
    soft_BV = ctx.peek(concept_BD) / scale
    top_BV = [
        ctx.peek(ctx.embed(ids_BK[:, k : k + 1])[:, 0].astype(jnp.float32)) / scale for k in (0, 1)
    ]
    return probes.js_divergence(soft_BV, top_BV[0]), probes.js_divergence(soft_BV, top_BV[1])


class Generation(NamedTuple):
    tokens_BN: jax.Array  # int32: thinking, the post-noise top-1 of each concept token; then
    # the delimiter; then the discrete answer tokens; pad_id after eos / the end
    logprobs_BN: jax.Array  # float32 log softmax(logits / T) of tokens_BN (sampler convention)
    mask_BN: jax.Array  # bool: generated, up to and including eos
    done_B: jax.Array  # bool: the row emitted eos
    lengths_B: jax.Array  # int32: mask_BN.sum(1)
    think_end_B: jax.Array  # int32: index of the delimiter in tokens_BN, -1 if none
    soft_BN: jax.Array  # bool: after token n a concept token was fed (soft kinds only)
    cold_stop_B: jax.Array  # bool: the delimiter was forced by Cold Stop
    js_top1_BN: jax.Array | None = None  # probe=True: JS(P_soft, P_top1), valid where soft_BN
    js_top2_BN: jax.Array | None = None  # probe=True: JS(P_soft, P_top2), valid where soft_BN


def generate(
    policy,
    params,
    prompt_BP,
    *,
    rng,
    decoder: Decoder,
    think_end_id: int | None,
    eos_id: int | None,
    max_new_tokens: int,
    prompt_mask_BP=None,
    pad_id=0,
    probe: bool = False,
) -> Generation:
    """Decodes left-padded prompts with `decoder` (module docstring). think_end_id None: no
    delimiter (soft kinds think to the end unless Cold Stop forces one, which then needs an
    id). probe: the JS probes of every soft step (three extra forward passes per step). The
    cache holds P + max_new_tokens slots (the policy's max_len must allow that)."""
    check(decoder)
    policy = as_policy(policy)
    soft = decoder.kind in SOFT_KINDS
    if soft and policy.embed is None:
        raise ConfigError(f"Decoder kind {decoder.kind!r} needs a policy with embed (soft tokens)")
    if probe and not soft:
        raise ConfigError(
            f"probe=True needs a soft kind ({', '.join(SOFT_KINDS)}), got {decoder.kind!r}"
        )
    if probe and 1 in (decoder.top_k, decoder.max_topk):
        raise ConfigError(f"probe=True needs a top-2 token: top_k and max_topk >= 2, got {decoder}")
    rule = next_input_rule(decoder, think_end_id, probe)
    out = sampler.sample(
        policy,
        params,
        prompt_BP,
        rng=rng,
        max_new_tokens=max_new_tokens,
        prompt_mask_BP=prompt_mask_BP,
        eos_id=eos_id,
        pad_id=pad_id,
        next_input=rule,
    )
    s = out.rule_state
    return Generation(
        out.tokens_BN,
        out.logprobs_BN,
        out.mask_BN,
        out.done_B,
        out.lengths_B,
        s.think_end_B,
        s.soft_BN & out.mask_BN,
        s.cold_stop_B,
        s.js_top1_BN,
        s.js_top2_BN,
    )


GENERATE_STATIC_ARGNAMES = (
    "policy",
    "decoder",
    "think_end_id",
    "eos_id",
    "max_new_tokens",
    "probe",
)
# Compiles once per (policy, decoder, ids, lengths, shapes): rng, params, prompts, pad_id traced.
generate_jit = jax.jit(generate, static_argnames=GENERATE_STATIC_ARGNAMES)
