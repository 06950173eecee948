"""Why do accepted tokens per teacher call fall below correct prefix + 1 (issue 47, PTP)?

In part `code`'s record (results/full_code.json) PTP's correct prefix on the test completions is
3.66 of 8, yet decoding accepts 2.44-2.77 bytes per teacher call, not ~4.7; Medusa likewise. One
verification call accepts exactly (leading matches at its u's) + 1, so the two figures differ
only in *which* contexts they average over and *how*:

1. weighting: `accepted / calls` is a mean over calls, and a row spends many calls (short
   rounds) in hard text and few in easy text, so per position it is the harmonic mean of
   (correct + 1), while the test completions' correct prefix is an arithmetic mean over
   contexts (decode.Generated's per-row counts show the row-level part of it);
2. contexts: the test completions' contexts are a corpus prompt followed by 0..32 bytes that
   the teacher generated seeing up to 48 bytes of history; decoding's contexts soon hold only
   bytes that the teacher generated seeing its 16-byte window (plus the round's proposal);
3. accounting: an off-by-one in `decode.generate` (tested separately: an oracle drafter
   accepts exactly L + 1 per call, a drafter that is always wrong exactly 1).

This module measures 1 and 2 on the v1 setting (the same teacher settings, 2,048 completions,
250 steps at the rates v1 chose: PTP 3e-3, Medusa 1e-2; seed 0): for each drafter it decodes
the test prompts (the record's figure), then scores every decoding state of the generated text,
and of text the teacher wrote with its whole history, by the correct prefix + 1 of a fresh call
there (fresh u, the windowed teacher's completion), averaged over positions both ways.

    python -m methods.flow_mtp.acceptance_check            # ~5 min on 2 busy cores
"""

import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from core import corpus, train
from methods.flow_mtp import code_drafters, code_experiment, code_teacher

V1_RATES = {"ptp": 3e-3, "medusa": 1e-2}  # what v1's grid chose (README, part `code`)
DRAWS = 8  # fresh calls scored per decoding state


def train_v1_drafter(variant: str, teacher, s, pool: dict, workdir: str):
    """A v1 drafter's params (full fine-tune PTP or Medusa heads; seed 0, v1's rate)."""
    config = code_experiment.drafter_config(s, variant, 0, V1_RATES[variant], s.steps, "test")
    make = code_drafters.ptp_method if variant == "ptp" else code_drafters.medusa_method
    run_dir = os.path.join(workdir, f"check-{variant}")
    return train.run(
        config, make(teacher, s, pool), run_dir, devices=jax.devices()[:1]
    ).state.params


def per_position(variant: str, teacher, s, params, sequence_BT, key, draws: int) -> np.ndarray:
    """correct + 1 of a fresh call at every decoding state of `sequence_BT` (prompt + text),
    `draws` times: the context is the C bytes before position C + p, p = 0..T - C - 1, the
    completion the windowed teacher's sample at fresh u's (what verification would pick).
    int [draws, B, T - C]."""
    C, L = s.context_len, s.completion_len
    B, T = sequence_BT.shape
    starts = np.arange(T - C)
    context_NC = sequence_BT[:, starts[:, None] + np.arange(C)[None, :]].reshape(-1, C)
    context_NC = np.tile(context_NC, (draws, 1))
    u_NL = np.asarray(jax.random.uniform(key, (context_NC.shape[0], L), jnp.float32))
    pool_fn = code_drafters._pool_fn(teacher.cfg, C, L)
    correct, _ = code_experiment._eval_fns(variant, teacher.cfg, s, False)
    got = []
    for i in range(0, len(context_NC), 512):
        context, u = context_NC[i : i + 512], u_NL[i : i + 512]
        completion = pool_fn(teacher.params, context, u)[0]
        mask = np.ones_like(context, bool)
        got.append(np.asarray(correct(params, teacher.params, context, mask, u, completion)))
    return (np.concatenate(got) + 1).reshape(draws, B, T - C)


def walk(accept_KBP: np.ndarray) -> float:
    """accepted / calls of decoding replayed over the scored states: each row starts at p = 0,
    a call there accepts accept[k, b, p] and jumps that far, until the text is used up (the
    last call's overshoot counted, as `decode.generate` counts it); one walk per draw k."""
    accepted = calls = 0
    K, B, P = accept_KBP.shape
    for k in range(K):
        for b in range(B):
            p = 0
            while p < P:
                calls += 1
                accepted += int(accept_KBP[k, b, p])
                p += int(accept_KBP[k, b, p])
    return accepted / calls


def summary(accept_KBP: np.ndarray) -> dict:
    """correct + 1 over the states: the arithmetic mean (what a mean over contexts gives), the
    harmonic mean of each state's mean over draws, and the replayed decoding (`walk`)."""
    per_state = accept_KBP.mean(axis=0).reshape(-1).astype(np.float64)
    return {
        "arithmetic": float(per_state.mean()),
        "harmonic": float(1 / np.mean(1 / per_state)),
        "replayed": walk(accept_KBP),
    }


def check(workdir: str) -> dict:
    s = code_experiment.FULL
    teacher, _ = code_teacher.train_teacher(s.teacher, workdir, code="acceptance_check")
    train_pool = code_drafters.teacher_pool(teacher, s, "train", s.pool, 0)
    test_pool = code_drafters.teacher_pool(teacher, s, "test", s.num_test, 2)
    prompts = corpus.python_stdlib().windows(
        "test", length=s.context_len, count=s.decode_rows, seed=10_000
    )
    lead_u = np.asarray(jax.random.uniform(jax.random.key(5), (len(prompts), s.decode_tokens)))
    whole_history = np.asarray(
        code_drafters._prefix_fn(teacher.cfg)(teacher.params, prompts, lead_u)
    )
    out = {}
    for variant in ("ptp", "medusa"):
        params = train_v1_drafter(variant, teacher, s, train_pool, workdir)
        pool_correct = code_experiment.correct_prefix(variant, teacher, s, params, test_pool)
        _, generate = code_experiment._eval_fns(variant, teacher.cfg, s, False)
        mask = np.ones_like(prompts, bool)
        decoded = jax.device_get(
            generate(params, teacher.params, prompts, mask, jax.random.PRNGKey(0))
        )
        rows = np.asarray(decoded.accepted_B) / np.asarray(decoded.calls_B)
        windowed_text = np.concatenate([prompts, np.asarray(decoded.tokens_BN)], axis=1)
        key_a, key_b = jax.random.split(jax.random.key(7))
        whole_text = np.concatenate([prompts, whole_history], axis=1)
        out[variant] = {
            "test completions: correct + 1": pool_correct + 1,
            "decode: accepted / calls": float(decoded.accepted) / float(decoded.calls),
            "decode: mean over rows of accepted / calls": float(rows.mean()),
            "decoded text (16-byte teacher)": summary(
                per_position(variant, teacher, s, params, windowed_text, key_a, DRAWS)
            ),
            "whole-history text (up to 64 bytes)": summary(
                per_position(variant, teacher, s, params, whole_text, key_b, DRAWS)
            ),
        }
    return out


def main(argv) -> None:
    workdir = next(
        (a.removeprefix("--workdir=") for a in argv if a.startswith("--workdir=")),
        "/tmp/flow_mtp_acceptance",
    )
    start = time.perf_counter()
    for variant, figures in check(workdir).items():
        print(f"== {variant}")
        for name, value in figures.items():
            if isinstance(value, dict):
                value = ", ".join(f"{k} {v:.3f}" for k, v in value.items())
            else:
                value = f"{value:.3f}"
            print(f"  {name}: {value}")
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    from core import compile_cache

    compile_cache.enable()
    main(sys.argv[1:])
