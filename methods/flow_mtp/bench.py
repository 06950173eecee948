"""How much faster is PTP decoding than autoregressive decoding with the same network?

    python -m launch.bench --methods=flow_mtp

The toy teacher is a lookup table, so its own autoregressive decoding costs nothing and is no
fair baseline; what is compared instead, on one device, in one process, all jitted:

1. one student call proposing L tokens (context + L u-slots, no cache) vs L sequential calls
   of the same network with a KV cache (prefill the context, then L one-token steps: the cost
   of an AR model of the student's size producing L tokens);
2. PTP decoding of N tokens per row (rounds of one student proposal + one verification against
   the teacher, `decode.generate`) vs N cached one-token steps of the same network: output
   tokens per second. Its advantage is the accepted tokens per call (also reported), which the
   student reaches only after training: the bench trains it first (`train_steps`; the smoke
   run trains 2 steps, so its acceptance is about 1 token per call).

The network in the AR runs is the student's (its inputs are token embeddings of its own
argmax, which it was not trained on): only the cost is measured, not what it writes.
"""

import dataclasses
import functools
import tempfile
import time

import jax
import jax.numpy as jnp

from configs import flow_mtp as flow_mtp_config
from core import train
from core.benchmark import Ratio, Result, machine, median_seconds
from core.nn import transformer
from methods import flow_mtp
from methods.flow_mtp import decode


def _config(smoke: bool):
    config = flow_mtp_config.get_config("size=smoke" if smoke else "size=toy")
    if not smoke:  # the experiment's full settings, a shorter run
        config.ptp.context_len, config.train.batch_size = 8, 32
        config.train.steps, config.optim.lr, config.optim.warmup_steps = 1000, 1e-2, 100
    config.train.checkpoint_every, config.train.eval_every = 0, -1
    config.train.log_every = max(config.train.steps // 4, 1)
    return config


def ar_decode(net_cfg, params, context_BC, num_tokens: int):
    """Prefill the context, then `num_tokens` one-token steps with the KV cache (greedy)."""
    B, C = context_BC.shape
    cache = transformer.init_cache(net_cfg, B, C + num_tokens)
    logits_BTV, cache = transformer.apply(net_cfg, params, context_BC, cache=cache)

    def step(i, carry):
        logits_B1V, cache, out_BN = carry
        token_B = jnp.argmax(logits_B1V[:, -1], axis=-1).astype(jnp.int32)
        logits_B1V, cache = transformer.apply(net_cfg, params, token_B[:, None], cache=cache)
        return logits_B1V, cache, out_BN.at[:, i].set(token_B)

    out_BN = jnp.zeros((B, num_tokens), jnp.int32)
    carry = jax.lax.fori_loop(0, num_tokens, step, (logits_BTV[:, -1:], cache, out_BN))
    return carry[2]


def measure(*, smoke: bool = False) -> Result:
    config = _config(smoke)
    cfg = flow_mtp.student_config(config)
    teacher = flow_mtp.make_teacher(config)
    transform = flow_mtp.sampling_transform(config)
    C, L = cfg.context_len, cfg.completion_len
    rows, num_tokens, repeats = (8, 8, 2) if smoke else (32, 64, 5)
    devices = jax.devices()[:1]

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as workdir:
        state = train.run(config, flow_mtp.make(config), workdir, devices=devices).state
    train_s = time.perf_counter() - start
    params = state.params

    # Every row starts from the teacher's start token (left-padded): N tokens later the values
    # are still in the range training covered (completions start within max_start tokens).
    context_BC = jnp.full((rows, C), teacher.start_token, jnp.int32)
    mask_BC = jnp.zeros((rows, C), bool).at[:, -1].set(True)
    u_BL = jax.random.uniform(jax.random.PRNGKey(0), (rows, L))
    # Only the AR runs need a longer cache than training's context + L (rotary: no new params).
    ar_cfg = dataclasses.replace(cfg.net, max_len=C + num_tokens)

    propose = jax.jit(functools.partial(decode.student_proposal, cfg, params))
    ar = jax.jit(functools.partial(ar_decode, ar_cfg, params["net"]), static_argnums=1)
    generate = jax.jit(
        functools.partial(
            decode.generate,
            functools.partial(decode.student_proposal, cfg, params),
            decode.markov_teacher_probs(teacher, transform),
            num_tokens=num_tokens,
            completion_len=L,
        )
    )
    key = jax.random.PRNGKey(1)
    # The AR runs read every position's logits the same way; the left padding of the context
    # is not masked there (a cost measurement: same shapes and FLOPs either way).
    calls = {
        "proposal_s": lambda: propose(context_BC, mask_BC, u_BL),
        "ar_l_tokens_s": lambda: ar(context_BC, L),
        "ptp_decode_s": lambda: generate(context_BC, mask_BC, key),
        "ar_decode_s": lambda: ar(context_BC, num_tokens),
    }
    times = {
        name: median_seconds(lambda fn=fn: jax.block_until_ready(fn()), repeats)
        for name, fn in calls.items()
    }
    out = jax.device_get(generate(context_BC, mask_BC, key))
    accepted_per_call = float(out.accepted) / float(out.calls)
    produced = rows * num_tokens
    ptp_tps, ar_tps = produced / times["ptp_decode_s"], produced / times["ar_decode_s"]
    size = f"{cfg.net.num_layers}-layer d={cfg.net.d_model}, {rows} rows, context {C}"
    ratios = [
        Ratio(
            f"{L} tokens from the student ({size}): L cached AR calls vs one PTP call",
            f"{L} cached one-token calls (+ prefill)",
            times["ar_l_tokens_s"],
            f"one call over context + {L} u-slots",
            times["proposal_s"],
            "s",
        ),
        Ratio(
            f"decoding {num_tokens} tokens per row ({size}): PTP with verification vs AR",
            f"PTP (L = {L}, {accepted_per_call:.2f} accepted tokens per call)",
            ptp_tps,
            "AR with KV cache, same network",
            ar_tps,
            "tokens/s",
        ),
        Ratio(
            f"PTP decoding ({size}, student trained {config.train.steps} steps)",
            "tokens accepted",
            float(out.accepted),
            "teacher calls (row x round)",
            float(out.calls),
            "tokens",
        ),
    ]
    details = {
        "config": {
            "context_len": C,
            "completion_len": L,
            "model": dict(config.model),
            "rows": rows,
            "num_tokens": num_tokens,
            "train_steps": config.train.steps,
        },
        "train_seconds": train_s,
        "seconds": times,
        "ptp_tokens_per_s": ptp_tps,
        "ar_tokens_per_s": ar_tps,
        "accepted": int(out.accepted),
        "calls": int(out.calls),
        "rounds": int(out.rounds),
        "accepted_per_call": accepted_per_call,
        "machine": machine(),
    }
    return Result(ratios, details)
