"""The LM baseline's small experiment: which synthetic tasks a 2-layer RoPE transformer learns.

Each task is trained from scratch through `core.train.run` and evaluated on held-out examples.
Claims (ours, for the baseline; later methods compare against these numbers):
- copy, multi-query associative recall and modular arithmetic with a scratchpad are learned to
  high held-out accuracy within a few hundred steps;
- prefix parity is *not* learned by a softmax transformer with RoPE: accuracy stays near chance
  (the failure that Selective RoPE, paper 5, addresses).
"""

import dataclasses

from configs import lm
from core import train
from core.claims import Claim, Report
from methods.lm import make


@dataclasses.dataclass(frozen=True)
class TaskRun:
    task: str
    steps: int
    quick_steps: int
    metric: str
    op: str
    target: float
    claim: str
    overrides: dict = dataclasses.field(default_factory=dict)


RUNS = (
    TaskRun("copy", 400, 150, "exact_match", ">=", 0.95, "copying is learned"),
    TaskRun("mqar", 600, 200, "accuracy", ">=", 0.90, "associative recall is learned"),
    TaskRun("modular", 600, 200, "answer_accuracy", ">=", 0.90, "modular arithmetic is learned"),
    TaskRun("parity", 400, 100, "accuracy", "<", 0.75, "RoPE transformer fails prefix parity"),
)


def task_config(run: TaskRun, quick: bool):
    config = lm.get_config(f"task={run.task}")
    config.model.num_layers, config.model.d_model = 2, 64
    config.model.num_heads, config.model.d_ff = 4, 256
    config.train.steps = run.quick_steps if quick else run.steps
    config.train.batch_size = 64
    config.train.log_every = max(config.train.steps // 4, 1)
    config.train.checkpoint_every = 0
    config.optim.lr, config.optim.warmup_steps = 3e-3, 50
    config.eval.num_examples = 512
    for key, value in run.overrides.items():
        section, field = key.split(".")
        config[section][field] = value
    return config


def run(workdir: str, *, quick: bool = False) -> Report:
    claims, metrics = [], {}
    for task_run in RUNS:
        config = task_config(task_run, quick)
        print(f"-- lm/{task_run.task}: {config.train.steps} steps", flush=True)
        result = train.run(config, make(config), f"{workdir}/{task_run.task}")
        evals = [row for row in result.history if any(k.startswith("eval/") for k in row)]
        final = {k.removeprefix("eval/"): v for k, v in evals[-1].items() if k != "step"}
        metrics[task_run.task] = {**final, "steps": config.train.steps}
        claims.append(
            Claim(
                text=task_run.claim,
                metric=f"{task_run.task}/{task_run.metric}",
                measured=final[task_run.metric],
                op=task_run.op,
                target=task_run.target,
            )
        )
    return Report(
        method="lm",
        claims=claims,
        metrics=metrics,
        command="python -m launch.reproduce --methods=lm" + (" --quick" if quick else ""),
    )
