"""DOIT (paper 14): switching optimisers every tau steps, chosen by one Gaussian-process
surrogate per optimiser (core.cycles runs the cycles; this package holds the policy).

`make(config)`: `config.doit.task` (rosenbrock | camel | digits), `config.doit.policy` (doit |
random | periodic | single, with `config.doit.single` the optimiser's name), the pool
(`config.doit.pool`: core.cycles specs, plus the kinds swats, padam and adabound) and the DOIT
settings.
"""

import jax
import numpy as np

from core import cycles
from core.errors import ConfigError
from core.method import Method
from methods.doit import optimizers, policy, problems

POLICIES = ("doit", "random", "periodic", "single")


def pool(spec) -> dict:
    """core.cycles specs, with this package's SWATS, Padam and AdaBound as three more kinds."""
    out = {}
    for name, entry in spec.items():
        kind = entry.get("kind")
        if kind == "swats":
            out[name] = optimizers.swats(float(entry["lr"]))
        elif kind == "padam":
            out[name] = optimizers.padam(float(entry["lr"]), float(entry.get("partial", 0.125)))
        elif kind == "adabound":
            out[name] = optimizers.adabound(float(entry["lr"]), float(entry.get("final_lr", 0.1)))
        else:
            out[name] = dict(entry)
    return cycles.make_pool(out)


def settings(config, num_optimizers: int) -> policy.Settings:
    d = config.doit
    return policy.Settings(
        num_optimizers=num_optimizers,
        num_cycles=config.train.steps,
        n_ini=d.n_ini,
        components=d.components,
        layers=d.layers,
        alpha=d.alpha,
        w_min=d.w_min,
        halving=d.halving,
        omega_t=d.omega_t,
        schedule=d.schedule,
    )


def hook_for(name: str, s: policy.Settings, timers=None):
    if name == "doit":
        return policy.doit_hook(s, timers)
    if name == "random":
        return policy.random_hook(s.num_optimizers)
    if name == "periodic":
        return policy.periodic_hook(s.num_optimizers)
    if name == "single":
        return None
    raise ConfigError(f"doit.policy={name!r} is unknown; expected one of: {', '.join(POLICIES)}")


def task(config) -> Method:
    if config.doit.task == "digits":
        return problems.digits_mlp(config.train.batch_size)
    return problems.toy(config.doit.task)


def make(config, *, timers=None, base: Method | None = None) -> Method:
    """DOIT over `config`'s task, or over `base` (a Method with a loss and a dataset) when
    given: the transfer experiment's head on pretrained features."""
    d = config.doit
    if d.schedule not in ("self_consistent", "printed"):
        raise ConfigError(f"doit.schedule={d.schedule!r}: expected self_consistent or printed")
    txs = pool(d.pool)
    names = list(txs)
    s = settings(config, len(names))
    base = base or task(config)

    def init(rng, batch_spec):
        variables = base.init(rng, batch_spec)
        return {**variables, "doit": policy.initial_state(s, variables["params"])}

    first = lambda rng: jax.random.randint(rng, (), 0, len(names))
    if d.policy == "periodic":
        first = 0
    elif d.policy == "single":
        if d.single not in names:
            raise ConfigError(f"doit.single={d.single!r} is not in the pool {names}")
        first = names.index(d.single)
    hook = hook_for(d.policy, s, timers)
    return cycles.with_cycles(
        base._replace(init=init), tau=d.tau, pool=txs, hook=hook, inherit=d.inherit, first=first
    )


def first_optimizer(state) -> int:
    return int(np.asarray(state.extra[cycles.OPTIMIZER]))
