"""Streaming text generation with the KV cache: one jitted prefill, then one jitted step per token.

    gen = generate.stream(cfg, params, prompt_ids, max_new_tokens=256, eos_id=tok.eos_id)
    for token in gen:                      # each id as soon as it is chosen
        ...
    gen.stats.decode_tokens_per_s          # prefill and decode timed apart (block_until_ready)

    progs = generate.programs(cfg, params, batch_size=16, prompt_len=64, cache_len=256)
    tok_B, cache = progs.prefill(params, tokens_BP, lengths_B, rng)   # a batch (the benchmark)
    tok_B, cache = progs.step(params, tok_B, pos_B, jnp.int32(1), cache, rng)

`core.nn.sampler.sample` decodes inside one `lax.while_loop`, which is what training wants (GRPO,
many rows, nothing on the host until the end). A person at a prompt wants each token when it
exists, so here the loop is in Python and every step is a separate jitted call. The choice of a
token is the sampler's own (`sampler.token_rule`: greedy at temperature 0, else top-k / top-p
filtering and a categorical draw) with the sampler's key schedule, `fold_in(rng, i)` for new
token i: with the same rng both give the same tokens.

Shapes, so that few programs compile: the prompt is RIGHT-padded to a multiple of
`PROMPT_BUCKET` (padding slots have key_mask False, so nothing ever attends to them; the first
new token is read at the last real position), and the cache is the padded prompt plus
max_new_tokens, rounded up to a multiple of `CACHE_BUCKET` (capped at cfg.max_len). A new prompt
of a similar length reuses both programs. Compilation is done ahead of the timed calls and
reported apart (`Stats.compile_s`).

Pipelining: step i + 1 is dispatched (its input is step i's token, still on the device) before
step i's token is read on the host, so the device never waits for the host's read.
"""

import dataclasses
import functools
import time
from collections.abc import Iterator
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from core.errors import ConfigError
from core.nn import sampler, transformer

PROMPT_BUCKET = 64  # prompt lengths compile in steps of 64 tokens (padding < 64 wasted slots)
CACHE_BUCKET = 256  # cache lengths in steps of 256 slots


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def cache_shape(cfg, prompt_len: int, max_new_tokens: int) -> tuple[int, int]:
    """(padded prompt length, cache length) for a prompt of `prompt_len` tokens: the buckets
    above, capped at cfg.max_len. The last new token is never fed back: it needs no slot."""
    needed = prompt_len + max_new_tokens - 1
    if needed > cfg.max_len:
        raise ConfigError(
            f"generate: a prompt of {prompt_len} tokens and max_new_tokens={max_new_tokens} "
            f"need {needed} cache slots; the model's max_len is {cfg.max_len}"
        )
    padded = min(_round_up(prompt_len, PROMPT_BUCKET), cfg.max_len)
    cache_len = min(_round_up(padded + max_new_tokens - 1, CACHE_BUCKET), cfg.max_len)
    if cache_len < padded + max_new_tokens - 1:  # the cap cut into the bucket: no padding
        padded = prompt_len
        cache_len = needed
    return padded, cache_len


class Choice(NamedTuple):
    """How the next token is chosen (`core.nn.sampler.token_rule`'s arguments)."""

    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off

    def check(self) -> "Choice":
        if self.temperature < 0:
            raise ConfigError(f"generate: temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ConfigError(f"generate: top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"generate: top_p must be in (0, 1], got {self.top_p}")
        return self


def _choose(choice: Choice, logits_BV, rng, index):
    """The sampler's built-in rule for new token `index` (its key: fold_in(rng, index))."""
    rule = sampler.token_rule(**choice._asdict())
    B = logits_BV.shape[0]
    ctx = sampler.StepContext(jax.random.fold_in(rng, index), index, jnp.ones(B, bool), None, None)
    return rule.step(logits_BV, None, ctx).tokens_B


def _prefill(cfg, choice, cache_len, params, tokens_BP, lengths_B, rng):
    """The first new token [B] and the cache after the right-padded prompt."""
    B, P = tokens_BP.shape
    key_mask_BP = jnp.arange(P)[None, :] < lengths_B[:, None]
    positions_BP = jnp.broadcast_to(jnp.arange(P, dtype=jnp.int32), (B, P))
    cache = transformer.init_cache(cfg, B, cache_len)
    logits_BPV, cache = transformer.apply(
        cfg, params, tokens_BP, positions_BT=positions_BP, key_mask_BT=key_mask_BP, cache=cache
    )
    last_BV = jnp.take_along_axis(logits_BPV, (lengths_B - 1)[:, None, None], axis=1)[:, 0]
    return _choose(choice, last_BV, rng, jnp.int32(0)), cache


def _step(cfg, choice, params, tokens_B, positions_B, index, cache, rng):
    """New token `index` [B] after feeding tokens_B at positions_B; the advanced cache."""
    logits_B1V, cache = transformer.apply(
        cfg, params, tokens_B[:, None], positions_BT=positions_B[:, None], cache=cache
    )
    return _choose(choice, logits_B1V[:, 0], rng, index), cache


class Programs(NamedTuple):
    """The two compiled programs for one (cfg, params layout, batch, prompt, cache, choice)."""

    prefill: object  # (params, tokens_BP int32, lengths_B int32, rng) -> (tokens_B, cache)
    step: object  # (params, tokens_B, positions_B, index int32, cache, rng) -> (tokens_B, cache)
    compile_s: float  # seconds spent lowering and compiling both (0 when already compiled)


def _layout(params):
    """A hashable description of the params' structure, shapes and dtypes (what compiles)."""
    leaves, treedef = jax.tree.flatten(params)
    return treedef, tuple((tuple(x.shape), str(x.dtype)) for x in leaves)


def programs(
    cfg, params, *, batch_size: int, prompt_len: int, cache_len: int, choice: Choice | None = None
) -> Programs:
    """The jitted prefill and step, compiled ahead of use (cached per shapes and choice;
    default: greedy)."""
    choice = (choice or Choice()).check()
    compiled_before = _programs.cache_info().misses
    progs = _programs(cfg, _layout(params), batch_size, prompt_len, cache_len, choice)
    return (
        progs if _programs.cache_info().misses > compiled_before else progs._replace(compile_s=0.0)
    )


@functools.lru_cache(maxsize=32)
def _programs(cfg, layout, batch_size, prompt_len, cache_len, choice) -> Programs:
    treedef, leaves = layout
    params = jax.tree.unflatten(treedef, [jax.ShapeDtypeStruct(s, d) for s, d in leaves])
    B = batch_size
    ints = functools.partial(jax.ShapeDtypeStruct, dtype=jnp.int32)
    rng = jax.eval_shape(lambda: jax.random.PRNGKey(0))
    start = time.perf_counter()
    prefill = jax.jit(functools.partial(_prefill, cfg, choice, cache_len))
    prefill = prefill.lower(params, ints((B, prompt_len)), ints((B,)), rng).compile()
    cache = jax.eval_shape(functools.partial(transformer.init_cache, cfg, B, cache_len))
    # The cache is donated: each step updates it in place instead of copying all layers' k, v.
    step = jax.jit(functools.partial(_step, cfg, choice), donate_argnums=(4,))
    step = step.lower(params, ints((B,)), ints((B,)), ints(()), cache, rng).compile()
    return Programs(prefill, step, time.perf_counter() - start)


@dataclasses.dataclass
class Stats:
    """Token counts and seconds of one generation; compile time kept apart."""

    prompt_tokens: int = 0
    prefill_s: float = 0.0  # the prompt in, the first new token chosen and on the host
    new_tokens: int = 0  # tokens streamed (eos included when it ends the answer)
    decode_steps: int = 0  # steps after prefill whose token was streamed
    decode_s: float = 0.0
    compile_s: float = 0.0

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s else float("nan")

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_steps / self.decode_s if self.decode_s else float("nan")


def as_device_params(params):
    """Host (numpy) leaves moved to the default device once; jax arrays stay where they are
    (a numpy leaf passed to every step would be copied to the device every step)."""
    return jax.tree.map(lambda x: x if isinstance(x, jax.Array) else jnp.asarray(x), params)


class Stream(Iterator[int]):
    """The new token ids of one prompt, one at a time (`stream`); `stats` fills as it runs."""

    def __init__(self, tokens: Iterator[int], stats: Stats):
        self._tokens, self.stats = tokens, stats

    def __next__(self) -> int:
        return next(self._tokens)


def stream(
    cfg,
    params,
    prompt_ids,
    *,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    rng: jax.Array | None = None,
    eos_id: int | None = None,
) -> Stream:
    """New token ids after `prompt_ids` (a list of ints), streamed; ends after eos_id (which is
    yielded) or max_new_tokens ids. temperature 0 is greedy (rng unused; default key 0)."""
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ConfigError("generate: the prompt is empty (no tokens); give at least one token")
    if max_new_tokens < 1:
        raise ConfigError(f"generate: max_new_tokens must be >= 1, got {max_new_tokens}")
    choice = Choice(float(temperature), int(top_k), float(top_p)).check()
    padded, cache_len = cache_shape(cfg, len(prompt), max_new_tokens)
    params = as_device_params(params)
    progs = programs(
        cfg, params, batch_size=1, prompt_len=padded, cache_len=cache_len, choice=choice
    )
    stats = Stats(prompt_tokens=len(prompt), compile_s=progs.compile_s)
    rng = jax.random.PRNGKey(0) if rng is None else rng
    tokens_1P = np.zeros((1, padded), np.int32)
    tokens_1P[0, : len(prompt)] = prompt
    return Stream(
        _tokens(progs, params, tokens_1P, len(prompt), max_new_tokens, rng, eos_id, stats), stats
    )


def _tokens(progs, params, tokens_1P, n_prompt, max_new_tokens, rng, eos_id, stats):
    start = time.perf_counter()
    token_1, cache = progs.prefill(params, tokens_1P, np.array([n_prompt], np.int32), rng)
    for i in range(max_new_tokens):
        pending = None
        if i + 1 < max_new_tokens:  # dispatch the next step before reading this token
            # Host numpy in, not jnp ops: each of those would be one more dispatch per token.
            position_1 = np.full((1,), n_prompt + i, np.int32)
            pending = progs.step(params, token_1, position_1, np.int32(i + 1), cache, rng)
        token = int(np.asarray(token_1)[0])  # waits for this token only
        # Decode time runs from the first token on the host to the last one; it includes the
        # consumer's time between tokens (printing one token: microseconds), during which the
        # next step is already running.
        if i == 0:
            stats.prefill_s = time.perf_counter() - start
            start = time.perf_counter()
        else:
            stats.decode_steps += 1
            stats.decode_s = time.perf_counter() - start
        stats.new_tokens += 1
        yield token
        if token == eos_id or pending is None:
            return
        token_1, cache = pending
