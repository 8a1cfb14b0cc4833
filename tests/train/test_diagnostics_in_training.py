"""papers/001 §4, papers/003 §3 and McCandlish et al. as trainer options."""

import csv
import json
import pathlib

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lbjax import config_files
from lbjax import diagnostics
from lbjax import main
from lbjax.train import layer_table
from lbjax.train import ConfigError
from lbjax.train import train_and_evaluate
from lbjax.train.datasets import Dataset
from lbjax.train.run import Run
from lbjax.train.tasks import ClassificationTask
from tests.train import helpers


def _records(workdir, kind):
  with open(workdir / "metrics.jsonl") as f:
    return [r for r in map(json.loads, f) if r["kind"] == kind]


def test_accumulating_step_logs_the_gradient_noise_scale(tmp_path):
  train_and_evaluate(helpers.tiny_classifier_config(batch_size=64, max_device_batch=2), tmp_path)
  records = _records(tmp_path, "train")
  assert records and all("gradient_noise_scale" in r for r in records)
  assert all(r["noise_scale_trace_sigma"] > 0 for r in records)  # micro-batch gradients are noisier


def test_a_log_window_across_a_change_to_one_micro_batch_averages_the_noise_scale_over_the_steps_with_it(tmp_path):
  """Batch 64 (2 micro-batches of 4 per device) for 2 steps, then 16 (one micro-batch, no noise-scale
  ingredients) for 8: the first window of 4 steps mixes both kinds."""
  config = helpers.tiny_classifier_config(batch_sizes=(64, 16), batch_size_boundaries=(0.5,), max_device_batch=4)
  train_and_evaluate(config, tmp_path)
  records = _records(tmp_path, "train")
  assert [(r["step"], r["batch_size"]) for r in records] == [(4, 16), (8, 16), (10, 16)]
  assert "gradient_noise_scale" in records[0] and records[0]["noise_scale_trace_sigma"] > 0
  assert not any("gradient_noise_scale" in r for r in records[1:])


def test_lipschitz_estimate_is_logged_every_n_steps(tmp_path):
  config = helpers.tiny_classifier_config(**{"diagnostics.lipschitz_every": 2, "diagnostics.lipschitz_batch_size": 32})
  train_and_evaluate(config, tmp_path)
  records = _records(tmp_path, "lipschitz")
  assert [r["step"] for r in records] == [2, 4, 6, 8]
  assert all(np.isfinite(r["lipschitz"]) and r["lipschitz"] >= 0 for r in records)


def test_a_lipschitz_batch_larger_than_the_real_examples_of_the_first_eval_batch_is_refused(tmp_path):
  """16 evaluation examples in a batch of 32: 16 rows would be padding (copies of the last example) taken
  for data; it was estimated on them without a word."""
  config = helpers.tiny_classifier_config(**{"diagnostics.lipschitz_every": 2, "diagnostics.lipschitz_batch_size": 32,
                                             "data_options.num_eval_examples": 16})
  with pytest.raises(ConfigError, match=r"lipschitz_batch_size=32: the evaluation split's first batch holds 16 real "
                                        r"examples.*Use at most 16"):
    train_and_evaluate(config, tmp_path)


def test_a_lipschitz_batch_of_a_token_stream_evaluation_counts_its_rows_not_its_tokens(tmp_path):
  """PTB's stream evaluation holds the split in row 0 of each batch; the other rows are padding. The check summed
  the token mask (hundreds of tokens) and took 7 empty rows of 8 for data."""
  config = helpers.tiny_language_model_config(**{
      "diagnostics.lipschitz_every": 2, "diagnostics.lipschitz_batch_size": 8, "eval_batch_size": 8,
      "data_options.eval_protocol": "stream"})
  with pytest.raises(ConfigError, match=r"lipschitz_batch_size=8: the evaluation split's first batch holds 1 real "
                                        r"examples.*Use at most 1"):
    train_and_evaluate(config, tmp_path)


def test_lipschitz_estimate_of_a_language_model(tmp_path):
  """The probe's batch is a constant of its jitted function: the PTB model's check of the token range
  evaluates on it (JAX hoists such constants into the trace), as on a batch passed in."""
  config = helpers.tiny_language_model_config(**{"diagnostics.lipschitz_every": 2,
                                                  "diagnostics.lipschitz_batch_size": 8})
  train_and_evaluate(config, tmp_path)
  records = _records(tmp_path, "lipschitz")
  assert records and all(np.isfinite(r["lipschitz"]) and r["lipschitz"] >= 0 for r in records)


def test_lipschitz_estimate_goes_through_the_imagenet_stems_max_pool(tmp_path):
  """Above 64x64 the ResNet has the ImageNet stem, whose max-pool has its own tangent rule
  (`lbjax.models.pooling`): the diagnostic's forward-over-reverse Hessian-vector product goes through it."""
  config = helpers.tiny_resnet_config(**{"data_options.image_size": 72, "data_options.num_train_examples": 64,
                                         "diagnostics.lipschitz_every": 2, "diagnostics.lipschitz_batch_size": 16})
  train_and_evaluate(config, tmp_path)
  records = _records(tmp_path, "lipschitz")
  assert [r["step"] for r in records] == [2]
  assert np.isfinite(records[0]["lipschitz"]) and records[0]["lipschitz"] >= 0


def test_a_model_without_forward_mode_derivatives_is_refused_before_training(tmp_path):
  """param_dtype_gradients' layers have reverse-mode rules only (custom_vjp): the estimate's forward-over-
  reverse product cannot go through them, which the run says before its first step."""
  config = helpers.tiny_resnet_config(**{"model_options.param_dtype_gradients": True,
                                         "diagnostics.lipschitz_every": 2, "diagnostics.lipschitz_batch_size": 16})
  with pytest.raises(ConfigError, match=r"lipschitz_every: .*param_dtype_gradients=True.*lipschitz_every=0"):
    train_and_evaluate(config, tmp_path)
  assert not (tmp_path / "metrics.jsonl").exists() or not _records(tmp_path, "train")


def test_discarding_small_losses_for_the_first_epochs_compiles_one_more_step(tmp_path):
  config = helpers.tiny_classifier_config(**{"loss.discard_fraction": 0.25, "loss.discard_until_epoch": 0.5})
  train_and_evaluate(config, tmp_path)
  compiles = [(r["batch_size"], r["discard_fraction"]) for r in _records(tmp_path, "compile")]
  assert compiles == [(32, 0.25), (32, 0.0)]


def test_discarding_averages_the_loss_over_the_kept_largest_losses():
  logits = jnp.log(jnp.array([[0.9, 0.1], [0.6, 0.4], [0.3, 0.7], [0.2, 0.8]]))
  labels = jnp.array([0, 0, 0, 0])
  dataset = Dataset("classification", None, None, {}, "test")  # images as they are (no uint8 normalisation)
  task = ClassificationTask(None, dataset, None)
  loss, _, _ = task.train_loss(lambda images, train: logits, {"images": None, "labels": labels}, None, None,
                               discard_fraction=0.5)
  assert float(loss) == pytest.approx(-(np.log(0.3) + np.log(0.2)) / 2, rel=1e-6)


def test_a_small_first_epoch_batch_is_a_batch_size_schedule(tmp_path):
  """papers/003 §3.2 (small batch in the first epoch, then the large one) needs no special code."""
  config = helpers.tiny_classifier_config(batch_sizes=(16, 64), batch_size_boundaries=(1.0,), num_epochs=2.0)
  result = train_and_evaluate(config, tmp_path)
  assert result.compiled_batch_sizes == (16, 64) and result.step == 256 // 16 + 256 // 64


@pytest.mark.parametrize("name, options", [("one_bit", {"compression.error_feedback": True}),
                                           ("qsgd", {"compression.num_levels": 4}),
                                           ("powersgd", {"compression.rank": 2}),
                                           ("tests.train.user_compressor:scaled_sign", {"lr.base": 0.3})])
def test_compressed_data_parallel_training_learns_and_resumes_exactly(tmp_path, name, options):
  """papers/004 compressors in the shard_map step over 8 devices; the compressor state (QSGD key,
  per-device error-feedback residual, PowerSGD's Q and memories) is checkpointed, so resume stays exact.
  A user's compressor with its own error-feedback state type keeps it per device too (GradientCompressor's
  per_device_state): kept as one replicated copy of 8 different ones, its checkpoint failed its checksums."""
  make = lambda **kw: helpers.tiny_classifier_config(
      **{"compression.name": name, "num_epochs": 8.0, "lr.base": 0.1, **options, **kw})
  full = train_and_evaluate(make(), tmp_path / "full")
  # It learns: the loss at chance is ln(10) = 2.30; 0.60-1.48 over seeds 0-3 of this recipe (2026-11-30).
  assert full.eval_metrics["loss"] < 1.8
  train_and_evaluate(make(num_epochs=4.0), tmp_path / "resumed")
  resumed = train_and_evaluate(make(), tmp_path / "resumed")
  helpers.assert_trees_equal(resumed.state, full.state)
  bits = _records(tmp_path / "full", "compression")[0]
  assert bits["ratio"] > 5  # far fewer bits than float32



def test_layer_table_of_the_first_step_matches_a_direct_computation():
  """papers/000 Table 2 for a config: ||w||/||grad|| per layer at the initial parameters."""
  rows = layer_table.first_step_layer_norms(helpers.tiny_classifier_config())
  by_layer = {row.layer: row for row in rows}
  assert set(by_layer) == {"cell/bias", "cell/kernel", "classifier/bias", "classifier/kernel",
                           "transform/bias", "transform/kernel"}
  kernel = by_layer["cell/kernel"]
  assert kernel.shape == (32, 64) and kernel.weight_norm > 0 and kernel.grad_norm > 0
  assert kernel.ratio == pytest.approx(kernel.weight_norm / kernel.grad_norm, rel=1e-5)


def test_layer_table_of_the_any_batch_step_equals_the_ordinary_steps():
  """The same first batch, laid out as micro-batches (`lbjax.train.any_batch`), gives the same table."""
  ordinary = layer_table.first_step_layer_norms(helpers.tiny_classifier_config())
  any_batch = layer_table.first_step_layer_norms(helpers.tiny_classifier_config(**{"batch.micro_batch_size": 8}))
  assert [row.layer for row in any_batch] == [row.layer for row in ordinary]
  for got, want in zip(any_batch, ordinary):
    assert got.shape == want.shape and got.weight_norm == want.weight_norm
    assert got.grad_norm == pytest.approx(want.grad_norm, rel=1e-5)
    assert got.ratio == pytest.approx(want.ratio, rel=1e-5)
    assert got.mean_abs_grad == pytest.approx(want.mean_abs_grad, rel=1e-5)


def test_lbjax_train_layer_table_applies_the_overrides_and_writes_the_table(tmp_path, capsys):
  """`lbjax-train --config <file> --config.<field>=<value> --layer-table --workdir`: the config as a training
  run resolves it (here a seed that changes the initial weights), its table on the console and in the CSV."""
  config = str(pathlib.Path(__file__).parents[1] / "experiments" / "tiny_image_config.py")
  assert main.main(["--config", config, "--config.seed=3", "--layer-table", "--workdir", str(tmp_path)]) == 0
  assert "| layer " in capsys.readouterr().out
  with open(tmp_path / "layer_table.csv") as f:
    written = [float(r["weight_norm"]) for r in csv.DictReader(f)]
  seed_3 = layer_table.first_step_layer_norms(config_files.load(config, ["--config.seed=3"]).config)
  seed_0 = layer_table.first_step_layer_norms(config_files.load(config).config)
  assert written == [row.weight_norm for row in seed_3] != [row.weight_norm for row in seed_0]


@pytest.mark.parametrize("accumulation", [{"max_device_batch": 16}, {"batch.micro_batch_size": 16}])
def test_the_noise_scale_of_a_step_that_discards_counts_the_kept_examples(tmp_path, accumulation):
  """Two micro-batches of 16 that keep 12 each (discard_fraction 0.25): B_small = 12 and B_big = 24 in
  McCandlish et al.'s estimates, from the same gradients the step takes (the compiled step and the
  any-batch step alike). Counting 16 and 32 made tr(Sigma) 4/3 too large."""
  config = helpers.tiny_classifier_config(**{"loss.discard_fraction": 0.25, "loss.discard_until_epoch": 1.0,
                                             "mesh.num_devices": 1, **accumulation})
  run = Run(config)
  try:
    state, batch = helpers.host_tree(run.state), run.next_batch()  # the step donates the state
    metrics = run.step(batch)
    graphdef, task = run.parts.graphdef, run.task

    def loss(params, micro_batch):
      model = nnx.merge(graphdef, params, state.model_state)
      return task.train_loss(model, micro_batch, None, None, 0.25)[0]

    arrays = batch.arrays if isinstance(batch.arrays, dict) else {
        name: jnp.concatenate([micro[name] for micro in batch.arrays]) for name in batch.arrays[0]}
    micro_grads = [jax.grad(loss)(state.params, jax.tree.map(lambda x, j=j: x[16 * j:16 * (j + 1)], arrays))
                   for j in range(2)]
    small = np.mean([optax.tree.norm(g, squared=True) for g in micro_grads])
    big = optax.tree.norm(jax.tree.map(lambda a, b: (a + b) / 2, *micro_grads), squared=True)
    expected = diagnostics.noise_scale_estimates(small, big, 12, 24)
    np.testing.assert_allclose(metrics["noise_scale_trace_sigma"], expected.trace_sigma, rtol=1e-4)
    np.testing.assert_allclose(metrics["noise_scale_grad_norm_sq"], expected.grad_norm_sq, rtol=1e-4)
  finally:
    run.close()


def test_an_any_batch_window_averages_the_noise_scale_over_the_steps_of_two_micro_batches(tmp_path):
  """B=32 (one micro-batch of 32: nan ingredients) for 4 steps, then 64 (two): the window of steps 4-6 holds
  one step of each size and averages the noise scale over steps 5 and 6 (it was nan, and the noise scale inf);
  the window of steps 1-3 has none."""
  config = helpers.tiny_classifier_config(log_every=3, batch_sizes=(32, 64), batch_size_boundaries=(0.5,),
                                          **{"batch.micro_batch_size": 32})
  train_and_evaluate(config, tmp_path)
  records = _records(tmp_path, "train")
  assert [(r["step"], r["batch_size"]) for r in records] == [(3, 32), (6, 64)]
  assert "noise_scale_trace_sigma" not in records[0] and "gradient_noise_scale" not in records[0]
  assert np.isfinite(records[1]["gradient_noise_scale"]) and records[1]["noise_scale_trace_sigma"] > 0
