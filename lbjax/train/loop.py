"""`train_and_evaluate`: the training loop from a config to a trained, evaluated, checkpointed run.

A `Run` (`lbjax.train.run`) holds the run, built whole from the config (resumed from the workdir's
latest checkpoint when it holds one); the hooks of `lbjax.train.hooks` do what happens around its
steps (metrics, evaluation and saving, checkpointing, diagnostics, preemption). One clock: the data
stream's position in epochs decides the batch size, the learning rate, evaluation and the end.
"""

import dataclasses
import json
import pathlib

from absl import logging
import jax
import ml_collections
import numpy as np

from lbjax.train import batch_policy
from lbjax.train import config as config_lib
from lbjax.train import distributed
from lbjax.train import hooks
from lbjax.train import summary
from lbjax.train.mesh import data_parallel_size
from lbjax.train.metrics import MetricsWriter, ProgressLine
from lbjax.train.run import NonFiniteError, Run, global_batch  # pylint: disable=unused-import
from lbjax.train.state import TrainState


@dataclasses.dataclass
class TrainResult:
  """What a finished (or preempted) run returns."""
  state: TrainState
  eval_metrics: dict[str, float]
  step: int
  epoch: float
  examples_seen: int
  compiled_batch_sizes: tuple[int, ...]  # one entry per compiled train step, in order
  preempted: bool


def _steps_per_epoch(stream, batch_size: int) -> int:
  if hasattr(stream, "windows_per_epoch"):
    return stream.windows_per_epoch(batch_size)
  return stream.num_examples // batch_size


def _describe_start(run: Run, workdir: pathlib.Path, origin: str) -> None:
  """Prints the resolved run (and where it resumed from; process 0, with `config.progress`) and
  writes `<workdir>/config.json`."""
  resolved = summary.resolved_run(run.config)
  sizes = config_lib.batch_sizes(run.config)
  resolved["devices"] = (f"{jax.device_count()} {jax.devices()[0].platform} on {jax.process_count()} "
                         f"process(es); mesh {dict(run.mesh.shape)}")
  resolved["steps_per_epoch"] = ", ".join(f"{_steps_per_epoch(run.stream, b)} at batch {b}" for b in sizes)
  resolved["parameters"] = f"{sum(int(np.prod(x.shape)) for x in jax.tree.leaves(run.state.params)):,}"
  if run.process_index != 0:
    return
  workdir.mkdir(parents=True, exist_ok=True)
  record = {"origin": origin, "resolved": resolved, "config": json.loads(run.config.to_json())}
  (workdir / "config.json").write_text(json.dumps(record, indent=2) + "\n")
  if run.config.progress:
    print("\n".join(summary.format_run(resolved, origin)), flush=True)
    if run.resumed_from is not None:
      print(f"Resumed from {run.checkpointer.directory} at step {run.resumed_from} "
            f"(epoch {run.epoch:.4f}).", flush=True)
    note = _device_change(run)
    if note:
      print(note, flush=True)


def _device_change(run: Run) -> str:
  """A note when the run resumed on another data-parallel size than its checkpoint was saved on."""
  now = data_parallel_size(run.mesh)
  if run.saved_data_parallel_size in (None, now):
    return ""
  return (f"Note: the checkpoint was saved on {run.saved_data_parallel_size} data-parallel devices and resumes on "
          f"{now}; the state was resharded (results agree to float rounding, not bit for bit; dropout masks "
          "are the same, drawn per row of the global batch whatever the devices and micro-batches).")


def _start_metrics(run: Run, writer: MetricsWriter) -> dict[str, float]:
  """On a resume: drops the records that `metrics.jsonl` holds past the checkpoint's step (written
  after it, by the run that stopped) and marks the resume with a `resume` record. Returns the last
  evaluation at the checkpoint's step, if the file has one (a finished run is not evaluated twice)."""
  if run.resumed_from is None:
    return {}
  dropped = writer.truncate_after(run.resumed_from)
  values = {"epoch": run.epoch, "dropped_records": dropped, "data_parallel_size": data_parallel_size(run.mesh)}
  if run.saved_data_parallel_size is not None:
    values["saved_data_parallel_size"] = run.saved_data_parallel_size
  if run.skipped_checkpoints:
    values["skipped_checkpoints"] = [step for step, _ in run.skipped_checkpoints]
  writer.write("resume", run.resumed_from, values)
  note = _device_change(run)
  if note:
    logging.warning("%s", note)
  return writer.last_record("eval", run.resumed_from)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | pathlib.Path, *,
                       origin: str = "") -> TrainResult:
  """Trains and evaluates the run `config` describes, checkpointing into `workdir`.

  If `workdir` already holds a checkpoint of the same recipe, the run resumes from it exactly (same
  parameters, optimizer state, RNG, data position); a checkpoint of a different recipe is an error.
  SIGTERM and SIGINT save a checkpoint at the next step boundary and return, once it is on disk, with
  `preempted=True`. A second run on the same workdir is refused while this one runs (`WorkdirLock`).

  Raises:
    ValueError: invalid config (before any compute) or an incompatible checkpoint in `workdir`.
    FileNotFoundError: missing data (the message says where to get it).
    NonFiniteError: a non-finite loss or update; nothing after the last good step is written.
    WorkdirInUseError: another run holds the workdir.
    CheckpointSaveError: a checkpoint could not be written (e.g. a full disk); earlier ones are kept.
  """
  workdir = pathlib.Path(workdir)
  run = Run(config, workdir)
  distributed.watch(lambda: run.step_count)  # multi-host: the step a lost-host message names
  try:
    _describe_start(run, workdir, origin)
    writer = MetricsWriter(workdir, enabled=run.process_index == 0, tensorboard=config.tensorboard)
  except BaseException:
    run.close()
    raise
  evaluated_before = _start_metrics(run, writer)
  progress = ProgressLine(config.num_epochs, config.num_steps, enabled=run.process_index == 0 and config.progress)
  progress.reset_window(run.examples_seen, run.epoch, run.step_count)
  start_examples = run.examples_seen
  metrics = hooks.WriteMetrics(writer, progress, config.log_every)
  evaluation = hooks.EvaluateAndSave(writer, progress, metrics.flush, config.eval_every_epochs, run.epoch)
  preemption = hooks.SaveOnPreemption(metrics.flush)
  decisions = batch_policy.RecordBatchDecisions(writer)
  around_steps = [metrics, hooks.RecordCompiles(writer, progress),
                  hooks.Lipschitz(writer, config.diagnostics.lipschitz_every), evaluation,
                  hooks.Checkpoint(config.checkpoint_every_steps), decisions, preemption]
  try:
    hooks.write_compression_bits(run, writer)
    while not run.finished() and not preemption.stopped:
      step_metrics = run.step(run.next_batch())
      for hook in around_steps:
        hook.after_step(run, step_metrics)
    metrics.flush(run)
    decisions.flush(run)
    if not preemption.stopped:
      if run.step_count == run.resumed_from and evaluated_before:  # resumed a finished run: nothing new
        evaluation.last = evaluation.best = evaluated_before
      else:
        evaluation.evaluate(run, final=True)
      run.save()
  finally:
    try:
      run.close()  # waits for the checkpoint in flight while the signal handlers are still installed
    finally:
      preemption.restore()
      writer.close()
  progress.summary(step=run.step_count, epoch=run.epoch, examples_seen=run.examples_seen - start_examples,
                   final=evaluation.last, best=evaluation.best, preempted=preemption.stopped)
  return TrainResult(run.state, evaluation.last, run.step_count, run.epoch, run.examples_seen,
                     tuple(batch_size for batch_size, _ in run.compiled), preemption.stopped)
