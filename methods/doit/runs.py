"""The experiment's runs: one compiled cycle program per (task, pool), every arm a host
policy over it (the arms of a task differ only in `Method.hook` and the first optimiser), each
seed a fresh initial state and data stream."""

import jax
import numpy as np

import methods.doit as doit
from configs import doit as doit_config
from core import cycles, train

SINGLES = ("sgd", "sgdm", "adagrad", "rmsprop", "adam")


def task_config(task: str, num_cycles: int, **doit_options):
    c = doit_config.get_config(f"task={task}")
    c.train.steps, c.train.checkpoint_every = num_cycles, 0
    for k, v in doit_options.items():
        c.doit[k] = v
    return c


class Runner:
    """One compiled cycle program per (task, pool); arms are host policies over it."""

    def __init__(self, config, timers=None, base=None):
        self.config = config
        self.method = doit.make(config, timers=timers, base=base)
        one = jax.devices()[:1]
        self.plan = train.plan(config, self.method, devices=one)

    def run(
        self, seed: int, hook, first: int | None, *, evaluate=None, every: int = 0, dataset=None
    ) -> tuple[train.Session, list, list]:
        """A run of `seed` (its start and data) under `hook`; with `evaluate(state)`, its value
        after every `every` cycles: (session, rows, [(step, value), ...]) (steps, not cycles).
        `dataset`: a Method.dataset of the same shapes in place of the method's (per-seed data,
        the same compiled program)."""
        method = self.method._replace(hook=hook)
        session = train.start_session(
            self.config, method, self.plan, seed=seed, dataset=self.dataset(dataset)
        )
        if first is not None:
            where = self.plan.state_shardings.extra[cycles.OPTIMIZER]
            extra = {**session.state.extra, cycles.OPTIMIZER: train.place(np.int32(first), where)}
            session.state = session.state.replace(extra=extra)
        total, tau = self.config.train.steps, self.config.doit.tau
        if evaluate is None:
            return session, session.train(total), []
        rows, curve = [], []
        while len(rows) < total:
            rows += session.train(min(every, total - len(rows)))
            curve.append((len(rows) * tau, float(evaluate(session.state))))
        return session, rows, curve

    def dataset(self, raw):
        if raw is None:
            return self.method.dataset
        return cycles.cycle_batches(raw, self.config.doit.tau)


def arms(config) -> dict:
    """arm -> (hook, first optimiser or None for the init's draw): DOIT, random, periodic and
    each single optimiser, over the pool of `config` (one compiled program for all)."""
    names = list(config.doit.pool)
    settings = doit.settings(config, len(names))
    out = {name: (doit.hook_for(name, settings), None) for name in ("doit", "random")}
    out["periodic"] = (doit.hook_for("periodic", settings), 0)
    return out | {name: (None, names.index(name)) for name in SINGLES}


def shares(chosen_runs: list, names: list) -> dict:
    """Each optimiser's share of the cycles in the first and last quarter of the runs."""
    chosen = np.array(chosen_runs)
    quarter = max(chosen.shape[1] // 4, 1)
    out = {}
    for part, sl in (("early", slice(0, quarter)), ("late", slice(-quarter, None))):
        counts = np.bincount(chosen[:, sl].ravel(), minlength=len(names))
        out[part] = dict(zip(names, np.round(counts / counts.sum(), 3).tolist(), strict=True))
    return out
