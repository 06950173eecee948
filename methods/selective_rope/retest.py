"""One run of Selective RoPE's re-test (issue 47, `experiment_v2.py`): train with an evaluation
every `train.eval_every` steps, choose the checkpoint on the VALIDATION stream at the longest
validation length (4x), and report the TEST stream at that checkpoint.

The runner cannot choose checkpoints, so a run does it here: every evaluation scores both
streams on the same parameters (the core's named streams, `evaluators`), and the row keeps the
evaluation whose validation score is highest (the first of equals: the authors' code keeps a
checkpoint only on a strict improvement). The authors' code chooses its checkpoint (and stops)
on the very set it reports (state_tracking/main.py:638-673 at d12e825); this does not.

    row = run(config, workdir)  # {"validation/len512/last_quarter": ..., "test/len512/...": ...,
                                #  "checkpoint_step": ..., "evals": [every evaluation], ...}
"""

import json
import math
import time

import jax

import methods.selective_rope as sr
from core import storage, train
from core.errors import ConfigError
from core.metrics import NonFiniteLossError
from methods.selective_rope import model

SELECT_METRIC = "last_quarter"  # per-position accuracy on the last quarter of positions
METRICS = ("last_quarter", "last_half", "final", "accuracy", "exact_match")


def select_key(config) -> str:
    """The validation metric a checkpoint (and the experiment's lr) is chosen on: the last
    quarter at the longest validation length."""
    return f"validation/len{sr.validation_lengths(config)[-1]}/{SELECT_METRIC}"


def evaluations(history) -> list[dict]:
    """Every evaluation row of a run's history as {"step", "validation/len{T}/<metric>",
    "test/len{T}/<metric>"}, in step order."""
    out = []
    for row in history:
        streams = sr.split_metrics(row)
        flat = {f"{s}/{k}": v for s, metrics in streams.items() for k, v in metrics.items()}
        if flat:
            out.append({"step": int(row["step"]), **flat})
    return out


def choose_checkpoint(evals: list[dict], on: str) -> dict:
    """The evaluation with the highest `on`, a validation metric (the first of equals)."""
    if not on.startswith("validation/"):
        raise ConfigError(f"selective_rope: checkpoints are chosen on validation, not {on!r}")
    scored = [e for e in evals if on in e and math.isfinite(e[on])]
    if not scored:
        raise ConfigError(f"selective_rope: no evaluation scored {on!r}")
    return max(scored, key=lambda e: e[on])


def _logged_evaluations(workdir: str) -> list[dict]:
    """The evaluations a run logged before it stopped (its metrics.jsonl)."""
    path = storage.resolve(workdir) / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return evaluations(rows)


def _chance_row(config) -> dict:
    """Every metric at chance (0.5): a run that diverged before its first evaluation."""
    lengths = {
        "validation": sr.validation_lengths(config),
        "test": sr.eval_lengths(config),
    }
    return {
        f"{split}/len{T}/{m}": 0.5 for split, Ts in lengths.items() for T in Ts for m in METRICS
    }


def run(config, workdir: str) -> dict:
    """Train (one CPU device), evaluate every `train.eval_every` steps, and return the run's row:
    the chosen checkpoint's validation and test metrics, its step, every evaluation ("evals"),
    the parameter count, the final parameters' flip error (selective), whether the loss
    diverged (then the evaluations logged before it are chosen from, or chance if none) and the
    seconds it took."""
    start = time.perf_counter()
    cfg = sr.model_config(config)
    if config.task.name != "parity" or config.train.eval_every <= 0:
        raise ConfigError(
            "selective_rope: the re-test needs task.name='parity' and train.eval_every > 0 (the "
            f"checkpoints to choose from), got {config.task.name!r} and {config.train.eval_every}"
        )
    on = select_key(config)
    row = {"model": config.model.kind, "position": config.model.position}
    row |= {"params": model.count_params(cfg), "d_ff": cfg.d_ff, "steps": config.train.steps}
    row |= {"train_length": config.task.length, "batch_size": config.train.batch_size}
    try:
        result = train.run(config, sr.make(config), workdir, devices=jax.devices()[:1])
        evals, diverged = evaluations(result.history), 0.0
    except NonFiniteLossError as e:
        print(f"   diverged: {e}", flush=True)
        result, evals, diverged = None, _logged_evaluations(workdir), 1.0
    if evals:
        chosen = choose_checkpoint(evals, on)
        row |= {k: v for k, v in chosen.items() if k != "step"}
        row["checkpoint_step"] = chosen["step"]
    else:
        row |= _chance_row(config) | {"checkpoint_step": 0}
    row |= {"evals": evals, "diverged": diverged}
    if result is not None and cfg.position == "selective":
        # Of the last step's parameters, not the chosen checkpoint's (those are not kept).
        row["final_flip_error"] = sr.parity_flip(cfg, result.state.params)["flip_error"]
    return row | {"seconds": time.perf_counter() - start}
