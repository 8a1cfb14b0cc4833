"""experiments/tpu_pod_plan.py: resumes from its JSON, renders entries not yet compiled, calibrates by the
published v3-8 time. (Compiling the entries needs libtpu and minutes per pod entry: not run here.)"""

import json

import pytest

from experiments import tpu_pod_plan


def test_the_calibration_is_the_published_step_over_xlas_estimate():
  steps = 90 * (tpu_pod_plan.IMAGENET_TRAIN // 1024)
  published_step = tpu_pod_plan.PUBLISHED_V3_8_RN50_SECONDS / steps
  results = {"calibration": {"estimated_step_seconds": published_step / 2}}
  assert abs(tpu_pod_plan.calibration_factor(results) - 2.0) < 1e-12
  assert tpu_pod_plan.calibration_factor({}) is None


def test_a_rerun_compiles_only_what_its_json_lacks(tmp_path, monkeypatch):
  compiled = []
  done = {e.key: {"placeholder": True} for e in tpu_pod_plan.ENTRIES if e.key != "mnist_lstm_8k"}
  (tmp_path / "plan.json").write_text(json.dumps(done))
  monkeypatch.setattr(tpu_pod_plan, "compile_entry", lambda entry: compiled.append(entry.key) or {"key": entry.key})
  monkeypatch.setattr(tpu_pod_plan, "render", lambda results, command: f"{len(results)} entries\n")
  tpu_pod_plan.main(["--out", str(tmp_path / "plan")])
  assert compiled == ["mnist_lstm_8k"]
  assert len(json.loads((tmp_path / "plan.json").read_text())) == len(tpu_pod_plan.ENTRIES)


def test_entries_not_compiled_yet_are_listed_with_their_record():
  text = tpu_pod_plan.render({}, "python -m experiments.tpu_pod_plan")
  for entry in tpu_pod_plan.ENTRIES:
    assert f"| {entry.key} | `" in text
  assert text.count(" | not compiled yet |") == len(tpu_pod_plan.ENTRIES)
  assert "The calibration entry is not compiled yet." in text


def test_render_only_refuses_only_which_it_would_not_compile(tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(tpu_pod_plan, "compile_entry", lambda entry: pytest.fail("compiled"))
  with pytest.raises(SystemExit) as exit_info:
    tpu_pod_plan.main(["--out", str(tmp_path / "plan"), "--render-only", "--only", "mnist_lstm_8k"])
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and "compiles nothing: drop --only" in err and "Traceback" not in err
  assert not (tmp_path / "plan.md").exists()


def test_render_only_without_the_json_names_it_and_the_command_that_writes_it(tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(tpu_pod_plan, "compile_entry", lambda entry: pytest.fail("compiled"))
  out = tmp_path / "o" / "tp"
  with pytest.raises(SystemExit) as exit_info:
    tpu_pod_plan.main(["--out", str(out), "--render-only"])
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and "Traceback" not in err
  assert (f"python -m experiments.tpu_pod_plan: error: --render-only renders {out}.md from {out}.json, which does "
          f"not exist: compile the entries into it first with `python -m experiments.tpu_pod_plan --out {out}` "
          "(needs libtpu).") in err
  assert not (tmp_path / "o").exists()


def test_a_refused_entry_shows_at_least_the_compilers_figure_for_its_memory():
  """The compile.json of a train step the compiler refused beside a small eval step: its memory is the compiler's
  figure, a lower bound (the column showed the eval step's 0.00 GiB)."""
  step = {"step": "train", "memory": {"parameters": 2**20}, "estimated_epoch_seconds": None}
  refused = {"key": "mnist_lstm_8k", "config": "mnist_lstm", "devices": 4, "device_kind": "TPU v5", "mesh": {"data": 4},
             "fits": False, "memory_per_device_bytes": 63 * 2**30, "memory_per_device_is_lower_bound": True,
             "hbm_bytes": 16 * 2**30, "collective_bytes": {"all-reduce": 0}, "flops_per_step": None,
             "estimated_step_seconds": None, "estimated_recipe_seconds": None, "epochs": 25.0, "steps": [step],
             "wall_seconds": 1.0, "lines": []}
  text = tpu_pod_plan.render({"mnist_lstm_8k": refused}, "python -m experiments.tpu_pod_plan")
  assert "| **no** | ≥ 63.00 of 16.00 |" in text
  unknown = dict(refused, memory_per_device_bytes=None)
  assert "| **no** | ? of 16.00 |" in tpu_pod_plan.render({"mnist_lstm_8k": unknown}, "")
