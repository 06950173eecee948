"""Train any method from its config: the one entry point for CPU, GPU nodes and TPU VMs.

    python -m launch.train --config=configs/lm.py:task=copy --workdir=/tmp/lm-copy
    python -m launch.train --config=configs/lm.py:mesh=tpu,size=base --config.train.steps=5000 \
        --workdir=gs://bucket/runs/lm --multihost

Restarting with the same --workdir resumes from its newest good checkpoint. SIGTERM saves a
checkpoint at the current step and exits 0. --multihost initialises `jax.distributed`: with no
other flag it auto-detects the cluster (TPU VM, Slurm, ...); --coordinator_address,
--num_processes and --process_id set it up by hand (e.g. several processes on one machine).
"""

import sys

from absl import app, flags, logging

from core.errors import ConfigError
from core.metrics import NonFiniteLossError

_CONFIG = None  # the config flag; defined in `define_flags` so importing this module is free
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints and metrics.jsonl go.")
_MULTIHOST = flags.DEFINE_bool("multihost", False, "Initialise jax.distributed first.")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "host:port of process 0 (default: auto-detect)."
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Process count (default: auto).")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index (default: auto).")
_ALLOW_CONFIG_CHANGE = flags.DEFINE_bool(
    "allow_config_change", False, "Continue a workdir whose saved config differs from this one."
)


def initialize_distributed(coordinator=None, num_processes=None, process_id=None) -> None:
    """`jax.distributed.initialize`, with gloo collectives so CPU processes can all-reduce."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=coordinator, num_processes=num_processes, process_id=process_id
    )


def main(argv):
    del argv
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    if _MULTIHOST.value:
        initialize_distributed(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
    import jax

    import methods
    from core import train

    config = _CONFIG.value
    try:
        result = train.run(
            config,
            methods.make(config),
            _WORKDIR.value,
            allow_config_change=_ALLOW_CONFIG_CHANGE.value,
        )
    except (ConfigError, NonFiniteLossError) as e:
        sys.exit(f"error: {e}")
    if jax.process_index() == 0 and not result.preempted:
        last = result.history[-1] if result.history else {}
        print(f"done: step {int(result.state.step)} {last}", flush=True)


def define_flags() -> None:
    global _CONFIG
    from ml_collections import config_flags

    _CONFIG = config_flags.DEFINE_config_file("config", None, "configs/<slug>.py[:arg]")
    flags.mark_flags_as_required(["config", "workdir"])


if __name__ == "__main__":
    from launch.config_cli import parse_flags

    define_flags()
    app.run(main, flags_parser=parse_flags)
