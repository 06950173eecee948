"""optax from config: `make(config.optim)` builds the optimiser and its schedule; `scoped`
gives each labelled part of the parameters its own optimiser (or none: frozen)."""

import functools
import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from core import sharding
from core.errors import ConfigError

_OPTIMIZERS = {
    "adamw": lambda c, lr, wd: optax.adamw(lr, b1=c.b1, b2=c.b2, eps=c.eps, weight_decay=wd),
    "adam": lambda c, lr, wd: optax.adam(lr, b1=c.b1, b2=c.b2, eps=c.eps),
    "sgd": lambda c, lr, wd: optax.sgd(lr, momentum=c.momentum or None),
    "lion": lambda c, lr, wd: optax.lion(lr, b1=c.b1, b2=c.b2, weight_decay=wd),
}


def schedule(config, total_steps: int) -> optax.Schedule:
    """Learning rate: linear warmup then `config.schedule` (constant | cosine | linear)."""
    warmup = min(config.warmup_steps, total_steps)
    decay_steps = max(total_steps - warmup, 1)
    if config.schedule == "constant":
        main = optax.constant_schedule(config.lr)
    elif config.schedule == "cosine":
        main = optax.cosine_decay_schedule(config.lr, decay_steps, alpha=config.final_lr_fraction)
    elif config.schedule == "linear":
        main = optax.linear_schedule(config.lr, config.lr * config.final_lr_fraction, decay_steps)
    else:
        raise ConfigError(
            f"optim.schedule={config.schedule!r} is unknown; expected constant, cosine or linear"
        )
    if warmup == 0:
        return main
    return optax.join_schedules([optax.linear_schedule(0.0, config.lr, warmup), main], [warmup])


def weight_decay(config, total_steps: int) -> float | optax.Schedule:
    """`config.weight_decay`, or (with `config.weight_decay_end` set) a half cosine from it to
    `weight_decay_end` over the run (DINO's and Brain-Semantoks' schedule)."""
    end = config.get("weight_decay_end")
    if end is None:
        return config.weight_decay
    if config.name not in ("adamw", "lion"):
        raise ConfigError(f"optim.weight_decay_end={end} needs adamw or lion, not {config.name}")
    start, steps = config.weight_decay, max(total_steps, 1)
    return lambda step: end + (start - end) * 0.5 * (1 + jnp.cos(jnp.pi * step / steps))


def make(config, total_steps: int) -> optax.GradientTransformation:
    """The optimiser named by `config.name`, with optional global-norm clipping in front."""
    if config.name not in _OPTIMIZERS:
        raise ConfigError(
            f"optim.name={config.name!r} is unknown; expected one of: {', '.join(_OPTIMIZERS)}"
        )
    tx = _OPTIMIZERS[config.name](
        config, schedule(config, total_steps), weight_decay(config, total_steps)
    )
    if config.grad_clip:
        tx = optax.chain(optax.clip_by_global_norm(config.grad_clip), tx)
    return tx


class ScopedState(NamedTuple):
    """`scoped`'s optimiser state: each label's state over its own leaves only (every other
    leaf is an `optax.MaskedNode`, which holds no array), so frozen leaves have no state."""

    inner: dict  # label -> that label's optimiser state


class Scoped(optax.GradientTransformationExtraArgs):
    """`scoped`'s transformation: optax's (init, update), with extra args passed on to every
    label's optimiser, plus `trained(params)`, the flat list of which leaves some optimiser
    updates (`core.steps.gradient_step` differentiates only those), and `phase(*labels)`: the
    same transformation restricted to some labels (see `scoped`)."""

    def __new__(cls, init, update, trained, phase):
        self = super().__new__(cls, init, update)
        self.trained = trained
        self.phase = phase
        return self


def scoped(
    rules: Sequence[tuple[str, str | None]], txs: Mapping[str, optax.GradientTransformation]
) -> Scoped:
    """An optimiser per labelled part of the parameters (in the spirit of
    `optax.multi_transform`): a leaf takes the label of the first `(regex, label)` rule whose
    regex `re.search`es its "/"-joined path ("encoder/layer_0/kernel", as `core.sharding`
    names it) and is updated by `txs[label]` alone, which sees (and, for adamw, decays) only
    its own leaves. Label None freezes a part: no optimiser state, and an update of -0.0
    (p + -0.0 is p bitwise, even for p = -0.0; `gradient_step` skips the frozen leaves
    altogether). A parameter no rule covers, or a rule that covers none, is a ConfigError when
    the state is initialised.

        scoped([(r"^encoder/", None), (r"^head/", "head")], {"head": optax.adamw(1e-3)})

    `tx.phase("d")` is the same transformation (same state) updating label "d" only: every other
    label's leaves get -0.0 and its optimiser state passes through untouched, as if that
    optimiser had not been called. Alternating phases is a GAN's step: two optimisers, each with
    its own moments and step count (`core.steps.alternating_step`). Updating both labels with a
    zero gradient for the idle one would not do: Adam's moments would decay and its momentum
    would still move the idle parameters.
    """
    rules = tuple(rules)
    used = {label for _, label in rules} - {None}
    if used != set(txs):
        raise ConfigError(
            f"core.optim.scoped: rule labels {sorted(used)} must be the optimisers' "
            f"{sorted(txs)} (label None freezes a part)"
        )
    txs = {label: optax.with_extra_args_support(tx) for label, tx in txs.items()}

    def labels(tree) -> list[str | None]:
        """The label of each leaf of `tree` (params, or updates shaped like them)."""
        out, matched = [], set()
        for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]:
            name = sharding.path_str(path)
            index = next((i for i, (regex, _) in enumerate(rules) if re.search(regex, name)), None)
            if index is None:
                raise ConfigError(f"core.optim.scoped: parameter {name!r} matches no rule")
            matched.add(index)
            out.append(rules[index][1])
        for i, (regex, label) in enumerate(rules):
            if i not in matched:
                raise ConfigError(
                    f"core.optim.scoped: rule {regex!r} (label {label!r}) matches no parameter"
                )
        return out

    def only(tree, tree_labels, label):
        """`tree` with every leaf not labelled `label` replaced by a MaskedNode."""
        leaves, treedef = jax.tree.flatten(tree)
        kept = [
            x if tag == label else optax.MaskedNode()
            for x, tag in zip(leaves, tree_labels, strict=True)
        ]
        return jax.tree.unflatten(treedef, kept)

    def init(params):
        tree_labels = labels(params)
        return ScopedState(
            {label: tx.init(only(params, tree_labels, label)) for label, tx in txs.items()}
        )

    def update(active, updates, state, params=None, **extra_args):
        tree_labels = labels(updates)
        leaves, treedef = jax.tree.flatten(updates)
        # Frozen or idle: -0.0, the one addend that leaves every float bitwise as it is.
        out = [
            jnp.full_like(u, -0.0) if tag not in active else None
            for u, tag in zip(leaves, tree_labels, strict=True)
        ]
        inner = dict(state.inner)
        for label, tx in txs.items():
            if label not in active:
                continue
            own_params = None if params is None else only(params, tree_labels, label)
            own_updates, inner[label] = tx.update(
                only(updates, tree_labels, label), state.inner[label], own_params, **extra_args
            )
            positions = [i for i, tag in enumerate(tree_labels) if tag == label]
            for i, u in zip(positions, jax.tree.leaves(own_updates), strict=True):
                out[i] = u
        return jax.tree.unflatten(treedef, out), ScopedState(inner)

    def restricted(active: frozenset) -> Scoped:
        def phase(*names):
            unknown = sorted(set(names) - set(txs))
            if unknown or not names:
                raise ConfigError(
                    f"core.optim.scoped: phase labels {list(names)} must be some of {sorted(txs)}"
                )
            return restricted(frozenset(names))

        def trained(params):
            return [tag in active for tag in labels(params)]

        return Scoped(init, functools.partial(update, active), trained, phase)

    return restricted(frozenset(txs))
