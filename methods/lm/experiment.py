"""The LM baseline's small experiment: which synthetic tasks a 2-layer RoPE transformer learns.

Each task is trained from scratch through `core.train.run` and evaluated on held-out examples.
Claims (ours, for the baseline; later methods compare against these numbers):
- copy, multi-query associative recall and modular arithmetic with a scratchpad are learned to
  high held-out accuracy within a few hundred steps;
- prefix parity is *not* learned by a softmax transformer with RoPE: the parity of the whole
  sequence stays near chance (the failure that Selective RoPE, paper 5, addresses).
"""

import dataclasses
import os

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
    task_options: dict = dataclasses.field(default_factory=dict)


RUNS = (
    TaskRun("copy", 200, 100, "exact_match", ">=", 0.95, "copying is learned"),
    TaskRun(
        "mqar",
        800,
        500,
        "exact_match",
        ">=",
        0.90,
        "multi-query associative recall is learned",
        # 4 pairs over 16 keys: learned in a few hundred steps. 8 pairs over 32 keys was still
        # at chance (0.15) after 1000 steps of this model: an induction-head phase change that
        # comes later than a CPU budget allows.
        dict(num_pairs=4, num_keys=16, num_values=16, num_queries=4),
    ),
    # Under teacher forcing each scratchpad entry is one modular operation on the previous one;
    # exact match requires every entry (and the repeated answer) right.
    TaskRun("modular", 300, 300, "exact_match", ">=", 0.90, "modular arithmetic is learned"),
    # Chance is 0.5; with 512 held-out sequences the standard error is 0.022, so 0.6 is well
    # above what a chance-level model reaches and well below solving the task.
    TaskRun(
        "parity", 500, 200, "final_accuracy", "<=", 0.60, "a RoPE transformer fails prefix parity"
    ),
)


def task_config(run: TaskRun, quick: bool):
    config = lm.get_config(f"task={run.task}")
    config.model.num_layers, config.model.d_model = 2, 128
    config.model.num_heads, config.model.d_ff = 4, 512
    config.train.steps = run.quick_steps if quick else run.steps
    config.train.batch_size = 64
    config.train.log_every = max(config.train.steps // 4, 1)
    config.train.checkpoint_every = 0
    config.optim.lr, config.optim.warmup_steps = 1e-3, 50
    config.eval.num_examples = 512
    config.task.update(run.task_options)
    return config


def plot_losses(curves: dict[str, list[float]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for task, losses in curves.items():
        ax.plot(range(1, len(losses) + 1), losses, label=task)
    ax.set(xlabel="step", ylabel="train loss (masked cross-entropy)", yscale="log")
    ax.set_title("LM baseline on synthetic tasks")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(workdir: str, *, quick: bool = False) -> Report:
    claims, metrics, curves = [], {}, {}
    for task_run in RUNS:
        config = task_config(task_run, quick)
        print(f"-- lm/{task_run.task}: {config.train.steps} steps", flush=True)
        result = train.run(config, make(config), f"{workdir}/{task_run.task}")
        evals = [row for row in result.history if any(k.startswith("eval/") for k in row)]
        final = {k.removeprefix("eval/"): v for k, v in evals[-1].items() if k != "step"}
        metrics[task_run.task] = {**final, "steps": config.train.steps}
        curves[task_run.task] = [row["loss"] for row in result.history if "loss" in row]
        claims.append(
            Claim(
                text=task_run.claim,
                metric=f"{task_run.task}/{task_run.metric}",
                measured=final[task_run.metric],
                op=task_run.op,
                target=task_run.target,
            )
        )
    figure = os.path.join(workdir, "lm_loss_curves.png")
    plot_losses(curves, figure)
    return Report(
        method="lm",
        figures=[figure],
        claims=claims,
        metrics=metrics,
        command="python -m launch.reproduce --methods=lm" + (" --quick" if quick else ""),
    )
