"""optax from config: `make(config.optim)` builds the optimiser and its schedule."""

import optax

from core.errors import ConfigError

_OPTIMIZERS = {
    "adamw": lambda c, lr: optax.adamw(
        lr, b1=c.b1, b2=c.b2, eps=c.eps, weight_decay=c.weight_decay
    ),
    "adam": lambda c, lr: optax.adam(lr, b1=c.b1, b2=c.b2, eps=c.eps),
    "sgd": lambda c, lr: optax.sgd(lr, momentum=c.momentum or None),
    "lion": lambda c, lr: optax.lion(lr, b1=c.b1, b2=c.b2, weight_decay=c.weight_decay),
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


def make(config, total_steps: int) -> optax.GradientTransformation:
    """The optimiser named by `config.name`, with optional global-norm clipping in front."""
    if config.name not in _OPTIMIZERS:
        raise ConfigError(
            f"optim.name={config.name!r} is unknown; expected one of: {', '.join(_OPTIMIZERS)}"
        )
    tx = _OPTIMIZERS[config.name](config, schedule(config, total_steps))
    if config.grad_clip:
        tx = optax.chain(optax.clip_by_global_norm(config.grad_clip), tx)
    return tx
