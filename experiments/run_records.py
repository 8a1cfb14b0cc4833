"""Reading a run's `metrics.jsonl` (written by `lbjax.train`): evaluations and the final result; the
devices that trained it, as the experiment tables record them; a table's CSV written atomically; a
table's runs evaluated again (`experiments.reevaluate`), as `<out>.reevaluated.csv` records them."""

from collections.abc import Sequence
import csv
import dataclasses
import json
import os
import pathlib
from typing import Any

import jax


def read_records(workdir: str | pathlib.Path, kind: str | None = None) -> list[dict[str, Any]]:
  """The JSON records of `<workdir>/metrics.jsonl`, optionally only those of one `kind`.

  A run that resumed after an interruption may have logged a step twice; the last record of each
  (kind, step) wins, and records come back sorted by step.

  Raises:
    FileNotFoundError: if the workdir holds no metrics.jsonl (the run never started).
  """
  path = pathlib.Path(workdir) / "metrics.jsonl"
  if not path.is_file():
    raise FileNotFoundError(f"{path} does not exist: no run has written metrics in {workdir}.")
  latest: dict[tuple[str, int], dict[str, Any]] = {}
  for line in path.read_text().splitlines():
    if not line.strip():
      continue
    record = json.loads(line)
    if kind is None or record["kind"] == kind:
      latest[(record["kind"], record["step"])] = record
  return sorted(latest.values(), key=lambda r: r["step"])


def eval_curve(workdir: str | pathlib.Path) -> list[dict[str, Any]]:
  """The evaluation records of a run (step, epoch, loss, accuracy or perplexity), by step."""
  return read_records(workdir, "eval")


def final_eval(workdir: str | pathlib.Path) -> dict[str, Any] | None:
  """The final evaluation of a finished run (the record marked `final`), or None if unfinished."""
  finals = [r for r in eval_curve(workdir) if r.get("final")]
  return finals[-1] if finals else None


def training_devices() -> str:
  """The devices this process trains on, as the tables' `device` column records them: "1x cpu",
  "8x cpu", "1x NVIDIA H200"."""
  return f"{jax.device_count()}x {jax.devices()[0].device_kind}"


def write_csv(path: str | pathlib.Path, fields: Sequence[str], rows: Sequence[Any]) -> None:
  """`path` as a CSV of `fields` (attributes of each row), replaced atomically (`write_csv_rows`)."""
  write_csv_rows(path, fields, [[getattr(row, field) for field in fields] for row in rows])


def write_csv_rows(path: str | pathlib.Path, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
  """`path` as a CSV of `header` and `rows` (lists of cells), replaced atomically: a reader, such as
  another process sharing a table, never sees half a file."""
  path = pathlib.Path(path)
  partial = path.with_suffix(path.suffix + ".partial")
  with open(partial, "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(header)
    writer.writerows(rows)
  os.replace(partial, path)


EVALUATION_FIELDS = ("name", "seed", "split", "metric", "label", "value", "trained_value", "settings")


@dataclasses.dataclass(frozen=True)
class Evaluation:
  """A finished run of a table evaluated again under `settings` (a line of `<out>.reevaluated.csv`)."""
  name: str
  seed: int
  split: str
  metric: str
  label: str  # names the settings, e.g. "stream"
  value: float  # the metric under `settings`
  trained_value: float  # the run's own final metric, under the table's settings
  settings: str  # the overrides, space-separated


def evaluations_path(out: str | pathlib.Path) -> pathlib.Path:
  """Where the re-evaluations of the table whose results prefix is `out` are recorded."""
  out = pathlib.Path(out)
  return out.with_name(out.name + ".reevaluated.csv")


def read_evaluations(out: str | pathlib.Path) -> list[Evaluation]:
  """The re-evaluations recorded for the table whose results prefix is `out` (none if there are none)."""
  path = evaluations_path(out)
  if not path.is_file():
    return []
  with open(path, newline="") as f:
    return [Evaluation(r["name"], int(r["seed"]), r["split"], r["metric"], r["label"], float(r["value"]),
                       float(r["trained_value"]), r["settings"]) for r in csv.DictReader(f)]
