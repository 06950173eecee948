"""TPC's runs: one cached training run per (dataset, seed, arm, grid point), and the linear probe.

    runner = Runner(setting, "digits", seed=0, layer=None, workdir=workdir, code=code)
    out = runner.run("progressive", {"lr": 1e-3, "weight_decay": 0.01, "dropout": 0.2})
    out["val_f1"], out["test_f1"]   # F1 at every order (exit); TPC arms add logits Y_val, Y_test
    linear_f1(runner, workdir)      # {"val_f1", "test_f1"} of the sklearn probe

Every run is `core.cache.cached_run` keyed by its config and RUN_SOURCES (this file among them:
what a run computes is here), so editing a claim, a table or a grid retrains no other point.
"""

import os
from typing import TYPE_CHECKING

import jax
import numpy as np
from ml_collections import ConfigDict

from configs import tpc as tpc_config
from core import cache, results
from methods import tpc
from methods.tpc import baselines, model
from methods.tpc import train as tpc_train

if TYPE_CHECKING:
    from methods.tpc.experiment import Setting

TPC_ARMS = ("progressive", "joint_all", "joint")

# Sources whose edit can change a run's numbers (not experiment.py, selections.py or report.py:
# editing a claim, a grid or a table keeps every cached run).
RUN_SOURCES = tuple(
    sorted(
        {*results.source_files()}
        | {
            f"methods/tpc/{f}.py"
            for f in ("__init__", "baselines", "data", "linear", "minilm", "minilm_files")
        }
        | {f"methods/tpc/{f}.py" for f in ("model", "train", "planted", "prompt_set", "runs")}
        | {"configs/tpc.py", "configs/common.py"}
    )
)


def _devices():
    return jax.devices()[:1]  # the probes are tiny: one device, no collectives


def base_config(s: "Setting", dataset: str, seed: int, layer: int | None) -> ConfigDict:
    c = tpc_config.get_config(f"size={s.size},dataset={dataset}")
    c.seed = c.data.seed = seed
    if layer is not None:
        c.data.layer = layer
    c.train.checkpoint_every = 0  # seconds-long runs: a rerun retrains
    return c


def run_config(c: ConfigDict, arm: str, point: dict, epochs: int, n_train: int, hidden=None):
    """The config of one run: `arm` at grid `point`, the equal budget in steps, and what the
    cache key needs (the arm, the MLP width)."""
    c = c.copy_and_resolve_references()
    c.optim.lr, c.optim.weight_decay = point["lr"], point["weight_decay"]
    c.model.dropout = point["dropout"]
    N = c.model.order
    if arm in TPC_ARMS:
        c.model.mode = "progressive" if arm == "progressive" else arm
        per_stage = epochs if arm == "progressive" else epochs * (N - 1)
        c = tpc_train.with_epochs(c, n_train, per_stage)
    else:
        c.train.steps = epochs * (N - 1) * -(-n_train // c.train.batch_size)
    c.experiment = ConfigDict({"arm": arm, "hidden": hidden or 0})
    return c


def _train_and_evaluate(splits):
    """`cached_run`'s function: F1 at every order (exit) on validation and test, and the TPC
    arms' logits (the cascade reads them)."""

    def go(c, run_dir):
        arm = c.experiment.arm
        if arm in TPC_ARMS:
            f = tpc_train.fit(c, splits, run_dir, devices=_devices())
            forward = jax.jit(model.logits)
            Y_val = np.asarray(forward(f.params, splits.x_val))
            Y_test = np.asarray(forward(f.params, splits.x_test))
            N = Y_val.shape[1]
            return {
                "val_f1": [model.f1_score(splits.y_val, Y_val[:, n]) for n in range(N)],
                "test_f1": [model.f1_score(splits.y_test, Y_test[:, n]) for n in range(N)],
                "Y_val": Y_val.tolist(),
                "Y_test": Y_test.tolist(),
            }
        b = baselines.fit(c, "mlp", splits, run_dir, hidden=c.experiment.hidden, devices=_devices())
        return {"val_f1": b.val_f1, "test_f1": b.test_f1}

    return go


class Runner:
    """Cached runs of one dataset and seed."""

    def __init__(self, s: "Setting", dataset: str, seed: int, layer, workdir: str, code: str):
        self.s, self.workdir, self.code = s, workdir, code
        self.c = base_config(s, dataset, seed, layer)
        self.splits = tpc.load_splits(self.c)
        self.label = f"{dataset} seed {seed}"
        D, N, R = self.splits.x_train.shape[1], self.c.model.order, self.c.model.rank
        self.counts = model.param_counts(D, N, R)
        self.hidden = {
            "mlp@2": baselines.mlp_hidden(int(self.counts[1]), D),
            "mlp@N": baselines.mlp_hidden(int(self.counts[-1]), D),
        }

    def run(self, arm: str, point: dict) -> dict:
        c = run_config(
            self.c, arm, point, self.s.epochs, len(self.splits.y_train), self.hidden.get(arm)
        )
        label = f"{self.label} {arm} {point}"
        return cache.cached_run(_train_and_evaluate(self.splits), c, self.code, self.workdir, label)


def linear_f1(runner: Runner, workdir: str) -> dict:
    """The linear probe's validation and test F1, cached (its C sweep takes a minute of CPU on
    prompts)."""

    def fit():
        lin = baselines.fit_linear(runner.splits)
        return {"val_f1": lin.val_f1, "test_f1": lin.test_f1}

    d = runner.c.data
    key = {"linear probe": d.dataset, "seed": d.seed, "layer": d.layer}
    return cache.cached(fit, config=key, code=runner.code, root=os.path.join(workdir, "cache"))
