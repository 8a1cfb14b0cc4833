"""experiments.by_epoch: eval curves of several runs side by side."""

import json

import pytest

from experiments import by_epoch


def _write_run(workdir, evals, final):
  workdir.mkdir()
  with open(workdir / "metrics.jsonl", "w") as f:
    for i, (epoch, value) in enumerate(evals):
      record = {"kind": "eval", "step": 10 * (i + 1), "epoch": epoch, "perplexity": value, "loss": 1.0}
      if final and i == len(evals) - 1:
        record["final"] = True
      f.write(json.dumps(record) + "\n")
    f.write(json.dumps({"kind": "train", "step": 5, "loss": 9.0}) + "\n")


def test_runs_become_columns_and_unfinished_runs_are_marked(tmp_path):
  _write_run(tmp_path / "a", [(1.0, 212.4), (2.0, 159.5)], final=True)
  _write_run(tmp_path / "b", [(1.0, 804.2)], final=False)
  out = tmp_path / "out" / "table"
  by_epoch.main(["--metric", "perplexity", "--out", str(out), "--title", "T",
                 "--run", f"base={tmp_path / 'a'}", "--run", f"legw={tmp_path / 'b'}"])
  assert (out.with_suffix(".csv")).read_text().splitlines() == ["epoch,base,legw", "1,212.4,804.2", "2,159.5,"]
  markdown = out.with_suffix(".md").read_text()
  assert "| epoch | base | legw (unfinished) |" in markdown
  assert "| 2 | 159.50 | – |" in markdown


def test_the_page_names_the_split_the_runs_evaluated(tmp_path):
  """From each run's config.json: a validation run's curve is not called a test curve (it always was)."""
  from tests.train import helpers  # pylint: disable=import-outside-toplevel
  config = helpers.tiny_classifier_config()
  config.data_options.eval_split = "validation"
  _write_run(tmp_path / "a", [(1.0, 212.4)], final=True)
  (tmp_path / "a" / "config.json").write_text(json.dumps({"config": json.loads(config.to_json())}))
  by_epoch.main(["--metric", "perplexity", "--out", str(tmp_path / "t"), "--run", f"a={tmp_path / 'a'}"])
  assert "Validation perplexity after each evaluated epoch" in (tmp_path / "t.md").read_text()
  _write_run(tmp_path / "b", [(1.0, 212.4)], final=True)  # no config.json
  by_epoch.main(["--metric", "perplexity", "--out", str(tmp_path / "u"), "--run", f"b={tmp_path / 'b'}"])
  assert "Evaluation perplexity after each evaluated epoch" in (tmp_path / "u.md").read_text()


def test_bad_requests_are_refused_before_reading(tmp_path):
  with pytest.raises(ValueError, match="no runs given"):
    by_epoch.curves([], "perplexity")
  with pytest.raises(ValueError, match="labels must be distinct"):
    by_epoch.curves([("x", "a"), ("x", "b")], "perplexity")
  with pytest.raises(ValueError, match="metric must be one of"):
    by_epoch.curves([("x", "a")], "bleu")
  _write_run(tmp_path / "a", [(1.0, 212.4)], final=True)
  with pytest.raises(ValueError, match="have no 'accuracy'"):
    by_epoch.curves([("x", str(tmp_path / "a"))], "accuracy")
  with pytest.raises(SystemExit):
    by_epoch.main(["--out", str(tmp_path / "o"), "--run", "no-equals-sign"])


def test_the_command_ends_a_bad_request_with_the_message_and_status_2(tmp_path, capsys):
  _write_run(tmp_path / "a", [(1.0, 212.4)], final=True)
  for argv, message in ((["--out", str(tmp_path / "o")], "no runs given"),
                        (["--out", str(tmp_path / "o"), "--run", f"x={tmp_path / 'a'}"], "have no 'accuracy'")):
    with pytest.raises(SystemExit) as stop:
      by_epoch.main(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err
