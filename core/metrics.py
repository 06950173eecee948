"""Metrics read one step late, written as JSONL, summarised on the console, guarded against NaN.

`push(step, metrics)` takes the device metrics of the step just dispatched and only then reads
the previous step's (whose computation has finished or nearly so), so logging never stalls the
device pipeline. The JSONL keeps every step's row; the console line shows each metric's mean
over the steps since the last line (one step's loss is too noisy to read a trend from). Every
step's loss is checked: a non-finite value stops the run with an error naming the step. Any
other metric that is NaN, of a step or an evaluation, is left out of the row: NaN is how a step
says "not measured at this step" (`core.steps.switch` fills another phase's keys with it) and
how a metric says "undefined here" (an AUROC over one class).

With `tensorboard_dir` (the loop's `train.tensorboard`), every row written to the JSONL, train
and eval alike, is also written to a TensorBoard event file (tensorboardX: pure Python, no
TensorFlow) as one scalar per metric, tagged by its JSONL key ("loss", "eval/accuracy") at the
row's step. Event files are written to a local folder only: tensorboardX reaches gs:// through
its own google-cloud-storage client (not the workdir's etils.epath), re-uploading the whole file
at every flush, so a gs:// `tensorboard_dir` is refused with a ConfigError when the logger is
made, not at the first write. An event file cannot be rewound like the JSONL: a resumed run
passes `tensorboard_resume_step`, and TensorBoard hides the earlier run's events after it.
"""

import json
import math
import os
import sys
import time
from typing import Any, TextIO

import jax
import numpy as np
from etils import epath

from core import storage
from core.errors import ConfigError, method_name

MAX_SHOWN = 24  # evaluation metrics printed on one console line (the rest: JSONL only)


class NonFiniteLossError(FloatingPointError):
    pass


def format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def to_host(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(np.asarray(v)) for k, v in jax.device_get(metrics).items()}


def tensorboard_dir(config, workdir: epath.PathLike) -> epath.Path | None:
    """Where `config.train.tensorboard` puts the event files (`<workdir>/tensorboard`; None when
    off), or a one-line ConfigError for a gs:// workdir: called before anything is written."""
    if not config.train.get("tensorboard"):
        return None
    if not storage.is_local(workdir):
        raise ConfigError(
            f"{method_name(config)}: train.tensorboard=True needs a local workdir, not "
            f"{os.fspath(workdir)!r} (event files are written to a local folder only; "
            "metrics.jsonl has the same rows)"
        )
    return storage.resolve(workdir) / "tensorboard"


class MetricsLogger:
    """One-step-late reader of train metrics; only the writing process writes anything."""

    def __init__(
        self,
        workdir: epath.PathLike | None,
        *,
        total_steps: int,
        global_batch: int,
        log_every: int,
        write: bool = True,
        stream: TextIO | None = None,
        prefix: str = "",
        tensorboard_dir: epath.PathLike | None = None,
        tensorboard_resume_step: int = 0,
    ):
        self.total_steps = total_steps
        self.global_batch = global_batch
        self.log_every = max(log_every, 1)
        self.write = write
        self.stream = stream or sys.stdout
        self.prefix = prefix
        self.history: list[dict[str, float]] = []
        self._pending: tuple[int, dict] | None = None
        self._log = None
        if workdir is not None and write:
            self._log = storage.LineLog(storage.resolve(workdir) / "metrics.jsonl")
        self._events = None
        if tensorboard_dir is not None:
            # Checked on every process: all of them fail alike, before the first step.
            if not storage.is_local(tensorboard_dir):
                raise ConfigError(
                    f"train.tensorboard: event files are written to a local folder only, not "
                    f"{str(tensorboard_dir)!r} (use a local workdir, or train.tensorboard=False "
                    "and read metrics.jsonl)"
                )
            if write:
                self._events = _event_writer(tensorboard_dir, tensorboard_resume_step)
        self._window_start = time.perf_counter()
        self._window_steps = 0
        self._window_tokens = 0.0
        self._window_sums: dict[str, float] = {}
        self._window_counts: dict[str, int] = {}
        self._first_logged_step: int | None = None

    def push(self, step: int, metrics: dict[str, Any]) -> None:
        """Queue `metrics` of `step` (device arrays) and process the previously queued step."""
        previous, self._pending = self._pending, (step, metrics)
        if previous is not None:
            self._process(*previous)

    def flush(self) -> None:
        """Process the queued step and store every row so far (before a checkpoint: the rows a
        resumed run keeps must be stored when its checkpoint is)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._process(*pending)
        self._sync()

    def log_eval(self, step: int, metrics: dict[str, Any]) -> None:
        values = {k: v for k, v in to_host(metrics).items() if not math.isnan(v)}
        row = {"step": step, **{f"eval/{k}": v for k, v in values.items()}}
        self.history.append(row)
        if self.write:
            self._write(row)
            items = [(k, v) for k, v in row.items() if k != "step"]
            shown = " | ".join(f"{k} {v:.4g}" for k, v in items[:MAX_SHOWN])
            if len(items) > MAX_SHOWN:  # e.g. per-step curves: the JSONL row has every value
                shown += f" | ... {len(items) - MAX_SHOWN} more in metrics.jsonl"
            print(f"{self.prefix}step {step} | {shown}", file=self.stream, flush=True)

    def close(self) -> None:
        self.flush()
        if self._log:
            self._log.close()
            self._log = None
        if self._events is not None:
            self._events.close()
            self._events = None

    def _process(self, step: int, metrics: dict[str, Any]) -> None:
        values = to_host(metrics)
        loss = values.get("loss")
        if loss is not None and not math.isfinite(loss):
            raise NonFiniteLossError(f"non-finite loss ({loss}) at step {step}; stopping the run")
        values = {k: v for k, v in values.items() if not math.isnan(v)}
        self._window_steps += 1
        self._window_tokens += values.get("num_tokens", 0.0)
        for key, value in values.items():
            self._window_sums[key] = self._window_sums.get(key, 0.0) + value
            self._window_counts[key] = self._window_counts.get(key, 0) + 1
        row = {"step": step, **values}
        self.history.append(row)
        if self.write:
            self._write(row)
        if step % self.log_every == 0 or step == self.total_steps:
            # A metric some steps leave out (NaN) is averaged over the steps that have it.
            means = {k: self._window_sums[k] / self._window_counts[k] for k in self._window_sums}
            self._console(step, means)

    def _write(self, row: dict) -> None:
        if self._log:
            self._log.write(json.dumps(row) + "\n")
        if self._events is not None:
            for key, value in row.items():
                if key != "step":
                    self._events.add_scalar(key, value, global_step=row["step"])

    def _sync(self) -> None:
        if self._log:
            self._log.sync()
        if self._events is not None:
            self._events.flush()

    def _console(self, step: int, values: dict[str, float]) -> None:
        now = time.perf_counter()
        elapsed = now - self._window_start
        # The first window includes compilation; it is reported but not used for the ETA.
        steps_per_s = self._window_steps / elapsed if elapsed > 0 else float("nan")
        parts = [f"{self.prefix}step {step}/{self.total_steps}"]
        shown = sorted(k for k in values if k not in ("loss", "num_tokens"))
        parts += [f"{k} {values[k]:.4g}" for k in ["loss", *shown] if k in values]
        rate = f"{steps_per_s:.2f} steps/s {steps_per_s * self.global_batch:.1f} ex/s"
        if self._window_tokens:
            rate += f" {self._window_tokens / elapsed:.4g} tok/s"
        parts.append(rate)
        if self._first_logged_step is not None and steps_per_s > 0:
            parts.append(f"eta {format_duration((self.total_steps - step) / steps_per_s)}")
        self._first_logged_step = self._first_logged_step or step
        if self.write:
            print(" | ".join(parts), file=self.stream, flush=True)
            self._sync()  # an object store's copy (and TensorBoard) follows the console
        self._window_start, self._window_steps, self._window_tokens = now, 0, 0.0
        self._window_sums, self._window_counts = {}, {}


def _event_writer(directory: epath.PathLike, resume_step: int):
    # Imported here: a run without TensorBoard does not load it.
    import tensorboardX

    # purge_step: TensorBoard hides the events of steps >= it written before (by the run this
    # one resumes after its last checkpoint), as rewind_metrics drops those JSONL rows.
    purge_step = resume_step + 1 if resume_step else None
    return tensorboardX.SummaryWriter(os.fspath(directory), purge_step=purge_step)
