"""How much faster is PTP decoding than autoregressive decoding with the same network?

    python -m launch.bench --methods=flow_mtp     # the toy figures, then the code teacher's
    python -m launch.bench --methods=flow_mtp --smoke   # the toy figures only (seconds)

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
    """The toy figures and, in a full run, the code teacher's (`measure_code`: it trains or
    reads a teacher and fine-tunes a student, minutes on a CPU, so the smoke run leaves it out;
    its own smoke run is a slow test)."""
    toy = measure_toy(smoke=smoke)
    if smoke:
        return toy
    code = measure_code()
    return Result(
        toy.ratios + code.ratios, {"toy": toy.details, "code": code.details}, toy.notes + code.notes
    )


def measure_toy(*, smoke: bool = False) -> Result:
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


def measure_code(*, smoke: bool = False, workdir: str = "/tmp/flow_mtp_code") -> Result:
    """The code teacher (part `code`): tokens/s of PTP decoding with lossless verification vs
    the teacher's own KV-cached autoregressive sampling at the same u-free cost model, side by
    side in one run, and the accepted tokens per teacher call behind it.

    The teacher is the experiment's (`code_experiment.FULL`, read from `workdir`'s cache when
    `python -m methods.flow_mtp.code_experiment` trained it there, else trained now); the PTP
    student is fine-tuned from it here for `student_steps` at the experiment's chosen rate.
    Both decoders sample at T = 0.7 / top-k 50 / top-p 0.95; PTP rounds see the last C bytes,
    AR decoding its whole (growing) prefix through the cache."""
    from core import results as results_lib
    from methods.flow_mtp import code_experiment as ce
    from methods.flow_mtp import code_teacher

    s = ce.QUICK if smoke else ce.FULL
    student_steps, lr = (2, 3e-3) if smoke else (250, 3e-3)
    code = ce.code_hash()
    start = time.perf_counter()
    teacher, info = code_teacher.train_teacher(s.teacher, workdir, code=code)
    pool = ce.teacher_pool(teacher, s, "train", s.pool, 0)
    config = ce.drafter_config(s, "ptp", 0, lr, student_steps, "test")
    with tempfile.TemporaryDirectory() as run_dir:
        method = ce.ptp_method(teacher, s, pool)
        params = train.run(config, method, run_dir, devices=jax.devices()[:1]).state.params
    setup_s = time.perf_counter() - start

    rows, num_tokens, repeats = s.decode_rows, s.decode_tokens, (2 if smoke else 5)
    prompts = ce.corpus.python_stdlib().windows("test", length=s.context_len, count=rows, seed=9)
    mask = jnp.ones(prompts.shape, bool)
    _, generate = ce._eval_fns("ptp", teacher.cfg, s, False)
    u_BN = jax.random.uniform(jax.random.PRNGKey(2), (rows, num_tokens))
    ar = jax.jit(
        lambda p, c, u: code_teacher.ar_sample(
            code_teacher.CodeTeacher(teacher.cfg, p), ce.TRANSFORM, c, u
        )
    )
    key = jax.random.PRNGKey(1)
    times = {
        "ptp_decode_s": median_seconds(
            lambda: jax.block_until_ready(generate(params, teacher.params, prompts, mask, key)),
            repeats,
        ),
        "ar_decode_s": median_seconds(
            lambda: jax.block_until_ready(ar(teacher.params, prompts, u_BN)), repeats
        ),
    }
    out = jax.device_get(generate(params, teacher.params, prompts, mask, key))
    per_call = float(out.accepted) / float(out.calls)
    produced = rows * num_tokens
    ptp_tps, ar_tps = produced / times["ptp_decode_s"], produced / times["ar_decode_s"]
    size = (
        f"code teacher {teacher.cfg.num_layers}-layer d={teacher.cfg.d_model} "
        f"({info['num_params']} params), {rows} rows, context {s.context_len}"
    )
    ratios = [
        Ratio(
            f"decoding {num_tokens} bytes per row ({size}): PTP with verification vs AR",
            f"PTP (L = {s.completion_len}, {per_call:.2f} accepted per teacher call)",
            ptp_tps,
            "the teacher's KV-cached AR sampling",
            ar_tps,
            "tokens/s",
        ),
        Ratio(
            f"PTP decoding ({size}, student fine-tuned {student_steps} steps)",
            "tokens accepted",
            float(out.accepted),
            "teacher calls (row x round)",
            float(out.calls),
            "tokens",
        ),
    ]
    details = {
        "config": {"settings": str(s), "student_steps": student_steps, "lr": lr},
        "teacher_test_bits_per_byte": info["test_bits_per_byte"],
        "setup_seconds": setup_s,
        "seconds": times,
        "ptp_tokens_per_s": ptp_tps,
        "ar_tokens_per_s": ar_tps,
        "accepted": int(out.accepted),
        "calls": int(out.calls),
        "rounds": int(out.rounds),
        "accepted_per_call": per_call,
        "code_source_hash": code,
        "code_version": results_lib.code_version("flow_mtp")["git_commit"],
        "machine": machine(),
    }
    return Result(ratios, details)


if __name__ == "__main__":  # python -m methods.flow_mtp.bench [--smoke]: the code bench alone
    import json
    import sys

    from core.benchmark import json_ready, load_avg_1m, markdown

    start_machine = machine()
    result = measure_code(smoke="--smoke" in sys.argv)
    print(markdown({"flow_mtp/code": result}, start_machine, load_avg_1m()))
    print(json.dumps(result.details, default=json_ready, indent=1))
