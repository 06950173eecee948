"""One run of part `code`'s re-test (issue 47; `experiment_code_v2` states the arms and claims):
a drafter trained on the shared pool of teacher completions, then scored.

    metrics = run(config, run_dir)   # core.experiment_runner's run: config from config_of

The teacher is part `code`'s (same settings, so the same 2.72 bits/byte network), trained once
per workdir; the pools of teacher completions (`code_drafters.teacher_pool`, unchanged) are
generated once per workdir and kept on disk (`<workdir>/pools`), so every arm, seed and grid
point trains on the same arrays and an interrupted grid resumes without regenerating them.
Drafters (config.drafter):
- "ptp": `lora_student` (LoRA on the frozen teacher, slots shifted by -1, the official layout);
- "medusa": `medusa.py` unchanged (L heads on the frozen teacher's last state; proposes by the
  inverse CDF of each head at the u's PTP is given: u-coupled, closer to the paper's
  "independent prediction" ablation than to published Medusa, which drafts argmax trees).
Both: the same pool, batch, steps, schedule and learning-rate grid (`experiment_code_v2`).
"""

import dataclasses
import functools
import hashlib
import json
import os
import time

import jax
import numpy as np

from configs.common import base_config, set_training
from core import corpus, results, train
from methods.flow_mtp import (
    code_drafters,
    code_experiment,
    code_teacher,
    lora_student,
    medusa,
)

DRAFTERS = ("ptp", "medusa")
# The pools and the teacher depend on these (and core/); the drafters' runs on these and more
# (experiment_code_v2's `sources`).
POOL_SOURCES = ("bins.py", "code_teacher.py", "code_drafters.py", "__init__.py")
SPLIT_SEEDS = {"train": 0, "validation": 1, "test": 2}  # part `code`'s pool seeds


@functools.cache
def source_hash(names) -> str:
    """Hashed once per process, like the runner's code key: a file touched for a moment while a
    grid runs (another session's edit of core/) must not give one grid several teachers."""
    return results.source_hash(results.source_files() + [f"methods/flow_mtp/{n}" for n in names])


def config_of(s: code_experiment.Settings, lora: lora_student.LoraSettings, drafter: str,
              seed: int, lr: float):  # fmt: skip
    """One drafter run's config: everything but drafter, lr and seed is shared by the arms."""
    c = base_config("auto")
    c.method = "flow_mtp_code_v2"
    c.drafter = drafter
    c.seed, c.dtype = seed, "float32"
    set_training(c, steps=s.steps, batch_size=s.batch_size, lr=lr)
    c.optim.weight_decay = 0.01
    c.optim.warmup_steps = min(100, s.steps // 10)
    c.train.checkpoint_every, c.train.eval_every = 0, -1
    c.train.log_every = max(s.steps // 5, 1)
    # Settings but the grid and claims (a run is the same run in a wider grid).
    c.part = {k: v for k, v in dataclasses.asdict(s).items() if k not in ("lr_grid", "margin")}
    c.lora = dataclasses.asdict(lora)
    return c


def settings_of(config) -> tuple[code_experiment.Settings, lora_student.LoraSettings]:
    part = dict(config.part)
    part["teacher"] = code_teacher.TeacherSettings(**part["teacher"])
    s = code_experiment.Settings(**part, lr_grid=(), margin=0.0)
    return s, lora_student.LoraSettings(**config.lora)


# ------------------------------------------------------------------ teacher and pools


def teacher_of(s: code_experiment.Settings, workdir: str):
    return code_teacher.train_teacher(s.teacher, workdir, code=source_hash(POOL_SOURCES))


def pool(teacher, s: code_experiment.Settings, split: str, count: int, workdir: str) -> dict:
    """`code_drafters.teacher_pool` for one split, generated once and kept in
    <workdir>/pools/<key>.npz (key: teacher, settings, split, count, code)."""
    fields = ("context_len", "generated", "completion_len")
    what = {
        "teacher": dataclasses.asdict(s.teacher),
        **{f: getattr(s, f) for f in fields},
        "split": split,
        "count": count,
        "code": source_hash(POOL_SOURCES),
    }
    key = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:20]
    path = os.path.join(workdir, "pools", f"{key}.npz")
    if os.path.exists(path):
        with np.load(path) as stored:
            return {k: stored[k] for k in stored.files}
    start = time.perf_counter()
    arrays = code_drafters.teacher_pool(teacher, s, split, count, SPLIT_SEEDS[split])
    seconds = time.perf_counter() - start
    print(f"-- flow_mtp/code_v2 pool {split}: {count} completions in {seconds:.0f} s", flush=True)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp.npz"
    arrays = {**arrays, "seconds": np.float64(seconds)}
    np.savez(tmp, **arrays)
    os.replace(tmp, path)  # never a half-written pool
    return arrays


def fingerprint(arrays: dict) -> str:
    """SHA-256 (first 16 hex) of a pool's contexts, completions and u's."""
    digest = hashlib.sha256()
    for k in ("context", "completion", "u"):
        digest.update(np.ascontiguousarray(arrays[k]).tobytes())
    return digest.hexdigest()[:16]


# ------------------------------------------------------------------ drafters


def drafter_method(drafter: str, teacher, s, lora, train_pool: dict):
    """The drafter's core Method; both read the same `train_pool`."""
    if drafter == "ptp":
        cfg = code_drafters.student_config(teacher, s)
        cfg = dataclasses.replace(cfg, shift_positions=lora.shift_positions)
        return lora_student.make_method(teacher, cfg, lora, train_pool, s.batch_size)
    if drafter == "medusa":
        return code_drafters.medusa_method(teacher, s, train_pool)
    raise ValueError(f"drafter={drafter!r}; expected one of: {', '.join(DRAFTERS)}")


def _proposer(drafter, teacher, s, lora, params, greedy):
    if drafter == "ptp":
        cfg = code_drafters.student_config(teacher, s)
        return lora_student.proposer(cfg, lora, teacher.params, params)
    return medusa.drafter(teacher, params, greedy=greedy)


@functools.cache
def _eval_fns(drafter, teacher_cfg, s, lora, greedy: bool):
    """(correct, generate) of `drafter` (`code_experiment.jitted_evals`), once per shape."""
    return code_experiment.jitted_evals(
        teacher_cfg, s, lambda teacher, params: _proposer(drafter, teacher, s, lora, params, greedy)
    )


def correct_prefix(fns, params, teacher, arrays: dict, chunk: int = 512) -> float:
    correct, _ = fns
    keys = ("context", "context_mask", "u", "completion")
    n = len(arrays["context"])
    got = [
        np.asarray(correct(params, teacher.params, *(arrays[k][i : i + chunk] for k in keys)))
        for i in range(0, n, chunk)
    ]
    return float(np.concatenate(got).mean())


def accepted_per_call(fns, params, teacher, s, seed: int) -> dict:
    """Decode s.decode_rows test prompts (the key and prompts of the seed, the same for every
    drafter): tokens accepted per teacher call (a mean over calls) and the mean over rows."""
    prompts = corpus.python_stdlib().windows(
        "test", length=s.context_len, count=s.decode_rows, seed=10_000 + seed
    )
    _, generate = fns
    mask = np.ones_like(prompts, bool)
    out = jax.device_get(generate(params, teacher.params, prompts, mask, jax.random.PRNGKey(seed)))
    rows = np.asarray(out.accepted_B) / np.asarray(out.calls_B)
    return {
        "accepted_per_call": float(out.accepted) / float(out.calls),
        "row_mean_accepted_per_call": float(rows.mean()),
        "calls": int(out.calls),
    }


def run(config, run_dir: str) -> dict:
    """core.experiment_runner's run: train config.drafter on the train pool, then validation
    correct prefix (the selection's), test correct prefix and decoding figures."""
    s, lora = settings_of(config)
    workdir = os.path.dirname(os.path.dirname(run_dir))  # <workdir>/runs/<key>
    teacher, _ = teacher_of(s, workdir)
    sizes = {"train": s.pool, "validation": s.num_val, "test": s.num_test}
    pools = {split: pool(teacher, s, split, n, workdir) for split, n in sizes.items()}
    method = drafter_method(config.drafter, teacher, s, lora, pools["train"])
    start = time.perf_counter()
    params = train.run(config, method, run_dir, devices=jax.devices()[:1]).state.params
    out = {"train_seconds": time.perf_counter() - start}
    fns = _eval_fns(config.drafter, teacher.cfg, s, lora, False)
    out["validation/correct"] = correct_prefix(fns, params, teacher, pools["validation"])
    out["test/correct"] = correct_prefix(fns, params, teacher, pools["test"])
    decoded = accepted_per_call(fns, params, teacher, s, config.seed)
    out.update({f"test/{k}": v for k, v in decoded.items()})
    if config.drafter == "medusa":  # each head's argmax (published Medusa's draft): no claim
        greedy = _eval_fns(config.drafter, teacher.cfg, s, lora, True)
        out["test/greedy_correct"] = correct_prefix(greedy, params, teacher, pools["test"])
        decoded = accepted_per_call(greedy, params, teacher, s, config.seed)
        out["test/greedy_accepted_per_call"] = decoded["accepted_per_call"]
    out["pool"] = {
        "train": fingerprint(pools["train"]),
        "size": int(len(pools["train"]["context"])),
        "generation_seconds": float(pools["train"]["seconds"]),
    }
    out["steps"] = int(config.train.steps)
    out["seconds"] = time.perf_counter() - start
    return out
