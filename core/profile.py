"""A `jax.profiler` trace of chosen training steps: `--config.train.profile=<first>:<last>`.

Steps `first..last` (inclusive, counted like the loop's steps: 1 is the first, which includes
compilation) are traced into `<workdir>/profile/`; open it with TensorBoard's profile plugin
(`tensorboard --logdir <workdir>/profile`, with tensorboard-plugin-profile installed) or drop
`plugins/profile/<run>/<host>.trace.json.gz` onto Perfetto (ui.perfetto.dev). Each traced step
is annotated as a step (`jax.profiler.StepTraceAnnotation("train", step_num=step)`), which the
profile plugin's overview uses to split step time.

Dispatch is asynchronous: when the loop gets the last traced step's outputs back, its device
work may not have run yet. `after(last, outputs)` blocks on those outputs before stopping the
trace, so the trace holds every traced step's device work, not only its dispatch.

Multi-host: a trace is per host (each records its own devices). Only the process given
`write=True` traces (the loop passes process 0, as it does for metrics): one host's devices run
the same SPMD program as every other's, and N hosts writing N traces of it into one bucket costs
N times the storage for little more insight. To look at a straggler, run the profiled range with
that host as process 0 or trace it by hand (`jax.profiler.trace`).

A run that resumes past `first` starts tracing at its first step inside the range; one that
stops early (preemption, an error) has the trace stopped and written by `close()`. A trace that
cannot be written (an unreachable bucket, a full disk) is reported on stderr and the run goes
on: an instrument must not end the run it observes. A `gs://` workdir is passed to jax.profiler
as it is: jaxlib writes it with its own GCS client (not tested here against a real bucket).
"""

import os
import sys

import jax
from etils import epath

from core import storage
from core.errors import ConfigError

FIELD = "train.profile"


def parse(spec: str, total_steps: int, *, method: str = "this method") -> tuple[int, int] | None:
    """`(first, last)` of a spec "first:last", None for "" (profiling off); a one-line
    ConfigError naming the method and the field for anything else."""
    spec = (spec or "").strip()
    if not spec:
        return None
    first_text, sep, last_text = spec.partition(":")
    try:
        if not sep:
            raise ValueError
        first, last = int(first_text), int(last_text)
    except ValueError:
        raise ConfigError(
            f"{method}: {FIELD}={spec!r} is not first:last (the steps to trace, e.g. 10:12)"
        ) from None
    if first < 1:
        raise ConfigError(f"{method}: {FIELD}={spec} starts before step 1 (steps count from 1)")
    if first > last:
        raise ConfigError(f"{method}: {FIELD}={spec} has first step {first} after last {last}")
    if last > total_steps:
        raise ConfigError(f"{method}: {FIELD}={spec} ends past train.steps={total_steps}")
    return first, last


class StepProfiler:
    """Starts a trace before step `first`, stops it after step `last`'s outputs are ready.

    The loop calls `before(step)` before dispatching a step, `after(step, outputs)` with what
    the step returned, and `close()` in its `finally`. With profiling off every call is a no-op.
    """

    def __init__(
        self,
        spec: str,
        total_steps: int,
        workdir: epath.PathLike,
        *,
        write: bool = True,
        method: str = "this method",
    ):
        self.range = parse(spec, total_steps, method=method)  # checked on every process
        self.directory = storage.resolve(workdir) / "profile"
        self.write = write
        self._tracing = False
        self._done = False
        self._annotation = None

    def before(self, step: int) -> None:
        if self.range is None or not self.write or self._done:
            return
        first, last = self.range
        if not self._tracing and first <= step <= last:
            # jax.profiler writes through its own file layer (local paths and gs://).
            jax.profiler.start_trace(os.fspath(self.directory))
            self._tracing = True
        if self._tracing:
            self._annotation = jax.profiler.StepTraceAnnotation("train", step_num=step)
            self._annotation.__enter__()

    def after(self, step: int, outputs) -> None:
        if not self._tracing:
            return
        self._end_annotation()
        if step >= self.range[1]:
            jax.block_until_ready(outputs)  # the last step's device work, inside the trace
            self._stop()

    def close(self) -> None:
        """Stop a trace still open (a run that ended or failed inside the range)."""
        if self._tracing:
            self._end_annotation()
            self._stop()

    def _end_annotation(self) -> None:
        if self._annotation is not None:
            self._annotation.__exit__(None, None, None)
            self._annotation = None

    def _stop(self) -> None:
        self._tracing, self._done = False, True
        first, last = self.range
        try:
            jax.profiler.stop_trace()
        except Exception as e:  # jaxlib raises its own runtime error types
            # An instrument must not end the run it observes: the trace is lost, training goes
            # on. (jax then still counts a trace as running: no other starts in this process.)
            message = str(e).splitlines()[0] if str(e) else type(e).__name__
            print(
                f"profile of steps {first}:{last} not written to {self.directory}: {message}",
                file=sys.stderr,
                flush=True,
            )
            return
        print(f"profile of steps {first}:{last} in {self.directory}", flush=True)
