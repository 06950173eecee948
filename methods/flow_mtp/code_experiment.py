"""Part `code` of flow_mtp: O-PTP distilled from a byte-level code teacher vs a Medusa drafter.

Teacher: `code_teacher` (a small byte-level transformer trained once through `core.train` on
the standard library's Python sources, shared by every seed). Teacher data, as the official
pregeneration (configs/pregenerate.yaml of mandt-lab/ptp): completions of L bytes sampled at
temperature 0.7, top-k 50, top-p 0.95 after C-byte prompts from the corpus (train split for
training, validation split for the choice of learning rate, test split for the numbers), each
byte the inverse CDF at a uniform u drawn up front and kept.

Drafters, each trained through `core.train` on the same teacher completions with the same
batch, steps, learning-rate grid and rule (best validation correct prefix at a short budget
on seed 0):
- PTP: the u-slot student of `model.py` unchanged, its network initialised from the teacher's
  weights (same architecture) and fine-tuned in full (not LoRA), O-PTP loss with u ~ Beta(0.3,
  0.3) inside the teacher's bin of each observed token (bins precomputed from the teacher once
  per completion, so a step costs the student's pass only);
- Medusa: `medusa.py`, L independent heads on the frozen teacher's last hidden state.

Evaluation at the same u's: on the test completions each drafter proposes from the u's that
generated them (PTP: argmax of the slot given u; Medusa: inverse CDF of its head at u) and the
correct prefix is the number of leading proposed bytes equal to the teacher's; then
`decode.generate` (the existing lossless verification: the teacher's Pick(u_j, P_j)) decodes
from test prompts with the same random key for both drafters: accepted tokens per teacher call.

Claims (fixed before the first full run), paired by seed over 3 seeds (seed = the drafters'
training and the evaluation key; the teacher is shared):
- accepted tokens per teacher call under lossless verification: PTP - Medusa > 0.25
  (quick: > 0);
- PTP's mean correct prefix per call on the test completions is at least 1 byte (quick: 0.25).
Also reported, without a claim: Medusa's correct prefix, a greedy (argmax) Medusa's accepted
tokens per call, the teacher's test bits/byte and the corpus's file count, bytes and SHA-256.

The teacher pools and the drafters' Methods are in `code_drafters.py`; this module evaluates the
drafters, chooses the learning rates, runs the seeds and derives the claims.
"""

import dataclasses
import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from configs.common import base_config, set_training
from core import cache, corpus, results, selection, train
from core.claims import IntervalClaim, Report
from methods.flow_mtp import bins, code_teacher, decode, medusa
from methods.flow_mtp.code_drafters import (
    TRANSFORM,
    medusa_method,
    ptp_method,
    student_config,
    teacher_pool,
)

PART = "code"
SEEDS = (0, 1, 2)
VARIANTS = ("ptp", "medusa")
# The modules this part's numbers depend on: a change elsewhere in flow_mtp (the toy part, the
# other helper's C-PTP) does not invalidate these runs.
DEPENDS = (
    "bins.py",
    "model.py",
    "decode.py",
    "__init__.py",
    "code_teacher.py",
    "medusa.py",
    "code_drafters.py",
)


@dataclasses.dataclass(frozen=True)
class Settings:
    teacher: code_teacher.TeacherSettings
    context_len: int  # C: prompt bytes the drafters and verification see
    generated: int  # contexts end after 0..generated teacher bytes (teacher_pool)
    completion_len: int  # L
    pool: int  # teacher completions to train on
    num_val: int  # validation completions (learning-rate choice)
    num_test: int  # test completions (correct prefix)
    decode_rows: int  # test prompts decoded with verification
    decode_tokens: int  # bytes decoded per prompt
    steps: int
    select_steps: int  # 0: no search (quick)
    batch_size: int
    lr_grid: tuple
    margin: float  # accepted per call, PTP - Medusa
    target: float  # PTP's correct prefix


FULL = Settings(
    teacher=code_teacher.TeacherSettings(2, 64, 4, 192, 64, 400, 16, 3e-3, 256),
    context_len=16,
    generated=32,
    completion_len=8,
    pool=2048,
    num_val=256,
    num_test=512,
    decode_rows=64,
    decode_tokens=48,
    steps=250,
    select_steps=80,
    batch_size=32,
    # 1e-3 / 3e-3 / 1e-2 chose Medusa's 1e-3 (the low edge; contexts of real code only): 3e-4
    # added; with generated contexts Medusa then chose 1e-2 (the high edge): 3e-2 added.
    lr_grid=(3e-4, 1e-3, 3e-3, 1e-2, 3e-2),
    margin=0.25,
    target=1.0,
)
QUICK = Settings(
    teacher=code_teacher.TeacherSettings(1, 32, 2, 64, 32, 40, 16, 1e-2, 64),
    context_len=8,
    generated=8,
    completion_len=4,
    pool=256,
    num_val=64,
    num_test=128,
    decode_rows=16,
    decode_tokens=16,
    steps=40,
    select_steps=0,
    batch_size=16,
    lr_grid=(3e-3,),
    margin=0.0,
    target=0.25,
)


def code_hash() -> str:
    files = results.source_files() + [f"methods/flow_mtp/{f}" for f in DEPENDS]
    return results.source_hash(files)


# ------------------------------------------------------------------ drafters: evaluation, runs


def proposer(variant: str, teacher, s: Settings, params, *, greedy: bool = False):
    """propose(context_BC, context_mask_BC, u_BL) of a trained drafter (decode.generate's)."""
    if variant == "ptp":
        return functools.partial(decode.student_proposal, student_config(teacher, s), params)
    return medusa.drafter(teacher, params, greedy=greedy)


def jitted_evals(teacher_cfg, s, proposer_of):
    """(correct, generate) for the drafter `proposer_of(teacher, params)` builds, jitted once:
    params and teacher params are arguments, so every seed and learning rate reuses the
    compiled programs (the caller caches this per drafter and shape)."""

    def propose_of(params, teacher_params):
        teacher = code_teacher.CodeTeacher(teacher_cfg, teacher_params)
        return teacher, proposer_of(teacher, params)

    @jax.jit
    def correct(params, teacher_params, context_BC, mask_BC, u_BL, completion_BL):
        _, propose = propose_of(params, teacher_params)
        return bins.leading_matches(propose(context_BC, mask_BC, u_BL), completion_BL)

    @jax.jit
    def generate(params, teacher_params, prompt_BC, mask_BC, key):
        teacher, propose = propose_of(params, teacher_params)
        probs_fn = decode.markov_teacher_probs(teacher, TRANSFORM)
        return decode.generate(
            propose,
            probs_fn,
            prompt_BC,
            mask_BC,
            key,
            num_tokens=s.decode_tokens,
            completion_len=s.completion_len,
        )

    return correct, generate


@functools.cache
def _eval_fns(variant: str, teacher_cfg, s: Settings, greedy: bool):
    """`jitted_evals` of v1's drafter `variant`, once per shape."""
    return jitted_evals(
        teacher_cfg, s, lambda teacher, params: proposer(variant, teacher, s, params, greedy=greedy)
    )


def correct_prefix(variant, teacher, s, params, pool: dict, *, greedy: bool = False) -> float:
    """Mean leading proposed bytes equal to the teacher's, at the u's that generated them."""
    correct, _ = _eval_fns(variant, teacher.cfg, s, greedy)
    keys = ("context", "context_mask", "u", "completion")
    return float(jnp.mean(correct(params, teacher.params, *(pool[k] for k in keys))))


def accepted_per_call(variant, teacher, s, params, seed: int, *, greedy: bool = False) -> dict:
    """Decode test prompts with lossless verification; the same key for every drafter."""
    prompts = corpus.python_stdlib().windows(
        "test", length=s.context_len, count=s.decode_rows, seed=10_000 + seed
    )
    _, generate = _eval_fns(variant, teacher.cfg, s, greedy)
    mask = np.ones_like(prompts, bool)
    out = jax.device_get(generate(params, teacher.params, prompts, mask, jax.random.PRNGKey(seed)))
    return {
        "accepted_per_call": float(out.accepted) / float(out.calls),
        "accepted": int(out.accepted),
        "calls": int(out.calls),
    }


def drafter_config(s: Settings, variant: str, seed: int, lr: float, steps: int, split: str):
    c = base_config("auto")
    c.method = f"flow_mtp_code_{variant}"
    c.seed, c.dtype = seed, "float32"
    set_training(c, steps=steps, batch_size=s.batch_size, lr=lr)
    c.optim.weight_decay = 0.01
    c.train.checkpoint_every, c.train.eval_every = 0, -1
    c.train.log_every = max(steps // 3, 1)
    # The cache key holds every setting but the grid (a run is the same run in a wider grid).
    c.part = {k: v for k, v in dataclasses.asdict(s).items() if k != "lr_grid"}
    c.evaluate_on = split
    return c


def train_drafter(variant, teacher, s, pools, seed, lr, steps, split, workdir, code) -> dict:
    config = drafter_config(s, variant, seed, lr, steps, split)
    print(f"-- flow_mtp/code {variant} seed {seed} lr {lr:g} ({split}): {steps} steps", flush=True)

    def compute():
        start = time.perf_counter()
        make = ptp_method if variant == "ptp" else medusa_method
        run_dir = os.path.join(workdir, "runs", cache.key(config, code))
        method = make(teacher, s, pools("train"))
        state = train.run(config, method, run_dir, devices=jax.devices()[:1]).state
        params = state.params
        out = {"correct": correct_prefix(variant, teacher, s, params, pools(split))}
        if split == "test":
            out.update(accepted_per_call(variant, teacher, s, params, seed))
            if variant == "medusa":  # each head's argmax: reported, no claim
                out["greedy_correct"] = correct_prefix(
                    variant, teacher, s, params, pools(split), greedy=True
                )
                greedy = accepted_per_call(variant, teacher, s, params, seed, greedy=True)
                out["greedy_accepted_per_call"] = greedy["accepted_per_call"]
        out["seconds"] = time.perf_counter() - start
        return out

    return cache.cached(compute, config=config, code=code, root=os.path.join(workdir, "cache"))


def choose_lr(variant, teacher, s, pools, workdir, code) -> tuple[float, dict]:
    if not s.select_steps:
        return s.lr_grid[0], {}
    by_point = {}
    for lr in s.lr_grid:
        out = train_drafter(
            variant, teacher, s, pools, 0, lr, s.select_steps, "validation", workdir, code
        )
        by_point[(lr,)] = {0: out["correct"]}
    chosen = selection.select(
        {"lr": s.lr_grid}, selection.ValidationScores("validation/correct", by_point), rule="max"
    )
    info = {"means": {f"{k[0]:g}": v for k, v in chosen.means.items()}, "edge": chosen.edges["lr"]}
    return chosen.point["lr"], info


def measure(workdir: str, *, quick: bool = False, seeds=SEEDS) -> dict:
    s = QUICK if quick else FULL
    code = code_hash()
    teacher, teacher_info = code_teacher.train_teacher(s.teacher, workdir, code=code)
    print(f"-- flow_mtp/code teacher: test {teacher_info['test_bits_per_byte']:.3f} bits/byte")
    sizes = {"train": (s.pool, 0), "validation": (s.num_val, 1), "test": (s.num_test, 2)}

    @functools.cache
    def pools(split):  # built only when a run is not cached
        count, seed = sizes[split]
        return teacher_pool(teacher, s, split, count, seed)

    rows, chosen = [], {}
    for variant in VARIANTS:
        lr, info = choose_lr(variant, teacher, s, pools, workdir, code)
        chosen[variant] = {"lr": lr, **info}
        for seed in seeds:
            out = train_drafter(
                variant, teacher, s, pools, seed, lr, s.steps, "test", workdir, code
            )
            rows.append({"part": PART, "variant": variant, "seed": seed, "lr": lr, **out})
    return results.record(
        "flow_mtp",
        f"{'quick' if quick else 'full'}_{PART}",
        config={
            "part": PART,
            "seeds": list(seeds),
            "quick": quick,
            "settings": dataclasses.asdict(s),
            "transform": TRANSFORM._asdict(),
            "chosen": chosen,
            "teacher_shared_across_seeds": True,
        },
        rows=rows,
        code={**results.code_version("flow_mtp"), "part_source_hash": code},
        teacher=teacher_info,
    )


def claims_code(record: dict) -> list[IntervalClaim]:
    s = record["config"]["settings"]
    rows = [r for r in record["rows"] if r.get("part") == PART]
    ptp = results.by_seed(rows, "accepted_per_call", variant="ptp")
    med = results.by_seed(rows, "accepted_per_call", variant="medusa")
    return [
        IntervalClaim.beats(
            f"PTP accepts more tokens per teacher call than a Medusa drafter at the same u "
            f"(lossless verification; by > {s['margin']:g})",
            "code/accepted per call: ptp - medusa",
            ptp,
            med,
            s["margin"],
        ),
        IntervalClaim.at_least(
            f"PTP's correct prefix per call on test completions is at least {s['target']:g} byte",
            "code/ptp correct prefix",
            results.by_seed(rows, "correct", variant="ptp"),
            s["target"],
        ),
    ]


def run(workdir: str, *, quick: bool = False) -> Report:
    record = measure(workdir, quick=quick)
    claims = claims_code(record)
    return Report.on_protocol(
        method="flow_mtp",
        figures=[],
        claims=claims,
        command="python -m methods.flow_mtp.code_experiment" + (" --quick" if quick else ""),
        results=record,
    )


if __name__ == "__main__":
    import sys

    from core import compile_cache

    compile_cache.enable()  # the seeds' training programs are identical: compiled once
    quick = "--quick" in sys.argv
    out = "/tmp/flow_mtp_code" + ("_quick" if quick else "")
    report = run(out, quick=quick)
    for claim in report.claims:
        print(claim)
    path = results.save(report.results, None if not quick else os.path.join(out, "results"))
    print("saved", path)
