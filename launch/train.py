"""Train any method from its config: the one entry point for CPU, GPU nodes and TPU VMs.

    python -m launch.train --config=configs/lm.py:task=copy --workdir=/tmp/lm-copy
    python -m launch.train --config=configs/lm.py:mesh=tpu,size=base --config.train.steps=5000 \
        --workdir=/mnt/runs/lm --multihost

Restarting with the same --workdir resumes from its latest checkpoint.
"""

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from core.errors import ConfigError
from core.metrics import NonFiniteLossError

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/<slug>.py[:arg]).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints and metrics.jsonl go.")
_MULTIHOST = flags.DEFINE_bool(
    "multihost", False, "Call jax.distributed.initialize() first (TPU VMs, Slurm, etc.)."
)
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    import jax

    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO

    if _MULTIHOST.value:
        jax.distributed.initialize()
    import methods
    from core import train

    config = _CONFIG.value
    try:
        result = train.run(config, methods.make(config), _WORKDIR.value)
    except (ConfigError, NonFiniteLossError) as e:
        sys.exit(f"error: {e}")
    if jax.process_index() == 0:
        last = {k: v for k, v in result.history[-1].items()} if result.history else {}
        print(f"done: step {int(result.state.step)} {last}")


if __name__ == "__main__":
    app.run(main)
