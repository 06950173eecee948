"""Preemption: SIGTERM asks the run to checkpoint at the current step and exit cleanly.

One process: our own SIGTERM handler sets a flag that the loop reads between steps. Several
processes: JAX's distributed runtime owns the notice (its preemption service catches SIGTERM
and agrees with every process on one step to stop at), read through
`multihost_utils.reached_preemption_sync_point`, so all processes save the same step.

A preempted run returns early (`RunResult.preempted`) and marks the process (`mark`). Inside a
cached computation (`core.cache.cached`, which enters `raising()`) it raises `Preempted` instead,
once its checkpoint is saved: the caller's code after the run (reading its last evaluation,
evaluating more lengths) never sees a cut-short run, and nothing is stored as finished. A rerun
resumes that run from its checkpoint.
"""

import contextlib
import signal
import threading

import jax
from jax.experimental import multihost_utils

_PREEMPTED = threading.Event()  # a run in this process stopped early on SIGTERM


class Preempted(Exception):
    """A run was stopped by preemption after saving its checkpoint: rerun to continue."""


def mark() -> None:
    """Record that a run in this process was preempted (`core.train.run` calls it)."""
    _PREEMPTED.set()


def happened() -> bool:
    """Whether a run in this process was preempted."""
    return _PREEMPTED.is_set()


_raising = threading.local()


@contextlib.contextmanager
def raising():
    """Within this block a preempted run raises `Preempted` rather than returning early."""
    depth = getattr(_raising, "depth", 0)
    _raising.depth = depth + 1
    try:
        yield
    finally:
        _raising.depth = depth


def raise_if_raising() -> None:
    """Called by a run that was preempted, after its checkpoint is saved."""
    if getattr(_raising, "depth", 0):
        raise Preempted("preempted: checkpoint saved; rerun to continue")


class PreemptionWatcher:
    def __init__(self):
        self._requested = threading.Event()
        self._previous = None
        self._multi = jax.process_count() > 1
        if not self._multi and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame):
        del signum, frame
        self._requested.set()

    def should_stop(self, step: int) -> bool:
        if self._multi:
            return multihost_utils.reached_preemption_sync_point(step)
        return self._requested.is_set()

    def close(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None
