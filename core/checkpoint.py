"""Orbax checkpoints of the train state, the data iterator and the config, with integrity checks.

A run's workdir holds `checkpoints/<step>/{state,data_iter,config}`. Restarting a run with the
same workdir restores the newest *good* step into the current mesh's shardings (the saved layout
does not have to match) and puts the data iterator back where it was, so the resumed run sees
the same batches. Saves are asynchronous: `save` returns once the arrays are copied off the
device.

Integrity. Orbax commits a step only when it is complete: on a local disk it writes into a
temporary directory and renames it into place; on gs:// (no rename there) it writes in place and
commits by writing `commit_success.txt` last, and a step without that file is not a checkpoint
(orbax lists only committed steps and deletes uncommitted ones when the next run starts). What
orbax cannot see is damage after the fact (a truncated copy, a garbled file). So once a step's
files are final, the primary process writes `SHA256SUMS.json` into it, before orbax commits it
(rename or commit file), so the digests are committed with the step. On restore a step whose
files do not match is reported, moved aside to `damaged_checkpoints/` beside `checkpoints/`
(kept, not deleted: inside `checkpoints/` orbax would take it on gs:// for an uncommitted step
and delete it) and the next older step is tried. Old steps are deleted by orbax's own
`max_to_keep`, which it applies only after the newer step is committed, so a good checkpoint is
never deleted before its successor is complete. Every path is an `epath.Path` (`core.storage`):
a local folder or gs://.

The data iterator's state is saved as JSON (`get_state()`/`set_state()`, as grain's iterators
provide). It is written once, by the primary process: `core.data.synthetic` keeps the same state
(a batch index) on every process, so one copy resumes them all.
"""

import hashlib
import json
import time
import warnings
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from core import storage
from core.errors import ConfigError

MANIFEST = "SHA256SUMS.json"
DAMAGED = "damaged_checkpoints"  # a sibling of the checkpoint folder
# Orbax rewrites these when it commits a step (after our digests are taken); a broken one makes
# orbax's own restore fail, which the fallback handles the same way.
_WRITTEN_AT_COMMIT = {MANIFEST, "_CHECKPOINT_METADATA", "commit_success.txt"}


class DamagedCheckpointWarning(UserWarning):
    pass


def _is_checkpointable(iterator) -> bool:
    return hasattr(iterator, "get_state") and hasattr(iterator, "set_state")


def _files(directory: epath.Path):
    for path in directory.iterdir():  # epath has no rglob on cloud storage; walk by hand
        if path.is_dir():
            yield from _files(path)
        elif path.name not in _WRITTEN_AT_COMMIT:
            yield path


def _digests(step_dir: epath.Path) -> dict[str, str]:
    out = {}
    for path in sorted(_files(step_dir)):
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for chunk in iter(lambda f=f: f.read(1 << 20), b""):
                digest.update(chunk)
        out[str(path.relative_to(step_dir))] = digest.hexdigest()
    return out


def _barrier(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


class Checkpointer:
    def __init__(
        self,
        directory: epath.PathLike,
        *,
        max_to_keep: int = 2,
        async_save: bool = True,
        create=True,
    ):
        self.directory = storage.resolve(directory, what="checkpoint folder")
        if not create and not self.directory.is_dir():
            raise ConfigError(f"no checkpoint folder {self.directory}")
        self._async = async_save
        self._sealing: int | None = None
        options = ocp.CheckpointManagerOptions(
            # Orbax deletes the oldest steps after committing a new one; another run's folder
            # (init_from, create=False) is never written, so never pruned.
            max_to_keep=max_to_keep if create else None,
            enable_async_checkpointing=async_save,
            create=create,
            cleanup_tmp_directories=create,  # half-written saves of a killed run (ours only)
            async_options=(
                ocp.AsyncOptions(post_finalization_callback=self._seal_pending)
                if async_save
                else None
            ),
        )
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=("state", "data_iter", "config")
        )

    # -- saving ---------------------------------------------------------------------------

    def save(self, step: int, state: Any, data_iter=None, config: dict | None = None) -> None:
        items = {"state": ocp.args.StandardSave(state)}
        if data_iter is not None and _is_checkpointable(data_iter):
            items["data_iter"] = ocp.args.JsonSave(data_iter.get_state())
        if config is not None:
            items["config"] = ocp.args.JsonSave(config)
        self._manager.wait_until_finished()  # one pending step at a time for _seal_pending
        self._sealing = step
        self._manager.save(step, args=ocp.args.Composite(**items), force=True)
        if not self._async:
            self._seal(self.directory / str(step))

    def _seal_pending(self) -> None:
        """Orbax calls this once the pending step's files are final but before it commits the
        step (renames its temporary directory, or on gs:// writes its commit file): the digests
        are committed with the step."""
        step, self._sealing = self._sealing, None
        if step is None or jax.process_index() != 0:
            return
        # Locally `<step>.orbax-checkpoint-tmp-<time>`; on gs:// `<step>` itself (a `force` save
        # first removed any committed `<step>`).
        tmp = [
            p
            for p in self.directory.iterdir()
            if p.name == str(step) or p.name.startswith(f"{step}.orbax-")
        ]
        if len(tmp) != 1:
            warnings.warn(f"step {step}: no unique temporary directory to seal", stacklevel=1)
            return
        self._seal(tmp[0])

    def _seal(self, step_dir: epath.Path) -> None:
        if jax.process_index() != 0:
            return
        try:
            (step_dir / MANIFEST).write_text(json.dumps(_digests(step_dir), indent=0))
        except OSError as e:  # the step itself is complete; only its later check is lost
            warnings.warn(f"could not write {MANIFEST} in {step_dir}: {e}", stacklevel=1)

    # -- restoring ------------------------------------------------------------------------

    def _committed_steps(self) -> list[int]:
        """Orbax's committed steps (on gs:// an uncommitted `<step>` folder has the same name)."""
        self._manager.reload()
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        self._manager.reload()
        return self._manager.latest_step()

    def verify(self, step: int) -> str | None:
        """None if `step` matches its digests (or predates sealing), else what is wrong."""
        step_dir = self.directory / str(step)
        manifest = step_dir / MANIFEST
        if not manifest.exists():
            # Committed steps carry digests; only a failed digest write (warned at the time)
            # or a step made by other tools lacks them. Orbax's own checks then decide.
            return None
        try:
            expected = json.loads(manifest.read_text())
        except (OSError, ValueError) as e:
            return f"unreadable {MANIFEST}: {e}"
        actual = _digests(step_dir)
        missing = sorted(set(expected) - set(actual))
        if missing:
            return f"missing file {missing[0]}"
        changed = sorted(k for k in expected if expected[k] != actual[k])
        if changed:
            return f"{len(changed)} file(s) differ from their digest, e.g. {changed[0]}"
        return None

    def restore(self, abstract_state: Any, data_iter=None, step: int | None = None) -> Any:
        """Restore `step` into `abstract_state` (ShapeDtypeStructs carrying target shardings);
        the data iterator, if given and checkpointable, is restored in place."""
        step = self.latest_step() if step is None else step
        items = {"state": ocp.args.StandardRestore(abstract_state)}
        if data_iter is not None and _is_checkpointable(data_iter):
            items["data_iter"] = ocp.args.JsonRestore()
        restored = self._manager.restore(step, args=ocp.args.Composite(**items))
        if "data_iter" in items:
            data_iter.set_state(restored["data_iter"])
        return restored["state"]

    def restore_latest_good(self, abstract_state: Any, data_iter=None) -> Any | None:
        """Restore the newest step that verifies and loads; damaged ones are moved aside with a
        warning. None if there is no checkpoint; ConfigError if every one is damaged."""
        steps = sorted(self._committed_steps(), reverse=True)
        for step in steps:
            problem = self.verify(step)
            if problem is None:
                try:
                    return self.restore(abstract_state, data_iter, step)
                except Exception as e:  # orbax/tensorstore raise many types on bad data
                    problem = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            self._set_aside(step, problem)
        if steps:
            raise ConfigError(
                f"no usable checkpoint in {self.directory}: all {len(steps)} are damaged "
                f"(moved to {self.directory.parent / DAMAGED}); remove the workdir to start afresh"
            )
        return None

    def _set_aside(self, step: int, problem: str) -> None:
        target = self.directory.parent / DAMAGED / f"{step}-{time.strftime('%Y%m%d-%H%M%S')}"
        _barrier(f"checkpoint-verify-{step}")  # every process has judged the step first
        if jax.process_index() == 0:
            target.parent.mkdir(parents=True, exist_ok=True)
            (self.directory / str(step)).rename(target)
        _barrier(f"checkpoint-aside-{step}")
        self._manager.reload()
        warnings.warn(
            f"checkpoint step {step} in {self.directory} is damaged ({problem}); "
            f"moved it to {target} and trying an older one",
            DamagedCheckpointWarning,
            stacklevel=3,
        )

    def restore_params(self, abstract_params: Any) -> Any:
        """The `params` of the newest step that verifies, into `abstract_params`' shapes and
        shardings (the rest of that run's state, e.g. another optimiser's, is not read). For
        starting a run from another run's weights (`train.init_from`); nothing is moved or
        deleted in that run's folder."""
        for step in sorted(self._committed_steps(), reverse=True):
            if self.verify(step) is not None:
                continue
            restore_args = jax.tree.map(
                lambda x: ocp.ArrayRestoreArgs(sharding=x.sharding, global_shape=x.shape),
                abstract_params,
            )
            try:
                restored = ocp.PyTreeCheckpointer().restore(
                    self.directory / str(step) / "state",
                    args=ocp.args.PyTreeRestore(
                        item={"params": abstract_params},
                        restore_args={"params": restore_args},
                        partial_restore=True,
                    ),
                )
            except (ValueError, KeyError) as e:  # another model's parameter tree
                raise ConfigError(
                    f"the params in {self.directory / str(step)} do not fit this model: "
                    f"{str(e).splitlines()[0][:200]}"
                ) from None
            return restored["params"]
        raise ConfigError(f"no good checkpoint in {self.directory} to take parameters from")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def saved_config(self, step: int | None = None) -> dict | None:
        step = self.latest_step() if step is None else step
        if step is None:
            return None
        args = ocp.args.Composite(config=ocp.args.JsonRestore())
        return self._manager.restore(step, args=args)["config"]

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()  # waits for the pending save (and orbax's pruning after it)


def abstract_with_shardings(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
    )


def run_params(workdir: str, init, *, what: str) -> Any:
    """The params of the run in `workdir` (its newest checkpoint that verifies), on one device,
    in the structure `init(key)` returns: a part of that run's params is fine (e.g. a
    generator's out of a GAN's). For a method that reads another run's weights, e.g. a frozen
    stage; `what` ("tte.reasoner") names the option in the one-line error when `workdir` holds
    no run."""
    path = epath.Path(workdir).expanduser() / "checkpoints"
    if not workdir or not path.is_dir():
        raise ConfigError(f"{what}={workdir!r}: no run's checkpoints/ there")
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
        jax.eval_shape(init, jax.random.key(0)),
    )
    with Checkpointer(path, create=False) as ckpt:
        return ckpt.restore_params(abstract)
