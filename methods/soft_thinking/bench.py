"""Soft-thinking decoding's cost: soft / Dirichlet / Gumbel vs plain sampling, the rule hook vs
the sampler's built-in choice, and the jitted decode vs a Python-loop decode.

    python -m launch.bench --methods=soft_thinking

One process, a freshly initialised transformer (the paper's CPU-scale model: 4 layers, d 192,
6 heads; float32), B rows of random P-token prompts, N new tokens, no eos and no delimiter
(think_end_id None), so every row generates exactly N tokens and the soft kinds feed a concept
token at every step: the figures are the per-step cost of each rule. Each time is the median of
`repeats` calls after a warm-up (which also compiles); tokens/s = B * N / seconds.
  1. `decode.generate_jit` with the paper's settings (T 0.6, top-k 30, top-p 0.95, max_topk 10,
     alpha 4, tau 0.5): "soft", "dirichlet" and "gumbel" against "sample" (discrete sampling
     through the same rule, tokens fed as tokens); and "sample" against
     `core.nn.sampler.sample_jit`'s built-in choice (temperature / top-k / top-p, no min-p).
  2. "soft" through `generate_jit` (prefill and a `lax.while_loop` in one compiled call) against
     `python_loop_decode`: one jitted prefill, then one jitted call per new token (the forward
     of the previous input from the cache, donated, then the rule), dispatched from Python. Both
     draw with the same keys, so their tokens are compared too.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from core.benchmark import Ratio, Result, median_seconds
from core.nn import sampler, transformer
from methods.soft_thinking import decode

PAPER = dict(temperature=0.6, top_k=30, top_p=0.95, max_topk=10, alpha=4.0, tau=0.5)


def _context(cfg, params, rng, i, batch_size):
    embed = functools.partial(transformer.embed, cfg, params)
    live_B = jnp.ones((batch_size,), bool)
    return sampler.StepContext(jax.random.fold_in(rng, i), jnp.int32(i), live_B, embed, None)


@functools.partial(jax.jit, static_argnames=("cfg", "decoder", "max_new_tokens"))
def _prefill(cfg, params, prompt_BP, rng, *, decoder, max_new_tokens):
    """Rule step 0 on the prompt's last logits, and the cache (P + N slots, as the sampler's)."""
    B, P = prompt_BP.shape
    rule = decode.next_input_rule(decoder, None)
    cache = transformer.init_cache(cfg, B, P + max_new_tokens)
    logits_BPV, cache = transformer.apply(cfg, params, prompt_BP, cache=cache)
    state = rule.init(B, max_new_tokens)
    return rule.step(logits_BPV[:, -1], state, _context(cfg, params, rng, 0, B)), cache


# The cache is donated: without it each call would copy the whole cache to write one slot, a
# cost the while_loop (updating in place) does not have, and the comparison is about the loop.
@functools.partial(jax.jit, static_argnames=("cfg", "decoder"), donate_argnames=("cache",))
def _step(cfg, params, embeddings_BD, state, cache, rng, i, *, decoder):
    logits_B1V, cache = transformer.apply(
        cfg, params, embeddings_BTD=embeddings_BD[:, None], cache=cache
    )
    rule = decode.next_input_rule(decoder, None)
    B = embeddings_BD.shape[0]
    return rule.step(logits_B1V[:, 0], state, _context(cfg, params, rng, i, B)), cache


def python_loop_decode(cfg, params, prompt_BP, *, rng, decoder, max_new_tokens):
    """tokens_BN of a soft-kind decode (every row N tokens, no delimiter) with the loop over new
    tokens in Python: `generate`'s draws (the same key per step), a dispatch per token."""
    out, cache = _prefill(
        cfg, params, prompt_BP, rng, decoder=decoder, max_new_tokens=max_new_tokens
    )
    tokens = [out.tokens_B]
    for i in range(1, max_new_tokens):
        out, cache = _step(
            cfg, params, out.embeddings_BD, out.state, cache, rng, jnp.int32(i), decoder=decoder
        )
        tokens.append(out.tokens_B)
    return jax.block_until_ready(jnp.stack(tokens, axis=1))


def setup(smoke: bool):
    if smoke:
        cfg = transformer.TransformerConfig(
            vocab_size=16, num_layers=1, d_model=16, num_heads=2, d_ff=32, max_len=16
        )
        rows, prompt_len, new_tokens, repeats = 4, 4, 4, 1
    else:
        cfg = transformer.TransformerConfig(
            vocab_size=64, num_layers=4, d_model=192, num_heads=6, d_ff=768, max_len=128
        )
        rows, prompt_len, new_tokens, repeats = 64, 16, 64, 3
    params = transformer.init_params(cfg, jax.random.key(0))
    prompt_BP = jax.random.randint(jax.random.key(1), (rows, prompt_len), 0, cfg.vocab_size)
    return cfg, params, prompt_BP, new_tokens, repeats


def measure(*, smoke: bool = False) -> Result:
    cfg, params, prompt_BP, N, repeats = setup(smoke)
    B = prompt_BP.shape[0]
    rng = jax.random.key(2)
    kinds = ("sample", "soft", "dirichlet", "gumbel")

    def run_kind(kind):
        return jax.block_until_ready(
            decode.generate_jit(
                cfg,
                params,
                prompt_BP,
                rng=rng,
                decoder=decode.Decoder(kind, **PAPER),
                think_end_id=None,
                eos_id=None,
                max_new_tokens=N,
            )
        )

    def run_core():
        return jax.block_until_ready(
            sampler.sample_jit(
                cfg,
                params,
                prompt_BP,
                rng=rng,
                max_new_tokens=N,
                temperature=PAPER["temperature"],
                top_k=PAPER["top_k"],
                top_p=PAPER["top_p"],
            )
        )

    soft = decode.Decoder("soft", **PAPER)
    loop = lambda: python_loop_decode(
        cfg, params, prompt_BP, rng=rng, decoder=soft, max_new_tokens=N
    )
    seconds = {kind: median_seconds(functools.partial(run_kind, kind), repeats) for kind in kinds}
    seconds["core_sampler"] = median_seconds(run_core, repeats)
    seconds["soft_python_loop"] = median_seconds(loop, repeats)
    tokens = B * N
    per_s = {name: tokens / s for name, s in seconds.items()}
    figure = f"decode {N} new tokens, {B} rows, no delimiter"
    ratios = [
        Ratio(
            f"{figure}: {kind} vs sample", kind, per_s[kind], "sample", per_s["sample"], "tokens/s"
        )
        for kind in ("soft", "dirichlet", "gumbel")
    ]
    ratios += [
        Ratio(
            f"{figure}: the rule hook",
            "sample (decode rule)",
            per_s["sample"],
            "sample_jit built-in",
            per_s["core_sampler"],
            "tokens/s",
        ),
        Ratio(
            f"{figure}: soft",
            "generate_jit",
            per_s["soft"],
            "Python-loop decode",
            per_s["soft_python_loop"],
            "tokens/s",
        ),
    ]
    same_tokens = bool(jnp.array_equal(run_kind("soft").tokens_BN, loop()))
    details = {
        "setup": {
            "model": dataclasses.asdict(cfg),
            "num_params": transformer.num_params(params),
            "rows": B,
            "prompt_len": int(prompt_BP.shape[1]),
            "new_tokens": N,
            "repeats": repeats,
            "decoder": PAPER,
        },
        "seconds": seconds,
        "tokens": tokens,
        "soft_generated_tokens": int(run_kind("soft").lengths_B.sum()),  # = tokens: no eos
        "tokens_per_s": per_s,
        "python_loop_same_tokens": same_tokens,
    }
    return Result(ratios, details)
