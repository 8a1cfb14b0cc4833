"""One run of an experiment, trained at most once, and the row it leaves: what every script shares.

`run_once(config, run_dir, name=...)` trains `config` in `run_dir` unless the run finished there (its
final evaluation is in `metrics.jsonl`) or diverged there (`diverged.txt` holds the trainer's message);
a run that finished far worse than a uniform guess (`DIVERGED_ABOVE_UNIFORM_NATS`) counts as diverged too;
an interrupted run resumes from its checkpoint, a preempted one stops the experiment (`RunPreempted`,
a KeyboardInterrupt) so that running it again resumes. It returns a `RunRow`: the one row type of the
experiments' tables.
`ints` and `floats` are the scripts' comma-separated list arguments, `check_paths` checks their `--out`
(`out_problem`) and `--workdir`, `seeds_problem` their seeds, `run_dir` names a seeded run's directory, and
`planned_run` says what `run_once` would do (`print_dry_run`: a `--dry-run`'s lines), with the split it evaluates
(`evaluated_split`).
"""

import argparse
import dataclasses
import json
import math
import numbers
import pathlib
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar

import ml_collections

from experiments import run_records
from lbjax import config_files
from lbjax import train
from lbjax.train import abstract_data
from lbjax.train import checkpointing
from lbjax.train import config as config_lib
from lbjax.train import optimizer as optimizer_lib
from lbjax.train import summary
from lbjax.train import validation
from lbjax.train import workdir_lock
from lbjax.train.errors import RunPreempted

# A run diverged when it ended this many nats above a uniform guess's loss (`uniform_guess_loss`): its
# predictions e times worse than uniform on average. An initialised model starts within a fraction of a nat
# of the uniform guess, and one that trained too little (a tiny LR) ends just below or above it: not diverged.
DIVERGED_ABOVE_UNIFORM_NATS = 1.0
DIVERGED_NOTE = "diverged.txt"  # in a run's directory: the message of the non-finite step that stopped it
TRAINED_SECONDS = "trained_seconds.txt"  # in a run's directory: wall-clock seconds of the sessions that trained it
Key = TypeVar("Key")  # how an experiment names its runs, e.g. (row, seed)


@dataclasses.dataclass(frozen=True)
class RunRow:
  """One run of an experiment and how it ended (a line of the experiment's CSV).

  Attributes:
    name: what the run is in its experiment: a table's row, a sweep's scaling rule, an optimizer.
    seed: the run's `config.seed` (initialisation and shuffling).
    split: the split evaluated (`data_options.eval_split`: "test", "validation", "valid").
    metric: "accuracy" or "perplexity".
    value: the final evaluation's `metric` (accuracy in [0, 1] or perplexity); NaN if a non-finite step
      stopped it.
    status: "done", or "diverged": a non-finite loss or update stopped it, or its final evaluation loss
      is `DIVERGED_ABOVE_UNIFORM_NATS` above `uniform_guess_loss` (the value is then kept: e.g. a
      perplexity in the millions).
    learning_rate: the peak learning rate after the scaling rule.
    warmup_epochs: the warm-up after the scaling rule (0 without one).
    epochs: epochs trained (to the last record of a diverged run).
    steps: parameter updates made.
    seconds: wall-clock seconds of the sessions that trained the run, a preempted one and the one that
      resumed it added up (`TRAINED_SECONDS`; 0 for a run read back, not trained now).
    device: the devices that trained it, e.g. "1x cpu" ("" in CSVs written before the column).
    batch_size: the run's (first) global batch size (None where a CSV written before the column does not say).
    same_as: for a sweep, the rule whose identical recipe this row repeats rather than trains again.
  """
  name: str
  seed: int
  split: str
  metric: str
  value: float
  status: str
  learning_rate: float = math.nan
  warmup_epochs: float = 0.0
  epochs: float = 0.0
  steps: int = 0
  seconds: float = 0.0
  device: str = ""
  batch_size: int | None = None
  same_as: str = ""


def run_dir(workdir: str | pathlib.Path, run: str, seed: int) -> pathlib.Path:
  """Where one seeded run of adaptive_batch, batch_schedule or critical_batch warmup trains:
  `<workdir>/<run>_seed<seed>` (a variant table's are `variant_table.row_run_dir`'s)."""
  return pathlib.Path(workdir) / f"{run}_seed{seed}"


def seeds_problem(seeds: Sequence[int]) -> str:
  """What is wrong with an experiment's seeds, or "" if nothing: at least one, each an integer >= 0 (a NumPy
  integer too, not a bool), no seed twice (two runs of one seed would share a directory and a result)."""
  seeds = list(seeds)
  if (not seeds or len(set(seeds)) != len(seeds)
      or any(isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 0 for s in seeds)):
    return f"seeds {list(seeds)} must be distinct integers >= 0, at least one."
  return ""


def finished(run_dir: str | pathlib.Path) -> bool:
  """Whether the run in `run_dir` ended: its final evaluation was written, or it diverged."""
  run_dir = pathlib.Path(run_dir)
  return (run_dir / DIVERGED_NOTE).is_file() or (
      (run_dir / "metrics.jsonl").is_file() and run_records.final_eval(run_dir) is not None)


def planned_run(config: ml_collections.ConfigDict, run_dir: str | pathlib.Path) -> str:
  """What `run_once(config, run_dir)` would do, in one line (an experiment's `--dry-run`): the recipe as it
  resolves (batch, peak LR and warm-up after the scaling rule, epochs, the split evaluated) and whether the
  run is new, resumes from its newest checkpoint, or ended in `run_dir` (read back, not trained)."""
  run = summary.resolved_run(validation.validate(config))
  steps = checkpointing.complete_steps(pathlib.Path(run_dir) / "checkpoints")
  problem = recorded_recipe_problem(config, run_dir) if finished(run_dir) else ""
  state = (f"refused: {problem}" if problem else "ended there: read back" if finished(run_dir)
           else f"resumes at step {steps[0]}" if steps else "new")
  return (f"batch {run['batch_size']}, peak LR {run['learning_rate']:.6g}, warm-up {run['warmup_epochs']:.6g} "
          f"epochs, {run['num_epochs']:g} epochs, {evaluated_split(config)} split; "
          f"{run_dir}: {state}")


# What a finished run may differ in from the config that reads it back: how it was run, not what it computed
# (`lbjax.train.config.OPERATIONAL_FIELDS` but the length of training).
_READ_BACK_OPERATIONAL = tuple(f for f in config_lib.OPERATIONAL_FIELDS if f not in ("num_epochs", "num_steps"))


def _field_differences(name: str, there: object, now: object) -> list[str]:
  """`name: <there> there, <now> now` for each leaf field in which two config values differ."""
  if isinstance(there, dict) and isinstance(now, dict):
    return [line for key in sorted(set(there) | set(now))
            for line in _field_differences(f"{name}.{key}", there.get(key), now.get(key))]
  return [] if there == now else [f"{name}: {there!r} there, {now!r} now"]


def recorded_recipe_problem(config: ml_collections.ConfigDict, run_dir: str | pathlib.Path) -> str:
  """Why the finished run in `run_dir` is not the run of `config` (its `config.json` records another recipe:
  another LR, more epochs), or "" where it is, or where it records none. Reading it back would give the old
  recipe's result under the new one's name."""
  path = pathlib.Path(run_dir) / "config.json"
  recorded = json.loads(path.read_text()).get("config") if path.is_file() else None
  if recorded is None:
    return ""
  differences = config_lib.recipe_differences(json.dumps(recorded), config, _READ_BACK_OPERATIONAL)
  if not differences:
    return ""
  details = "; ".join(line for field, (there, now) in differences.items()
                      for line in _field_differences(field, there, now))
  return (f"{run_dir} holds a finished run of another recipe ({details}): delete that directory to train this run, "
          "or choose another --workdir.")


def evaluate_final_state(config: ml_collections.ConfigDict, run_dir: str | pathlib.Path) -> dict[str, float]:
  """`config`'s evaluation of the final parameters and BatchNorm statistics of the run in `run_dir` (its newest
  checkpoint), once: nothing is trained and `run_dir` is only read (`init_from`, in a scratch workdir). The
  config may evaluate another split or protocol than the run did; its training data may differ too (the test
  split's run trains on all 60,000 MNIST images, the validation split's on 50,000), which a resume of the run
  itself would refuse. The metrics carry the checkpoint's `step`."""
  config = ml_collections.ConfigDict(config.to_dict())
  config.init_from, config.progress = str(run_dir), False
  with tempfile.TemporaryDirectory(prefix="evaluate-") as scratch:
    run = train.Run(config, scratch)
    try:
      return dict(run.evaluate(), step=run.start.initialized_from[1])
    finally:
      run.close()


def config_loader(spec: str, overrides: Sequence[str] = ()) -> Callable[[], ml_collections.ConfigDict]:
  """A run's loader for `run_problems`/`load_runs`: the config `spec` (`name[:variant]` or a file) with the
  `--config.<field>=<value>` `overrides`, as lbjax-train loads it (`config_files.load`)."""
  return lambda: config_files.load(spec, list(overrides)).config


def run_problems(loaders: Mapping[Key, Callable[[], ml_collections.ConfigDict]],
                 label: Callable[[Key], str] = str) -> tuple[dict[Key, ml_collections.ConfigDict], list[str]]:
  """Every run's config before the first trains: loaded (`loaders[key]()`) and checked as lbjax-train checks a
  run (`train.validate`). Returns the configs that pass, and one "<label>: <problem>" line (`label(key)`) for each
  run whose config does not load or is invalid."""
  configs, problems = {}, []
  for key, load in loaders.items():
    try:
      config = load()
      train.validate(config)
    except train.ConfigError as e:
      problems.append(f"{label(key)}: {e}")
    else:
      configs[key] = config
  return configs, problems


def load_runs(loaders: Mapping[Key, Callable[[], ml_collections.ConfigDict]], what: str,
              label: Callable[[Key], str] = str) -> dict[Key, ml_collections.ConfigDict]:
  """Every run's config, loaded and checked before the first trains (`run_problems`); one `ConfigError` names
  each run that does not load or is invalid: "Invalid <what>:\n  - <label>: <problem>"."""
  configs, problems = run_problems(loaders, label)
  if problems:
    raise train.ConfigError(f"Invalid {what}:\n  - " + "\n  - ".join(problems))
  return configs


def add_dry_run(parser: argparse.ArgumentParser) -> None:
  """The experiment scripts' `--dry-run` flag (`print_dry_run` prints its lines)."""
  parser.add_argument("--dry-run", action="store_true",
                      help="check every run and print what each would train (its recipe; new, resuming or ended), "
                           "training nothing and writing nothing")


def print_dry_run(prefix: str, runs: Iterable[tuple[str, ml_collections.ConfigDict, pathlib.Path]]) -> None:
  """An experiment's `--dry-run`: for each `(label, config, run_dir)`, the line `<prefix>   <label>: ` and what
  `run_once` would do (`planned_run`); trains nothing."""
  for label, config, run_dir in runs:
    print(f"{prefix}   {label}: {planned_run(config, run_dir)}", flush=True)


def evaluated_split(config: ml_collections.ConfigDict) -> str:
  """The split the run of `config` evaluates: `data_options.eval_split`, or its dataset's default (ImageNet's
  is "validation")."""
  return abstract_data.data_shapes(validation.validate(config).dataset).dataset.eval_split


def uniform_guess_loss(config: ml_collections.ConfigDict) -> float:
  """ln K for a task of K classes (a language model's K: its vocabulary): the cross-entropy of predicting
  each class with probability 1/K, about where an untrained model starts (ln 10,000 = 9.21 for PTB,
  perplexity 10,000). A run that ends a nat above it (`DIVERGED_ABOVE_UNIFORM_NATS`) has learned less
  than nothing: it diverged without a non-finite step (e.g. LEGW's LR 5.66 at B=640 on one PTB seed: test
  perplexity 3.6e7). Infinite for a dataset whose model takes neither `num_classes` nor `vocab_size`."""
  arguments = abstract_data.data_shapes(validation.validate(config).dataset).dataset.model_arguments
  classes = arguments.get("vocab_size", arguments.get("num_classes"))
  return math.log(classes) if classes else math.inf


def diverged_above(config: ml_collections.ConfigDict) -> float:
  """The final evaluation loss above which a run of `config` diverged without a non-finite step
  (`uniform_guess_loss` + `DIVERGED_ABOVE_UNIFORM_NATS`)."""
  return uniform_guess_loss(config) + DIVERGED_ABOVE_UNIFORM_NATS


def learned(final: dict | None, above: float) -> bool:
  """Whether a run whose final evaluation record is `final` (None: it has none, a non-finite step stopped it)
  learned: it ended at a loss of at most `above` (`diverged_above`)."""
  return final is not None and not ("loss" in final and float(final["loss"]) > above)


def read_row(config: ml_collections.ConfigDict, run_dir: str | pathlib.Path, *, name: str,
             metric: str | None = None, seconds: float = 0.0) -> RunRow | None:
  """The row of the run of `config` in `run_dir`; None while it has not ended. `metric` None: the final
  evaluation's accuracy or perplexity, whichever the task reports.

  Raises:
    ConfigError: the run in `run_dir` ended with another recipe than `config`'s (`recorded_recipe_problem`).
  """
  run_dir = pathlib.Path(run_dir)
  if not finished(run_dir):
    return None
  if problem := recorded_recipe_problem(config, run_dir):
    raise train.ConfigError(problem)
  recipe = optimizer_lib.scaled_recipe(config)
  has_warmup = config.lr.warmup != "none" or config.scaling.rule == "goyal"  # goyal brings its own warm-up
  logged = run_records.read_records(run_dir, "train") if (run_dir / "metrics.jsonl").is_file() else []
  final = None if (run_dir / DIVERGED_NOTE).is_file() else run_records.final_eval(run_dir)
  last = final or (logged[-1] if logged else {"epoch": 0.0, "step": 0})
  metric = metric or next((m for m in ("accuracy", "perplexity") if final and m in final), "accuracy")
  return RunRow(name, config.seed, evaluated_split(config), metric, float(final[metric]) if final else math.nan,
                "done" if learned(final, diverged_above(config)) else "diverged", recipe.learning_rate,
                recipe.warmup_epochs if has_warmup else 0.0, last["epoch"], last["step"], seconds,
                run_records.training_devices(), config_lib.batch_sizes(config)[0])


def run_once(config: ml_collections.ConfigDict, run_dir: str | pathlib.Path, *, name: str,
             metric: str | None = None, prefix: str = "[experiment]") -> RunRow:
  """Trains `config` in `run_dir` unless the run ended there before, and returns its row.

  A non-finite step leaves `DIVERGED_NOTE` with the trainer's message (the row's status is "diverged")
  instead of stopping the experiment; `prefix` starts the progress lines.

  Raises:
    RunPreempted: the run was preempted (SIGTERM or SIGINT); running the experiment again resumes it.
  """
  run_dir = pathlib.Path(run_dir)
  row = read_row(config, run_dir, name=name, metric=metric)
  if row is not None:
    return row
  print(f"{prefix} {name} seed={config.seed} -> {run_dir}", flush=True)
  start = time.time()
  try:
    preempted = train.train_and_evaluate(config, run_dir).preempted
  except train.NonFiniteError as error:
    print(f"{prefix}   diverged: {error}", flush=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / DIVERGED_NOTE).write_text(f"{error}\n")
    preempted = False
  finally:
    seconds = _add_trained_seconds(run_dir, time.time() - start)
  if preempted:
    raise RunPreempted(f"{name} seed {config.seed} was preempted (SIGTERM or SIGINT); its checkpoint in {run_dir} "
                       "resumes when the experiment runs again.")
  return read_row(config, run_dir, name=name, metric=metric, seconds=seconds)


def _add_trained_seconds(run_dir: pathlib.Path, seconds: float) -> float:
  """Adds a session's wall-clock seconds to those `run_dir` recorded; returns the sum. (A session killed
  without a chance to write, e.g. by SIGKILL, is not counted.)"""
  path = run_dir / TRAINED_SECONDS
  total = seconds + (float(path.read_text()) if path.is_file() else 0.0)
  if run_dir.is_dir():  # a run refused before it made its directory trained nothing
    path.write_text(f"{total:.3f}\n")
  return total


def _numbers(kind: type, example: str):
  def parse(text: str) -> tuple:
    try:
      return tuple(kind(t) for t in text.split(",") if t.strip())
    except ValueError:
      raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__}s such as {example}, "
                                       f"got {text!r}") from None
  parse.__name__ = f"{kind.__name__}s"  # argparse names the type in its messages
  return parse


ints = _numbers(int, "128,512")  # argparse type: "128,512" -> (128, 512)
floats = _numbers(float, "0.1,0.3")  # argparse type: "0.1,0.3" -> (0.1, 0.3)


def out_problem(out: str) -> str:
  """What keeps this process from writing the files of the output prefix `out` (`<out>.csv`, `<out>.md`, ...),
  or "" if nothing: a directory named `out`, or a folder for them it cannot create or write
  (`workdir_lock.blocked_folder`)."""
  path = pathlib.Path(out)
  if path.is_dir():
    return (f"--out {out!r} is a directory; --out is the prefix of the files written (<out>.csv, <out>.md, ...), "
            f"e.g. {str(path / 'results')!r}.")
  blocked = workdir_lock.blocked_folder(path.parent)
  if blocked is None:
    return ""
  where, kind = blocked
  if kind == "file":
    return (f"--out {out!r} lies under {str(where)!r}, which is a file: name a prefix in a folder, e.g. "
            "reproduced/results.")
  return f"--out {out!r}: {workdir_lock.blocked_reason(where, kind)}; name a prefix in a folder this process can write."


def check_paths(parser: argparse.ArgumentParser, *, out: str | None = None, workdir: str | None = None) -> None:
  """Ends the command with `parser`'s usage error (exit 2) before anything runs, creating nothing, if the
  experiment could not write its outputs at `out` (`out_problem`) or its runs in `workdir`
  (`workdir_lock.workdir_problem`); None: not given."""
  problems = [out_problem(out) if out is not None else "", workdir_lock.workdir_problem(workdir) if workdir else ""]
  if problem := next((p for p in problems if p), ""):
    parser.error(problem)
