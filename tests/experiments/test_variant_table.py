"""Variant tables on the tiny synthetic config: each row's recipe, outputs, skipping, bad tables."""

import json
import math
import os
import pathlib
import subprocess
import sys

import jax
import pytest

from experiments import runner
from experiments import variant_table
from lbjax import train
from lbjax.train.workdir_lock import WorkdirLock

TINY_CONFIG = str(pathlib.Path(__file__).with_name("tiny_sweep_config.py"))
TABLES = pathlib.Path(variant_table.__file__).with_name("tables")
ROOT = pathlib.Path(__file__).parents[2]


def _table(**overrides):
  data = {"title": "tiny", "config": TINY_CONFIG + ":batch=64",
          "rows": [{"name": "base", "tests": "the config"},
                   {"name": "lr_0.2", "variant": "lr=0.2", "tests": "a larger LR"},
                   {"name": "legw", "variant": "rule=legw", "overrides": ["lr.decay=polynomial_decay"],
                    "tests": "LEGW with poly decay"}]}
  data.update(overrides)
  return variant_table.parse_table(data)


@pytest.fixture(scope="module")
def finished_table(tmp_path_factory):
  tmp_path = tmp_path_factory.mktemp("table")
  table = _table(seeds=[0, 1])
  out = tmp_path / "results" / "tiny"
  results = variant_table.run_table(table, str(out), str(tmp_path / "runs"))
  return table, out, tmp_path / "runs", results


def test_each_row_trains_its_own_recipe_once_per_seed(finished_table):
  _, out, runs, results = finished_table
  by_run = {(r.name, r.seed): r for r in results}
  assert set(by_run) == {(n, s) for n in ("base", "lr_0.2", "legw") for s in (0, 1)}
  assert by_run[("base", 0)].learning_rate == pytest.approx(0.05)
  assert by_run[("lr_0.2", 0)].learning_rate == pytest.approx(0.2)
  # LEGW from B=32 to 64: sqrt(2) x the LR, 2 x the 0.125-epoch baseline warm-up.
  assert by_run[("legw", 1)].learning_rate == pytest.approx(0.05 * math.sqrt(2))
  assert by_run[("legw", 1)].warmup_epochs == pytest.approx(0.25)
  legw_config = json.loads((runs / "legw_s1" / "config.json").read_text())["config"]
  assert legw_config["lr"]["decay"] == "polynomial_decay" and legw_config["seed"] == 1
  for r in results:
    assert r.status == "done" and 0.0 <= r.value <= 1.0 and r.split == "test" and r.steps == 4
    assert r.device == f"{jax.device_count()}x cpu"
  assert variant_table.read_results(out.with_suffix(".csv")) == results
  assert f"| {jax.device_count()}x cpu |" in out.with_suffix(".md").read_text()


def test_a_csv_written_before_the_device_column_reads_as_not_recorded(tmp_path):
  old = tmp_path / "old.csv"
  old.write_text("name,seed,split,metric,value,status,learning_rate,warmup_epochs,epochs,steps,seconds\n"
                 "base,0,test,accuracy,0.9,done,0.05,0.0,1.0,4,3.0\n")
  [result] = variant_table.read_results(old)
  assert result.device == ""
  assert "| not recorded |" in variant_table.markdown(_table(), [result])


def test_markdown_compares_rows_with_the_reference(finished_table):
  table, out, _, results = finished_table
  page = out.with_suffix(".md").read_text()
  base = [r.value for r in results if r.name == "base"]
  larger = [r.value for r in results if r.name == "lr_0.2"]
  delta = 100 * (sum(larger) / 2 - sum(base) / 2)
  line = next(row for row in page.splitlines() if row.startswith("| `lr_0.2` |"))
  assert f"{delta:+.2f}" in line and "`lr=0.2`" in line and "| 2/2 |" in line
  assert "`rule=legw, lr.decay=polynomial_decay`" in page
  assert out.with_suffix(".png").stat().st_size > 0
  assert table.rows[0].name == "base"


def test_recorded_runs_are_skipped_and_rows_can_be_chosen(finished_table, monkeypatch):
  table, out, runs, results = finished_table
  monkeypatch.setattr(train, "train_and_evaluate", lambda *a, **k: pytest.fail("trained a recorded run"))
  assert variant_table.run_table(table, str(out), str(runs)) == results
  extended = _table(rows=[*json.loads(json.dumps([{"name": "base", "tests": "t"}])),
                          {"name": "new", "variant": "lr=0.01", "tests": "t"}])
  trained = []
  monkeypatch.setattr(runner, "run_once", lambda config, run_dir, name, metric, prefix: trained.append(name)
                      or runner.RunRow(name, config.seed, "test", metric, 0.5, "done", 0.01, 0.0, 1.0, 4, 1.0))
  variant_table.run_table(extended, str(out), str(runs), seeds=(0,), only=("new",))
  assert trained == ["new"]


def test_a_diverging_row_is_recorded_as_such(tmp_path, monkeypatch):
  table = _table(rows=[{"name": "base", "tests": "t"},
                       {"name": "huge", "variant": "lr=1e30", "tests": "diverges"}])
  train_and_evaluate = train.train_and_evaluate

  def diverge_at_huge_lr(config, workdir):
    if config.lr.base > 1:
      raise train.NonFiniteError("loss is nan at step 3")
    return train_and_evaluate(config, workdir)

  monkeypatch.setattr(train, "train_and_evaluate", diverge_at_huge_lr)
  results = variant_table.run_table(table, str(tmp_path / "t"), str(tmp_path / "runs"))
  huge = next(r for r in results if r.name == "huge")
  assert huge.status == "diverged" and math.isnan(huge.value)
  assert "diverged" in (tmp_path / "t.md").read_text()


def test_a_run_worse_than_a_uniform_guess_is_left_out_of_its_rows_mean():
  """Three seeds of one row, the third ended at perplexity 3.6e7 (`runner.read_row`: diverged, its value kept):
  the row is the mean of the two that learned, and says one diverged; the run is listed with its value."""
  table = _table(metric="perplexity", rows=[{"name": "base", "tests": "t"}])
  results = [runner.RunRow("base", seed, "test", "perplexity", value, status)
             for seed, value, status in ((0, 150.0, "done"), (1, 160.0, "done"), (2, 3.6e7, "diverged"))]
  page = variant_table.markdown(table, results)
  assert "| test | 155.00 ± 7.07 (1 diverged) |" in page and "| 2/3 |" in page
  assert "| 36000000.00 | diverged |" in page and "uniform guess" in page


@pytest.mark.parametrize("changes, message", [
    ({"rows": []}, "'rows' must be a non-empty list"),
    ({"rows": [{"name": "a", "tests": "t"}, {"name": "a", "tests": "t"}]}, "repeated: a"),
    ({"rows": [{"name": "a b", "tests": "t"}]}, "'name' must be letters"),
    ({"rows": [{"name": "a", "tests": "t", "extra": 1}]}, "unknown key 'extra'"),
    ({"rows": [{"name": "a"}]}, "'tests' must say what the row tests"),
    ({"seeds": [0, 0]}, "'seeds' must be a non-empty list of distinct"),
    ({"overrides": "lr.base=1"}, "'overrides' must be a list of strings"),
    ({"metric": "loss"}, "'metric' must be 'accuracy' or 'perplexity'"),
    ({"colour": "red"}, "unknown key 'colour'"),
])
def test_bad_tables_are_refused_naming_the_problem(changes, message):
  with pytest.raises(ValueError, match=message):
    _table(**changes)


def test_bad_rows_and_names_are_refused_before_training(tmp_path, monkeypatch):
  monkeypatch.setattr(train, "train_and_evaluate", lambda *a, **k: pytest.fail("trained"))
  table = _table(rows=[{"name": "a", "tests": "t", "overrides": ["lr.bogus_field=1"]}])
  with pytest.raises(ValueError, match="(?s)row a: .*bogus_field"):
    variant_table.run_table(table, str(tmp_path / "t"), str(tmp_path / "runs"))
  with pytest.raises(ValueError, match="--rows names 'nope'"):
    variant_table.run_table(_table(), str(tmp_path / "t"), str(tmp_path / "runs"), only=("nope",))



def test_a_row_whose_batch_its_own_mesh_cannot_split_is_refused_before_any_row_trains(tmp_path, monkeypatch):
  """The rows are checked with the mesh their config fixes (here 3 batch shards of a batch of 64), as
  lbjax-train checks a run, so that no earlier row trains before a later one fails at its start."""
  monkeypatch.setattr(train, "train_and_evaluate", lambda *a, **k: pytest.fail("trained"))
  table = _table(rows=[{"name": "a", "tests": "t"}, {"name": "b", "tests": "t", "overrides": ["mesh.data=3"]}])
  with pytest.raises(ValueError, match="(?s)row b: .*batch size 64 is not divisible by the data-parallel size 3"):
    variant_table.run_table(table, str(tmp_path / "t"), str(tmp_path / "runs"))


@pytest.mark.parametrize("under", [False, True])
def test_a_workdir_that_is_a_file_is_refused_before_training(tmp_path, monkeypatch, capsys, under):
  monkeypatch.setattr(train, "train_and_evaluate", lambda *a, **k: pytest.fail("trained"))
  path = tmp_path / "t.json"
  path.write_text(json.dumps({"title": "tiny", "config": TINY_CONFIG, "rows": [{"name": "legw", "tests": "t"}]}))
  existing = tmp_path / "a_file"
  existing.write_text("not a workdir")
  workdir = existing / "runs" if under else existing
  with pytest.raises(SystemExit) as exit_info:
    variant_table.main([str(path), "--out", str(tmp_path / "o"), "--workdir", str(workdir), "--rows", "legw",
                        "--seeds", "0"])
  captured = capsys.readouterr()
  what = f"lies under {str(existing)!r}, which is a file" if under else "is a file"
  assert exit_info.value.code == 2 and captured.err.endswith(
      f"python -m experiments.variant_table: error: --workdir {str(workdir)!r} {what}, not a directory: name a new "
      "directory or one holding a run to resume.\n")
  assert captured.out == "" and not (tmp_path / "o.csv").exists()


def test_cli_reports_a_bad_table_in_one_message(tmp_path, capsys):
  path = tmp_path / "t.json"
  path.write_text("{not json")
  with pytest.raises(SystemExit) as exit_info:
    variant_table.main([str(path), "--out", str(tmp_path / "o"), "--workdir", str(tmp_path / "w")])
  assert exit_info.value.code == 2 and "is not valid JSON" in capsys.readouterr().err


@pytest.mark.parametrize("path", sorted(TABLES.glob("*.json")), ids=lambda p: p.stem)
def test_packaged_tables_load_every_row(path):
  table = variant_table.load_table(path)
  for row in table.rows:
    for seed in table.seeds:
      variant_table.row_config(table, row, seed)


def test_a_table_with_series_plots_lines_over_x(tmp_path):
  table = _table(x_label="batch size", rows=[
      {"name": f"{s}_b{b}", "variant": f"batch={b}" + (",rule=legw" if s == "legw" else ""), "series": s, "x": b,
       "tests": "t"} for s in ("legw", "none") for b in (32, 64)])
  results = [runner.RunRow(row.name, 0, "test", "accuracy", 0.5 + row.x / 1000, "done", 0.05, 0.0, 1.0, 4, 1.0)
             for row in table.rows]
  variant_table.write_outputs(table, results, tmp_path / "lines")
  assert (tmp_path / "lines.png").stat().st_size > 0
  assert {row.series for row in table.rows} == {"legw", "none"}


def test_plots_label_the_batch_sizes_run_and_plain_perplexities(tmp_path):
  matplotlib = pytest.importorskip("matplotlib")
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt
  rows = [variant_table.TableRow(f"b{b}", "t", series="legw", x=b) for b in (20, 40, 80, 160, 320, 640)]
  stats = [(110.0 + b / 10, 1.0, 1) for b in (20, 40, 80, 160, 320, 640)]
  figure, axes = plt.subplots()
  variant_table._draw_lines(axes, rows, stats, 1.0, "batch size", [0, 0, 0, 0, 0, 1])
  axes.set_yscale("log")
  variant_table._plain_log_axis(axes.yaxis)
  figure.canvas.draw()
  assert [t.get_text() for t in axes.get_xticklabels()] == ["20", "40", "80", "160", "320", "640"]
  y_labels = [t.get_text() for t in axes.get_yticklabels() if t.get_text()]
  assert y_labels and all(label.replace(",", "").isdigit() for label in y_labels), y_labels
  assert [t.get_text() for t in axes.texts] == ["1 diverged"]  # B=640's point: the mean of the others
  plt.close(figure)


def _figure_of(monkeypatch, table, results, tmp_path):
  """The figure `variant_table.plot` draws (kept from being closed)."""
  matplotlib = pytest.importorskip("matplotlib")
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt
  kept = []
  monkeypatch.setattr(plt, "close", kept.append)
  variant_table.plot(table, results, tmp_path / "plot.png")
  figure = kept[0]
  figure.canvas.draw()
  return figure


def test_a_perplexity_bar_plot_has_labels_apart_and_its_title_inside(monkeypatch, tmp_path):
  """Perplexities over a 30x span (123 to 3,789, as the PTB 640 hypotheses) once crowded 26 labels into the
  axis; row names as long as that table's once pushed the title past the figure's edge."""
  names = ["legw", "zaremba_recipe_uniform_init", "decay_from_10_clip_0.25", "no_warmup"]
  table = _table(metric="perplexity", title="PTB LSTM at B=640 with LEGW: what the paper leaves open, one setting "
                 "at a time (valid split)", rows=[{"name": n, "tests": "t"} for n in names])
  results = [runner.RunRow(n, 0, "valid", "perplexity", v, "done", 1.0, 1.0, 13.0, 936, 1.0)
             for n, v in zip(names, (163.3, 682.2, 133.7, 3789.4))]
  figure = _figure_of(monkeypatch, table, results, tmp_path)
  axes = figure.axes[0]
  labels = [t for t in axes.get_xticklabels() if t.get_text()]
  assert 2 <= len(labels) <= variant_table.MAX_LOG_TICKS
  boxes = sorted((t.get_window_extent() for t in labels), key=lambda box: box.x0)
  assert all(left.x1 < right.x0 for left, right in zip(boxes, boxes[1:])), [t.get_text() for t in labels]
  title, frame = axes.title.get_window_extent(), figure.bbox
  assert frame.x0 <= title.x0 and title.x1 <= frame.x1 and title.y1 <= frame.y1


def test_replot_rewrites_the_page_and_plot_from_the_csv_alone(finished_table, tmp_path):
  """The CSV, the record of the runs, is not rewritten: not even a CSV from before the device and
  batch-size columns, whose line ends are CRLF (once `--replot` added `batch_size` 0 to every line)."""
  table, out, _, _ = finished_table
  copy = tmp_path / "copy"
  lines = out.with_suffix(".csv").read_text().splitlines()
  older = [",".join(line.split(",")[:len(variant_table.CSV_FIELDS) - 2]) for line in lines]
  copy.with_suffix(".csv").write_bytes("\r\n".join(older).encode() + b"\r\n")
  recorded = copy.with_suffix(".csv").read_bytes()
  expected = variant_table.read_results(copy.with_suffix(".csv"))
  assert {r.batch_size for r in expected} == {None} and {r.device for r in expected} == {""}
  assert variant_table.replot(table, copy) == expected
  assert copy.with_suffix(".csv").read_bytes() == recorded
  assert copy.with_suffix(".md").read_text() == variant_table.markdown(table, expected)
  assert copy.with_suffix(".png").stat().st_size > 0
  with pytest.raises(SystemExit) as exit_info:  # nothing recorded: a message, exit 2
    variant_table.main([str(TABLES / "ptb_lstm_headline.json"), "--out", str(tmp_path / "none"), "--replot"])
  assert exit_info.value.code == 2



def test_replot_refuses_the_flags_of_a_run(capsys, tmp_path):
  with pytest.raises(SystemExit) as exit_info:
    variant_table.main([str(TABLES / "ptb_lstm_headline.json"), "--out", str(tmp_path / "t"), "--replot", "--rows",
                        "baseline_b20", "--workdir", str(tmp_path)])
  assert exit_info.value.code == 2 and "runs nothing: drop --workdir, --rows." in capsys.readouterr().err


def test_series_without_x_or_axis_label_is_refused():
  with pytest.raises(ValueError, match="a line plot needs 'series' and 'x' on every row"):
    _table(rows=[{"name": "a", "tests": "t", "series": "s", "x": 32}])
  with pytest.raises(ValueError, match="'x' a number > 0"):
    _table(x_label="batch", rows=[{"name": "a", "tests": "t", "series": "s", "x": -1}])


def test_a_run_another_process_holds_is_skipped_and_left_to_it(tmp_path):
  table = _table()
  runs = tmp_path / "runs"
  held = WorkdirLock(runs / "lr_0.2_s0")  # this process is alive: the lock is not stale
  (runs / "lr_0.2_s0").mkdir(parents=True)
  held.acquire()
  try:
    results = variant_table.run_table(table, str(tmp_path / "t"), str(runs))
  finally:
    held.release()
  assert sorted(r.name for r in results) == ["base", "legw"]
  assert sorted(r.name for r in variant_table.read_results(tmp_path / "t.csv")) == ["base", "legw"]


def test_processes_sharing_a_table_train_each_run_once(tmp_path):
  path = tmp_path / "table.json"
  path.write_text(json.dumps({"title": "tiny", "config": TINY_CONFIG + ":batch=64", "seeds": [0, 1, 2],
                              "rows": [{"name": "base", "tests": "t"},
                                       {"name": "lr_0.2", "variant": "lr=0.2", "tests": "t"}]}))
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "1"}
  env.pop("XLA_FLAGS", None)
  command = [sys.executable, "-m", "experiments.variant_table", str(path), "--out", str(tmp_path / "out" / "t"),
             "--workdir", str(tmp_path / "runs")]
  workers = [subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for _ in range(2)]
  outputs = [w.communicate(timeout=600)[0] for w in workers]
  assert [w.returncode for w in workers] == [0, 0], outputs
  trained = [line.split(":")[0] for output in outputs for line in output.splitlines()
             if line.startswith("[variant_table] ") and "accuracy=" in line]
  runs = {(n, s) for n in ("base", "lr_0.2") for s in (0, 1, 2)}
  assert sorted(trained) == sorted(f"[variant_table] {n} seed={s}" for n, s in runs)  # each once, in all
  assert {(r.name, r.seed) for r in variant_table.read_results(tmp_path / "out" / "t.csv")} == runs
  assert len(variant_table.read_results(tmp_path / "out" / "t.csv")) == len(runs)


def test_dry_run_prints_what_each_run_would_train_and_creates_nothing(tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(train, "train_and_evaluate", lambda *a, **k: pytest.fail("trained"))
  path = tmp_path / "t.json"
  path.write_text(json.dumps({"title": "tiny", "config": TINY_CONFIG + ":batch=64", "seeds": [0, 1], "rows": [
      {"name": "base", "tests": "the config"}, {"name": "legw", "variant": "rule=legw", "tests": "LEGW"}]}))
  workdir = tmp_path / "runs"
  assert variant_table.main([str(path), "--out", str(tmp_path / "out" / "t"), "--workdir", str(workdir), "--rows",
                             "legw", "--dry-run"]) == []
  assert capsys.readouterr().out.splitlines() == [
      f"[variant_table] 2 runs (1 rows x 2 seeds): 0 recorded in {tmp_path / 'out' / 't.csv'} (skipped), 2 to run.",
      *(f"[variant_table]   legw seed={seed}: batch 64, peak LR 0.0707107, warm-up 0.25 epochs, 1 epochs, test split; "
        f"{workdir / f'legw_s{seed}'}: new" for seed in (0, 1))]
  assert not workdir.exists() and not (tmp_path / "out").exists()
