"""Orbax checkpoints of the train state, the data iterator and the config.

A run's workdir holds `checkpoints/<step>/{state,data_iter,config}`. Restarting a run with the
same workdir restores the latest step into the current mesh's shardings (the saved layout does not
have to match) and puts the data iterator back where it was, so the resumed run sees the same
batches. Saves are asynchronous: `save` returns once the arrays are copied off the device.

The data iterator's state is saved as JSON (`get_state()`/`set_state()`, as grain's iterators
provide). It is written once, by the primary process: `core.data.synthetic` keeps the same state
(a batch index) on every process, so one copy resumes them all.
"""

import os
from typing import Any

import jax
import orbax.checkpoint as ocp


def _is_checkpointable(iterator) -> bool:
    return hasattr(iterator, "get_state") and hasattr(iterator, "set_state")


class Checkpointer:
    def __init__(self, directory: str, *, max_to_keep: int = 2, async_save: bool = True):
        self.directory = os.path.abspath(directory)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=True
        )
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=("state", "data_iter", "config")
        )

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def save(self, step: int, state: Any, data_iter=None, config: dict | None = None) -> None:
        items = {"state": ocp.args.StandardSave(state)}
        if data_iter is not None and _is_checkpointable(data_iter):
            items["data_iter"] = ocp.args.JsonSave(data_iter.get_state())
        if config is not None:
            items["config"] = ocp.args.JsonSave(config)
        self._manager.save(step, args=ocp.args.Composite(**items), force=True)

    def restore(self, abstract_state: Any, data_iter=None, step: int | None = None) -> Any:
        """Restore into `abstract_state` (ShapeDtypeStructs carrying target shardings); the
        data iterator, if given and checkpointable, is restored in place."""
        step = self.latest_step() if step is None else step
        items = {"state": ocp.args.StandardRestore(abstract_state)}
        if data_iter is not None and _is_checkpointable(data_iter):
            items["data_iter"] = ocp.args.JsonRestore()
        restored = self._manager.restore(step, args=ocp.args.Composite(**items))
        if "data_iter" in items:
            data_iter.set_state(restored["data_iter"])
        return restored["state"]

    def saved_config(self, step: int | None = None) -> dict | None:
        step = self.latest_step() if step is None else step
        if step is None:
            return None
        restored = self._manager.restore(
            step, args=ocp.args.Composite(config=ocp.args.JsonRestore())
        )
        return restored["config"]

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def abstract_with_shardings(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
    )
