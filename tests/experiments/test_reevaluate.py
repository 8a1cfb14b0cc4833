"""`experiments.reevaluate`: a variant table's trained runs evaluated again under other settings (the PTB
evaluation protocols), from their final parameters, resumably."""

import pathlib
import shutil

import pytest

from experiments import reevaluate
from experiments import run_records
from experiments import variant_table

TINY_PTB = str(pathlib.Path(__file__).with_name("tiny_ptb_config.py"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  tmp_path = tmp_path_factory.mktemp("reevaluate")
  table = variant_table.parse_table({"title": "tiny PTB", "config": TINY_PTB, "metric": "perplexity", "seeds": [0],
                                     "rows": [{"name": "base", "tests": "the config"}]})
  variant_table.run_table(table, str(tmp_path / "table"), str(tmp_path / "runs"))
  return table, tmp_path


def test_same_settings_reproduce_the_trained_metric_and_the_stream_protocol_differs(trained):
  table, tmp_path = trained
  out = tmp_path / "table"
  same = reevaluate.reevaluate(table, tmp_path / "runs", out, "same", ["eval_batch_size=16"])
  assert same[0].value == pytest.approx(same[0].trained_value, rel=1e-6)  # the final parameters, loaded
  both = reevaluate.reevaluate(table, tmp_path / "runs", out, "stream",
                               ["data_options.eval_protocol=stream", "eval_batch_size=8"])
  stream = [e for e in both if e.label == "stream"]
  assert len(both) == 2 and len(stream) == 1
  assert stream[0].value != pytest.approx(stream[0].trained_value, rel=1e-4)
  assert run_records.read_evaluations(out) == both
  page = out.with_suffix(".md").read_text()
  assert page.startswith("# tiny PTB") and "## Evaluated again" in page
  assert "`stream`: `data_options.eval_protocol=stream eval_batch_size=8`" in page
  variant_table.replot(table, out)  # the table's own page keeps them
  assert out.with_suffix(".md").read_text() == page


def test_recorded_runs_are_not_evaluated_again(trained, monkeypatch):
  table, tmp_path = trained
  out = tmp_path / "resume"
  out.with_suffix(".csv").write_text((tmp_path / "table.csv").read_text())
  first = reevaluate.reevaluate(table, tmp_path / "runs", out, "stream", ["data_options.eval_protocol=stream"])
  monkeypatch.setattr(reevaluate, "evaluate_run", lambda *args: pytest.fail("evaluated a recorded run again"))
  assert reevaluate.reevaluate(table, tmp_path / "runs", out, "stream",
                               ["data_options.eval_protocol=stream"]) == first


def test_the_seeds_the_table_s_csv_records_are_evaluated_not_only_the_table_file_s(trained):
  """A table trained with `--seeds 0,1` over a table file of seeds [0]: both runs are evaluated again (seed 1
  was dropped from the section without a word)."""
  table, tmp_path = trained
  out, runs = tmp_path / "seeds", tmp_path / "runs_seeds"
  shutil.copytree(tmp_path / "runs" / "base_s0", runs / "base_s0")
  shutil.copytree(tmp_path / "runs" / "base_s0", runs / "base_s1")
  lines = (tmp_path / "table.csv").read_text().splitlines()
  header = lines[0].split(",")
  seed_one = [",".join("1" if field == "seed" else value for field, value in zip(header, line.split(",")))
              for line in lines[1:]]
  out.with_suffix(".csv").write_text("\n".join(lines + seed_one) + "\n")
  evaluated = reevaluate.reevaluate(table, runs, out, "same", ["eval_batch_size=16"])
  assert sorted(e.seed for e in evaluated) == [0, 1]


def test_no_table_results_no_finished_run_and_missing_settings_exit_2_with_a_message(trained, tmp_path, capsys):
  table_file = str(pathlib.Path(variant_table.__file__).with_name("tables") / "ptb_lstm_headline.json")
  arguments = ["--workdir", str(tmp_path / "empty"), "--label", "stream", "--set", "data_options.eval_protocol=stream"]
  with pytest.raises(SystemExit) as exit_info:
    reevaluate.main([table_file, "--out", str(tmp_path / "o"), *arguments])
  assert exit_info.value.code == 2
  assert "--out is the table's results prefix" in capsys.readouterr().err
  (tmp_path / "o.csv").write_text((trained[1] / "table.csv").read_text())
  with pytest.raises(SystemExit) as exit_info:
    reevaluate.main([table_file, "--out", str(tmp_path / "o"), *arguments])
  assert exit_info.value.code == 2
  assert "no finished run of the table" in capsys.readouterr().err
  with pytest.raises(SystemExit) as exit_info:
    reevaluate.main(["t.json", "--workdir", "w", "--out", "o", "--label", "stream"])
  assert exit_info.value.code == 2
