"""The end-to-end benchmark's data: ImageNet-like JPEGs as a TFDS imagenet2012 that lbjax's ImageNet stream reads."""

import argparse
import json
import os
import sys

import pytest

pytest.importorskip("tensorflow_datasets")
pytest.importorskip("cv2")

from benchmarks import resnet50_end_to_end  # pylint: disable=wrong-import-position
from lbjax.data import imagenet  # pylint: disable=wrong-import-position
from lbjax.train import datasets  # pylint: disable=wrong-import-position


def test_the_written_dataset_is_read_by_the_imagenet_stream_and_written_once(tmp_path):
  sizes = {"train_images": 12, "distinct_images": 4, "validation_images": 3}
  assert resnet50_end_to_end.write_imagenet_like(tmp_path, **sizes) > 0
  assert resnet50_end_to_end.write_imagenet_like(tmp_path, **sizes) == 0.0  # the same recipe: kept
  dataset = datasets.imagenet(tmp_path, image_size=32)
  assert dataset.fingerprint["train"].endswith("(12 rows)") and dataset.fingerprint["eval"].endswith("(3 rows)")
  stream = imagenet.imagenet_train_stream(data_dir=tmp_path, image_size=32, seed=0, num_threads=1)
  batch = stream.next_batch(12)
  assert batch["images"].shape == (12, 32, 32, 3) and sorted(batch["labels"]) == list(range(12))
  raw = imagenet.TfdsSource("imagenet2012", split="train", data_dir=tmp_path, encoded_features=("image",))
  assert raw.take([0])["image"][0] == raw.take([4])["image"][0]  # records cycle through the distinct JPEGs


def test_the_table_names_each_row_s_command_and_groups_the_machines(tmp_path, capsys):
  common = {"device": "NVIDIA H200", "jax": "0.11.2", "cpu_count": 16, "decode_workers": 14, "max_device_batch": 0,
            "image_size": 224, "dry_run": False, "step_ms": "40.0 [40.0, 40.0]"}
  rows = [{**common, "batch_per_device": 256, "xla_flags": "default", "overrides": [],
           "measured_at": "2026-11-27 08:45 UTC", "step_images_per_second": 6400.0,
           "loop_images_per_second": 6080.0, "fraction_of_step": 0.95,
           "lars_over_momentum": "1.003 [1.003, 1.005]", "lars_flat_over_momentum": "1.005 [1.004, 1.007]"},
          {**common, "batch_per_device": 384, "xla_flags": "latency_hiding", "max_device_batch": 128,
           "overrides": ["--config.deterministic=True"], "measured_at": "2026-11-27 08:49 UTC",
           "step_images_per_second": 4500.0},
          {**common, "batch_per_device": 256, "xla_flags": "default", "overrides": [],
           "measured_at": "2026-11-28 08:45 UTC", "commit": "abc1234", "step_images_per_second": 6500.0,
           "lars_xla_layouts_over_lars": "0.980 [0.975, 0.985]", "jax_relu_over_lars": "1.020 [1.010, 1.030]",
           "step_trace": {"steps": 5, "device_busy_fraction": 0.912, "top_kernels": []}},
          {**common, "dry_run": True, "batch_per_device": 8, "xla_flags": "default", "overrides": [],
           "measured_at": "2026-11-27 09:00 UTC", "step_images_per_second": 1.0}]
  results = tmp_path / "e2e.jsonl"
  results.write_text("".join(json.dumps(row) + "\n" for row in rows))
  resnet50_end_to_end.write_table(results, no_readme=True)
  body = capsys.readouterr().out
  assert ("--batch-per-device 256 --decode-workers 14 --xla-flags default --compare-momentum\n" in body
          and "--batch-per-device 384 --decode-workers 14 --xla-flags latency_hiding --max-device-batch 128 "
              "--override=--config.deterministic=True --step-only\n" in body)
  assert ("--batch-per-device 256 --decode-workers 14 --xla-flags default --compare-state-layouts --compare-jax-relu "
          "--step-only --trace-steps 5\n" in body)
  assert ("Machines: 1 x NVIDIA H200, jax 0.11.2, 16 CPU cores (2026-11-27 08:45 UTC, 2026-11-27 08:49 UTC, "
          "2026-11-28 08:45 UTC)\n" in body)
  assert "| 6,400 | 6,080 | 0.950 | 1.003 [1.003, 1.005] | 1.005 [1.004, 1.007] |  |  |" in body
  assert "| 6,500 | (step only) |  |  |  | 0.980 [0.975, 0.985] | 1.020 [1.010, 1.030] | 91% |" in body
  assert "| 4,500 | (step only) |" in body and "--batch-per-device 8 " not in body  # the dry run is left out
  # Rows of one command measured on other dates (other code) are told apart: the date, and the commit where recorded.
  assert "| NVIDIA H200 | 2026-11-27 | 256 |" in body and "| NVIDIA H200 | 2026-11-28 (abc1234) | 256 |" in body


def test_a_missing_results_file_for_the_table_is_named_without_a_traceback(tmp_path):
  with pytest.raises(SystemExit, match="no such file; --table reads a results file that --results wrote"):
    resnet50_end_to_end.write_table(tmp_path / "missing.jsonl", no_readme=True)


@pytest.mark.parametrize("flags, message", [
    (["--table", "e2e.jsonl", "--batch-per-device", "128", "--step-only"],
     "--table writes the README section from a results file and measures nothing: drop --batch-per-device, "
     "--step-only, or run the measurement as a command of its own."),
    (["--no-readme"], "--no-readme goes with --table: a measurement writes no README section"),
    (["--dry-run", "--batch-per-device", "64", "--windows", "3"],
     "--dry-run measures at its own tiny sizes: drop --batch-per-device, --windows, or drop --dry-run"),
])
def test_a_flag_the_mode_would_ignore_or_replace_is_refused_before_anything_runs(monkeypatch, capsys, flags, message):
  monkeypatch.setattr(resnet50_end_to_end.signal, "signal", lambda *a: None)  # the SIGTERM handler: not in pytest
  monkeypatch.setattr(resnet50_end_to_end, "measure", lambda args: pytest.fail("measured"))
  monkeypatch.setattr(resnet50_end_to_end, "write_table", lambda *a: pytest.fail("table written"))
  monkeypatch.setattr(sys, "argv", ["resnet50_end_to_end", *flags])
  with pytest.raises(SystemExit) as exit_info:
    resnet50_end_to_end.main()
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and message in err and "Traceback" not in err


def test_a_native_abort_keeps_its_check_message_ahead_of_the_stack_trace():
  """XLA's `F... Check failed` line comes before thousands of characters of stack trace: the error shows it."""
  stderr = ("W1128 03:21:00 some warning\nF1128 03:21:07.1 gemm_fusion.cc:123] Check failed: dot is supported\n"
            + "    @     0x7fcf  xla::HloInstruction::Accept<>()\n" * 200)
  shown = resnet50_end_to_end._failure_of(stderr)
  assert shown.startswith("(fatal lines)\nF1128 03:21:07.1 gemm_fusion.cc:123] Check failed: dot is supported\n")
  assert shown.endswith(stderr[-3000:]) and "some warning" not in shown.split("(the end of stderr)")[0]
  assert resnet50_end_to_end._failure_of("plain\ntail") == "plain\ntail"



@pytest.mark.parametrize("text, message", [
    ("a,b\n1,2\n", "e2e.csv, line 1 is not JSON (Expecting value): 'a,b'. --table reads a results file that --results "
                   "wrote, one JSON row a line"),
    ('{"device": "NVIDIA H200"}\n\n[1, 2]\n', "e2e.csv, line 1 is not a row that --results wrote: it lacks jax, "
                                              "cpu_count, measured_at,"),
])
def test_a_results_file_line_that_is_not_a_row_is_named_without_a_traceback(tmp_path, text, message):
  results = tmp_path / "e2e.csv"
  results.write_text(text)
  with pytest.raises(SystemExit) as exit_info:
    resnet50_end_to_end.write_table(results, no_readme=True)
  assert message in str(exit_info.value.code)


def _main(monkeypatch, flags):
  monkeypatch.setattr(resnet50_end_to_end.signal, "signal", lambda *a: None)  # the SIGTERM handler: not in pytest
  monkeypatch.setattr(sys, "argv", ["resnet50_end_to_end", *flags])
  resnet50_end_to_end.main()


@pytest.mark.parametrize("override, message", [
    ("--config.num_stepz=1", "--config.num_stepz: config has no field 'num_stepz'. Did you mean 'num_steps'?"),
    ("--config.lr.base=abc", "--config.lr.base='abc': expected float."),
])
def test_an_override_the_run_would_refuse_is_refused_before_any_data_is_written(monkeypatch, capsys, override,
                                                                                 message):
  monkeypatch.setattr(resnet50_end_to_end, "write_imagenet_like", lambda *a, **k: pytest.fail("data written"))
  monkeypatch.setattr(resnet50_end_to_end, "_subprocess_step", lambda *a: pytest.fail("the step process started"))
  with pytest.raises(SystemExit) as exit_info:
    _main(monkeypatch, ["--dry-run", f"--override={override}"])
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and "Traceback" not in err
  assert ("the step and the trainer would refuse their config (resnet50_imagenet:batch=8 with this command's sizes "
          "and --override values); nothing was built or run." in err and message in err)


def test_the_dry_run_s_own_config_and_a_sound_override_pass_the_check(monkeypatch):
  measured = []
  monkeypatch.setattr(resnet50_end_to_end, "measure", lambda args: measured.append(args) or {})
  _main(monkeypatch, ["--dry-run", "--step-only", "--override=--config.num_steps=3"])
  assert measured[0].override == ["--config.num_steps=3"]


def test_a_work_root_that_does_not_exist_yet_is_created_before_anything_runs(monkeypatch, tmp_path):
  """`--work-root` may name a new folder (`paths_problem` accepts one it can create): the trace folder and the
  loop's workdir are made in it with `tempfile.mkdtemp`, which creates no parents."""
  work_root = tmp_path / "new" / "work"
  monkeypatch.setattr(resnet50_end_to_end, "measure", lambda args: {} if work_root.is_dir() else pytest.fail("none"))
  _main(monkeypatch, ["--dry-run", "--step-only", f"--work-root={work_root}"])


def test_a_failed_step_process_reports_its_error_without_a_traceback(tmp_path):
  """A config only the step process refuses (the check above resolves the parent's overrides first): its message
  ends this process, not a nested RuntimeError traceback."""
  args = argparse.Namespace(rounds=1, step_repeats=1, compare_momentum=False, compare_state_layouts=False,
                            compare_jax_relu=False, trace_steps=0, batch_per_device=8, work_root=str(tmp_path),
                            step_timeout=300.0)
  with pytest.raises(SystemExit) as exit_info:
    resnet50_end_to_end._subprocess_step(args, "resnet50_imagenet:batch=8", ["--config.num_stepz=1"],
                                         dict(os.environ))
  shown = str(exit_info.value.code)
  assert shown.startswith("The step process failed (status 2):\n")
  assert "the step process: --config.num_stepz: config has no field 'num_stepz'" in shown and "Traceback" not in shown


@pytest.mark.parametrize("flag, where, message", [
    ("--data-dir", "{file}/data", "--data-dir '{file}/data' cannot be used as a folder: '{file}' is a file. Name a "
                                  "folder this process can create and write."),
    ("--work-root", "{file}", "--work-root '{file}' cannot be used as a folder: '{file}' is a file."),
    ("--compilation-cache", "{link}/cache", "--compilation-cache '{link}/cache' cannot be used as a folder: '{link}' "
                                            "is a link to"),
    ("--results", "{tmp}", "--results '{tmp}' is a directory; --results names the file each row is appended to, e.g. "
                           "'{tmp}/rows.jsonl'."),
    ("--results", "{file}/rows.jsonl", "--results '{file}/rows.jsonl': '{file}' is a file. Name a file in a folder "
                                       "this process can write."),
])
def test_a_folder_or_results_file_it_could_not_write_is_refused_before_any_data_is_written(
    monkeypatch, capsys, tmp_path, flag, where, message):
  places = {"file": tmp_path / "a_file", "link": tmp_path / "dangling", "tmp": tmp_path}
  places["file"].write_text("")
  places["link"].symlink_to(tmp_path / "gone")
  monkeypatch.setattr(resnet50_end_to_end, "write_imagenet_like", lambda *a, **k: pytest.fail("data written"))
  monkeypatch.setattr(resnet50_end_to_end, "config_problem", lambda args: pytest.fail("config checked first"))
  with pytest.raises(SystemExit) as exit_info:
    _main(monkeypatch, ["--dry-run", flag, where.format(**places)])
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and "Traceback" not in err and message.format(**places) in err


def test_the_results_file_s_new_folder_is_made_when_the_row_is_written(monkeypatch, tmp_path):
  results = tmp_path / "new" / "folder" / "rows.jsonl"
  monkeypatch.setattr(resnet50_end_to_end, "write_imagenet_like", lambda *a, **k: 0.0)
  monkeypatch.setattr(resnet50_end_to_end, "_subprocess_step", lambda *a: {
      "device": "cpu", "jax": "0", "step_seconds": {"lars": 0.5}, "step_seconds_quartiles": {"lars": [1, 2, 3]}})
  _main(monkeypatch, ["--dry-run", "--step-only", "--results", str(results), "--data-dir", str(tmp_path / "data")])
  assert json.loads(results.read_text())["step_images_per_second"] == 16.0
