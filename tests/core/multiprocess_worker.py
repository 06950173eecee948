"""One process of a multi-process CPU run, started by tests/core/test_multiprocess.py.

    python -m tests.core.multiprocess_worker PROCESS_ID NUM_PROCESSES PORT WORKDIR OUT_NPZ

Each process has JAX_NUM_CPU_DEVICES devices (set by the parent), joins the others over gloo on
127.0.0.1, trains the test LM through `core.train.run`, and saves its local copy of the
(replicated) parameters to OUT_NPZ so the parent can compare processes.
"""

import sys

import numpy as np


def main(process_id: int, num_processes: int, port: int, workdir: str, out: str) -> None:
    from launch.train import initialize_distributed

    initialize_distributed(f"127.0.0.1:{port}", num_processes, process_id)
    import jax

    import methods
    from core import train
    from core.sharding import path_str
    from tests.core.test_train import lm_config

    config = lm_config()
    config.mesh.shape = (-1, 1, 1)
    result = train.run(config, methods.make(config), workdir)
    leaves = jax.tree_util.tree_flatten_with_path(result.state.params)[0]
    np.savez(out, **{path_str(p): np.asarray(x.addressable_data(0)) for p, x in leaves})


if __name__ == "__main__":
    pid, n, port, workdir, out = sys.argv[1:]
    main(int(pid), int(n), int(port), workdir, out)
