"""experiments/model_parallel_layouts.py at tiny sizes (V = 64, D = H = 8, batch 16 x 4, 2 steps) on the
8 simulated devices of tests/conftest.py: every layout of its table computes what the one-device run
computes (the same loss, parameters up to float rounding), the byte and parameter columns count what
each layout sends and holds, and the markdown has a row per layout and the command that gives it."""

import pytest

from experiments import model_parallel_layouts

VOCAB, WIDTH = 64, 8
ARGV = ["--steps", "1", "--repeats", "1", "--batch_size", "16", "--seq_len", "4", "--vocab", str(VOCAB),
        "--width", str(WIDTH)]
MODEL_SIZES = {"data 4 x model 2": 2, "data 2 x model 4": 4, "data 1 x model 8": 8}


@pytest.fixture(scope="module")
def table(tmp_path_factory):
  out = tmp_path_factory.mktemp("model_parallel_layouts") / "table"
  rows = model_parallel_layouts.main([*ARGV, "--out", str(out)])
  return {r["layout"]: r for r in rows}, out.with_suffix(".md").read_text()


def test_every_layout_trains_to_the_one_device_loss_and_parameters(table):
  rows, _ = table
  assert list(rows) == list(model_parallel_layouts.LAYOUTS)
  single = rows["1 device"]
  assert single["max_rel_diff"] == 0
  for name, row in rows.items():
    assert row["loss"] == pytest.approx(single["loss"], rel=1e-5), name
    assert row["max_rel_diff"] < 1e-5, name


def test_bytes_and_parameters_per_device_follow_the_layout(table):
  rows, _ = table
  assert rows["1 device"]["sent_mb"] == 0
  assert all(r["sent_mb"] > 0 for name, r in rows.items() if name != "1 device")
  total = rows["1 device"]["parameters_per_device"]
  vocabulary_parameters = VOCAB * WIDTH + WIDTH * VOCAB + VOCAB  # embedding, softmax kernel and bias
  for name, row in rows.items():
    model = MODEL_SIZES.get(name, 1)  # stages hold the whole model: the pipeline replicates its stack
    assert row["parameters_per_device"] == total - vocabulary_parameters + vocabulary_parameters // model, name


def test_the_markdown_has_a_row_per_layout_and_the_command(table):
  rows, markdown = table
  assert "PtbLSTM (V = 64, D = H = 8, 2 layers), synthetic PTB, global batch 16 x 4, momentum SGD at LR 1, 2 steps" \
      in markdown
  command = markdown.split("```\n")[1].strip()
  assert command.startswith("JAX_NUM_CPU_DEVICES=8 python -m experiments.model_parallel_layouts " + " ".join(ARGV))
  table_rows = [line for line in markdown.splitlines() if line.startswith("| ") and "layout" not in line]
  assert [line.split(" | ")[0][2:] for line in table_rows] == list(rows)
  for line, row in zip(table_rows, rows.values()):
    assert f"| {row['loss']:.6f} | {row['max_rel_diff']:.1e} |" in line


def test_steps_repeats_or_sequence_length_below_1_are_a_usage_error(tmp_path, capsys):
  with pytest.raises(SystemExit) as stop:
    model_parallel_layouts.main([*ARGV, "--steps", "0", "--seq_len", "0", "--out", str(tmp_path / "table")])
  assert stop.value.code == 2 and "argument --steps: must be an integer >= 1, got 0" in capsys.readouterr().err
