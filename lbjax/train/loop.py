"""`train_and_evaluate`: the training loop from a config to a trained, evaluated, checkpointed run.

A `Run` (`lbjax.train.run`) holds the run, built whole from the config (resumed from the workdir's
latest checkpoint when it holds one); the hooks of `lbjax.train.hooks` do what happens around its
steps (metrics, evaluation and saving, checkpointing, diagnostics, preemption). One clock: the data
stream's position in epochs decides the batch size, the learning rate, evaluation and the end.
"""

import contextlib
import dataclasses
import json
import pathlib

from absl import logging
import jax
from jax.experimental import multihost_utils
import ml_collections
import numpy as np

from lbjax.train import batch_policy
from lbjax.train import distributed
from lbjax.train import hooks
from lbjax.train import profiling
from lbjax.train import protocols
from lbjax.train import step_calls
from lbjax.train import summary
from lbjax.train.metrics import MetricsWriter, ProgressLine
from lbjax.train.resolved import ResolvedRun
from lbjax.train.run import Run  # pylint: disable=unused-import
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


def _describe_start(run: Run, workdir: pathlib.Path, origin: str) -> None:
  """Prints the resolved run (and where it resumed from; process 0, with `config.progress`) and
  writes `<workdir>/config.json`."""
  resolved = summary.resolved_run(run.resolved)
  sizes = dict.fromkeys(run.resolved.batch.sizes)
  resolved["devices"] = (f"{jax.device_count()} {jax.devices()[0].platform} on {jax.process_count()} "
                         f"process(es); mesh {dict(run.mesh.shape)}")
  resolved["steps_per_epoch"] = ", ".join(f"{protocols.steps_per_epoch(run.stream, b)} at batch {b}" for b in sizes)
  resolved["parameters"] = f"{sum(int(np.prod(x.shape)) for x in jax.tree.leaves(run.state.params)):,}"
  if run.process_index != 0:
    return
  workdir.mkdir(parents=True, exist_ok=True)
  record = {"origin": origin, "resolved": resolved, "config": json.loads(run.resolved.source_config.to_json())}
  (workdir / "config.json").write_text(json.dumps(record, indent=2) + "\n")
  if run.resolved.watch.progress:
    print("\n".join(summary.format_run(resolved, origin)), flush=True)
    if run.resumed_from is not None:
      print(f"Resumed from {run.checkpoints.directory} at step {run.resumed_from} "
            f"(epoch {run.epoch:.4f}).", flush=True)
    note = _device_change(run)
    if note:
      print(note, flush=True)


def _device_change(run: Run) -> str:
  """A note when the run resumed on another data-parallel size than its checkpoint was saved on."""
  now, saved = run.data_parallel_size, run.start.saved_data_parallel_size
  if saved in (None, now):
    return ""
  return (f"Note: the checkpoint was saved on {saved} data-parallel devices and resumes on "
          f"{now}; the state was resharded (results agree to float rounding, not bit for bit; dropout masks "
          "are the same, drawn per row of the global batch whatever the devices and micro-batches).")


def _start_metrics(run: Run, writer: MetricsWriter) -> list[tuple[int, dict[str, float]]]:
  """On a resume: drops the records that `metrics.jsonl` holds past the checkpoint's step (written
  after it, by the run that stopped) and marks the resume with a `resume` record. Returns the
  evaluations recorded up to the checkpoint's step, as `(step, metrics)` (the best so far counts
  them, and a finished run is not evaluated twice). On a start from step 0, the records of an earlier
  run that left no checkpoint are set aside (`MetricsWriter.set_aside`), not mixed with this run's."""
  if run.resumed_from is None:
    aside = writer.set_aside()
    if aside is not None:
      logging.warning("%s held the records of an earlier run that left no checkpoint; they are kept in %s and "
                      "this run, starting from step 0, writes a new one.", writer.path, aside.name)
    return []
  dropped = writer.truncate_after(run.resumed_from)
  values = {"epoch": run.epoch, "dropped_records": dropped, "data_parallel_size": run.data_parallel_size}
  if run.start.saved_data_parallel_size is not None:
    values["saved_data_parallel_size"] = run.start.saved_data_parallel_size
  if run.skipped_checkpoints:
    values["skipped_checkpoints"] = [step for step, _ in run.skipped_checkpoints]
  writer.write("resume", run.resumed_from, values)
  note = _device_change(run)
  if note:
    logging.warning("%s", note)
  return writer.records("eval")


def _recorded_final_evaluation(run: Run, last: dict[str, float]) -> dict[str, float]:
  """For a resumed run that took no step (it was finished): `last`, the evaluation `metrics.jsonl`
  holds at its step, as process 0 read it ({} if none: preempted at its last step), on every process,
  so that all of them evaluate again or none (an evaluation is a collective). {} if it took steps."""
  if run.step_count != run.resumed_from:
    return {}
  if jax.process_count() == 1:
    return last
  text = json.dumps(last).encode()
  size = int(multihost_utils.broadcast_one_to_all(np.int32(len(text))))
  local = np.frombuffer(text, np.uint8) if run.process_index == 0 else np.zeros(size, np.uint8)
  return json.loads(bytes(multihost_utils.broadcast_one_to_all(local)))


def train_and_evaluate(config: ml_collections.ConfigDict | ResolvedRun, workdir: str | pathlib.Path, *,
                       origin: str = "") -> TrainResult:
  """Trains and evaluates the run `config` describes (a config, or the `ResolvedRun` that
  `lbjax.train.validation.validate` made of one), checkpointing into `workdir`.

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
  resolved, watch = run.resolved, run.resolved.watch
  distributed.watch(lambda: run.step_count)  # multi-host: the step a lost-host message names
  try:
    _describe_start(run, workdir, origin)
    writer = MetricsWriter(workdir, enabled=run.process_index == 0, tensorboard=watch.tensorboard)
  except BaseException:
    run.close()
    raise
  progress = ProgressLine(resolved.num_epochs, resolved.num_steps, enabled=run.process_index == 0 and watch.progress)
  progress.reset_window(run.examples_seen, run.epoch, run.step_count)
  start_examples = run.examples_seen
  metrics = hooks.WriteMetrics(writer, progress, watch.log_every, layerwise_rates=run.parts.has_layerwise_rates)
  evaluation = hooks.EvaluateAndSave(writer, progress, metrics.flush, watch.eval_every_epochs, run.epoch,
                                     num_epochs=resolved.num_epochs, num_steps=resolved.num_steps,
                                     eval_split=run.task.dataset.eval_split)
  evaluation.recall(_start_metrics(run, writer), run.resumed_from)
  preemption = hooks.SaveOnPreemption(
      metrics.flush, checkpoint_directory=run.checkpoints.directory if run.checkpoints is not None else None,
      announce=watch.progress and run.process_index == 0)
  decisions = batch_policy.RecordBatchDecisions(writer, run.batch_policy)
  profile = profiling.Profile(
      watch.profile, writer, progress, profiling.trace_directory(workdir, run.process_index, jax.process_count()),
      platform=run.mesh.devices.flat[0].platform, start_step=run.step_count, read_back=run.process_index == 0,
      announce=watch.progress and run.process_index == 0)
  around_steps: list[protocols.Hook] = [
      metrics, hooks.RecordCompiles(writer, progress), hooks.Lipschitz(writer, watch.lipschitz_every), evaluation,
      hooks.Checkpoint(watch.checkpoint_every_steps, metrics.flush), decisions, profile, preemption]
  with contextlib.ExitStack() as closing:  # on the way out, whatever raised: these, last first
    closing.callback(writer.close)
    closing.callback(preemption.restore)
    closing.callback(run.close)  # waits for the checkpoint in flight while the signal handlers are still installed
    closing.callback(profile.close, run)  # a trace the run left running (it ended or stopped early) is written
    if resolved.compressor is not None:
      hooks.write_compression_bits(writer, run.step_count, run.state.params, resolved.compressor.resolved.name,
                                   run.parts.compressor)
    profile.begin(run)
    while not run.finished() and not preemption.stopped:
      with profile.annotate(run):
        for step_metrics in step_calls.take_steps(run, around_steps):
          for hook in around_steps:
            hook.after_step(run, step_metrics)
    profile.close(run)  # a run that ended inside its traced steps: the final evaluation stays out of the trace
    metrics.flush(run)
    decisions.flush()
    if not preemption.stopped:
      recorded = _recorded_final_evaluation(run, evaluation.last)
      if recorded:  # a resumed finished run: not evaluated twice
        evaluation.last = recorded
      else:
        evaluation.evaluate(run, final=True)
      run.save()
  progress.summary(step=run.step_count, epoch=run.epoch, examples_seen=run.examples_seen - start_examples,
                   final=evaluation.last, best=evaluation.best, preempted=preemption.stopped)
  return TrainResult(run.state, evaluation.last, run.step_count, run.epoch, run.examples_seen,
                     tuple(batch_size for batch_size, _ in run.compiled), preemption.stopped)
