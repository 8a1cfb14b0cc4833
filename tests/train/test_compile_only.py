"""`lbjax-train --compile-only [--topology NAME]`: the run's steps compiled from abstract arrays, their
memory against the device's HBM, collective bytes and FLOPs from the HLO; exit 4 when a step does not fit.

The `--topology` tests compile for TPU pods and need libtpu (`pip install 'lbjax[tpu]'`); they skip where
it is absent. The others compile for the 8 simulated CPU devices.
"""

import json
import math
import subprocess
import sys
import types
import warnings

import jax
from jax.experimental.compilation_cache import compilation_cache
import jax.numpy as jnp
import numpy as np
import pytest

from lbjax import config_files
from lbjax import data
from lbjax import main as cli
from lbjax.train import compile_only
from lbjax.train import compile_report
from lbjax.train import datasets
from lbjax.train import determinism
from lbjax.train import topology
from lbjax.train import train_and_evaluate
from lbjax.train import validation
from lbjax.train.errors import ConfigError
from tests.train import helpers

needs_libtpu = pytest.mark.skipif(not topology.libtpu_installed(),
                                  reason="libtpu is not installed: pip install 'lbjax[tpu]' to compile for TPU "
                                         "topologies")

COMPILE_JSON_KEYS = ("topology", "devices", "device_kind", "memory_per_device_bytes", "hbm_bytes", "fits",
                     "flops_per_step", "collective_bytes", "estimated_step_seconds")


def _mnist_lstm_parameters(transform: int, hidden: int, inputs: int = 28, classes: int = 10) -> int:
  """MnistLSTM: input transform, LSTM cell kernel [T + H, 4H] and bias, classifier."""
  return inputs * transform + transform + (transform + hidden) * 4 * hidden + 4 * hidden + hidden * classes + classes


def _compile(capsys, tmp_path, config, *extra):
  status = cli.main(["--config", config, "--compile-only", "--workdir", str(tmp_path), *extra])
  out, err = capsys.readouterr()
  report = json.loads((tmp_path / "compile.json").read_text()) if (tmp_path / "compile.json").exists() else None
  return status, out, err, report


def test_mnist_lstm_compiles_for_the_local_devices_without_reading_data(capsys, tmp_path):
  config = helpers.tiny_classifier_config(dataset="mnist", data_dir=str(tmp_path / "no-data-here"))
  config.data_options = {}
  report = compile_only.compile_run(config)
  assert report.fits and report.devices == jax.device_count() and report.platform == "cpu"
  assert [s["step"] for s in report.steps] == ["train", "eval"]
  assert report.steps[0]["steps_per_epoch"] == 60_000 // 32 and not report.data_from_files


def test_a_resnet_on_mnist_compiles_and_trains(tmp_path):
  """MNIST's images are [N, 28, 28]; a ResNet of one input channel takes them (a found bug: it refused them)."""
  mnist_resnet = dict(model="ResNetTiny", model_options={"num_filters": 4}, num_steps=2)
  report = compile_only.compile_run(helpers.tiny_classifier_config(dataset="mnist", data_dir="/no-data-here",
                                                                   data_options={}, **mnist_resnet))
  assert report.fits and [s["step"] for s in report.steps] == ["train", "eval"]
  result = train_and_evaluate(helpers.tiny_classifier_config(**mnist_resnet), tmp_path)
  assert np.isfinite(result.eval_metrics["loss"])


def user_dataset(*, seed: int = 0):
  """A dataset function lbjax does not know the shapes of (not in abstract_data.SHAPES)."""
  return datasets.synthetic_mnist(seed=seed, num_train_examples=96, num_eval_examples=32)


def test_a_users_dataset_is_read_for_its_shapes():
  config = helpers.tiny_classifier_config(dataset="tests.train.test_compile_only:user_dataset")
  config.data_options = {}
  report = compile_only.compile_run(config, evaluation=False)
  assert report.data_from_files and report.steps[0]["steps_per_epoch"] == 96 // 32
  assert "read from one batch of the data" in "\n".join(report.lines())


def test_deterministic_is_applied_to_a_local_compile_or_the_report_says_why_not(monkeypatch):
  """The local devices compile with the run's XLA flags (`determinism.request`, which refuses once the
  backend started without them: tests/train/test_determinism.py); a TPU topology's program has none
  to apply, and the report says so."""
  asked = []
  monkeypatch.setattr(determinism, "request", asked.append)
  config = helpers.tiny_language_model_config(deterministic=True)
  report = compile_only.compile_run(config, evaluation=False)
  assert asked == [config] and report.notes == []
  tpu = types.SimpleNamespace(platform="tpu")
  unapplied = compile_only._unapplied_settings  # pylint: disable=protected-access
  assert "a TPU program is compiled without them" in unapplied(config, "v5p:2x2x1", tpu)[0]
  config.deterministic = False
  assert unapplied(config, "h100:8", types.SimpleNamespace(platform="gpu")) == []
  config.profile.num_steps = 5  # a trace of steps: a compile takes none, and says so on any devices
  assert unapplied(config, None, tpu) == ["config.profile.num_steps=5 traces steps of the run; a compile runs none "
                                          "(the trace is taken when the run trains)."]


def test_the_training_set_held_on_the_devices_is_counted_in_a_note_and_refused_where_the_trainer_refuses_it():
  """MNIST's 60,000 uint8 digits and int32 labels, 45.1 MiB on each device besides the programs; PTB's windows
  and ImageNet's augmented stream cannot be held (as `Run` says, before any compile); a user's dataset is
  looked at."""
  config = helpers.tiny_classifier_config(dataset="mnist", data_dir="/no-data-here", train_data_on_device=True)
  config.data_options = {}
  run = compile_only.abstract_run(config, jax.devices())
  assert run.holds_training_set and run.data.in_memory and run.data.train_bytes == 60_000 * (28 * 28 + 4)
  report = compile_only.compile_run(config, evaluation=False)
  note, = report.notes
  rest, hbm = (report.hbm_bytes - run.held_bytes) / 2**30, report.hbm_bytes / 2**30
  assert note == ("config.train_data_on_device=True: each device also holds the training set, 45.1 MiB, so the "
                  f"programs above must fit in the rest of its memory ({rest:.2f} of {hbm:.2f} GiB).")

  for refused in (helpers.tiny_language_model_config(train_data_on_device=True),
                  helpers.tiny_classifier_config(dataset="imagenet", data_options={}, train_data_on_device=True)):
    with pytest.raises(ConfigError, match="does not read in-memory arrays without host transforms"):
      compile_only.compile_run(refused, evaluation=False)
  users = helpers.tiny_classifier_config(dataset="tests.train.test_compile_only:user_dataset",
                                         train_data_on_device=True)
  users.data_options = {}
  assert compile_only.abstract_run(users, jax.devices()).data.in_memory


def test_the_programs_must_fit_beside_the_training_set_the_devices_hold(monkeypatch):
  """A device whose memory holds the step with less to spare than the training set: the run fits with
  batches from the host and does not with the training set held (exit 4 from the CLI)."""
  config = lambda held: helpers.tiny_classifier_config(train_data_on_device=held,
                                                       **{"data_options.num_train_examples": 64})
  step_bytes = compile_only.compile_run(config(False), evaluation=False).steps[0]["memory_per_device_bytes"]
  held_bytes = 64 * (28 * 28 + 4)  # synthetic_mnist's 64 digits and labels
  assert 1.5 * held_bytes <= step_bytes  # so the training set takes at most half the memory below
  monkeypatch.setattr(compile_only.topology_lib, "device_memory",
                      lambda device, local_devices=1: topology.DeviceMemory(step_bytes + held_bytes // 2, "a test"))
  assert compile_only.compile_run(config(False), evaluation=False).fits
  assert not compile_only.compile_run(config(True), evaluation=False).fits


def test_the_lipschitz_probe_is_compiled_and_refused_as_training_refuses_it(capsys, tmp_path):
  """`diagnostics.lipschitz_every` > 0: the probe's program (`evaluation.lipschitz_function`, as the run lowers it)
  is one more program of the report, beside the resident optimizer state; a model it cannot differentiate
  forward is refused as training refuses it, exit 2 (compile-only said it fits)."""
  probe = {"diagnostics.lipschitz_every": 10, "diagnostics.lipschitz_batch_size": 16}
  report = compile_only.compile_run(helpers.tiny_classifier_config(**probe), evaluation=False)
  train, lipschitz = report.steps
  assert (lipschitz["step"], lipschitz["batch_size"], lipschitz["fits"]) == ("lipschitz", 16, True)
  assert lipschitz["resident_bytes"] >= train["memory"]["optimizer_state"] > 0
  assert lipschitz["flops_per_device"] > train["flops_per_device"] / 2  # a gradient and a Hessian-vector product
  assert "  Lipschitz probe at batch 16: fits" in report.lines()
  status, out, err, _ = _compile(capsys, tmp_path, "resnet_tiny_synthetic_cifar",
                                 "--config.model_options.param_dtype_gradients=True",
                                 "--config.diagnostics.lipschitz_every=10")
  assert status == 2 and "Traceback" not in err and "fits" not in out
  assert err.startswith("lbjax-train: config.diagnostics.lipschitz_every: the Lipschitz estimate (papers/001 §4) "
                        "takes a Hessian-vector product, forward-mode over reverse-mode differentiation")


def test_a_batch_size_schedule_compiles_one_step_per_size_and_splits_the_epochs():
  config = helpers.tiny_classifier_config(batch_sizes=(32, 64), batch_size_boundaries=(0.25,))
  report = compile_only.compile_run(config, evaluation=False)
  assert [(s["step"], s["batch_size"], s["epochs"]) for s in report.steps] == [("train", 32, 0.25), ("train", 64, 0.75)]
  assert [s["steps_per_epoch"] for s in report.steps] == [256 // 32, 256 // 64]
  # A schedule back to an earlier size: that size's step once, as the run compiles it (it was compiled twice and
  # reported as an any-batch pair with twice the FLOPs), with the epochs of both stages.
  back = compile_only.compile_run(helpers.tiny_classifier_config(batch_sizes=(32, 64, 32),
                                                                 batch_size_boundaries=(0.25, 0.5)), evaluation=False)
  assert [(s["step"], s["batch_size"], s["epochs"]) for s in back.steps] == [("train", 32, 0.75), ("train", 64, 0.25)]
  assert back.steps[0]["flops_per_device"] == report.steps[0]["flops_per_device"]


def test_the_recipe_stops_at_num_steps_as_the_run_does():
  """`config.num_steps=10` of a 25-epoch recipe: the estimate was of 25 epochs (11,700 steps). The stages are
  walked in order and cut at the 10th step; the report says "at most 10 steps", as --dry-run does."""
  schedule = dict(batch_sizes=(32, 64), batch_size_boundaries=(0.25,))  # 8 then 4 steps per epoch, 1 epoch
  stages = lambda **fields: [(s.batch_size, s.epochs, s.steps) for s in compile_report.recipe_stages(
      validation.validate(helpers.tiny_classifier_config(**schedule, **fields)), lambda size: 256 // size)]
  assert stages() == [(32, 0.25, 2.0), (64, 0.75, 3.0)]
  assert stages(num_steps=4) == [(32, 0.25, 2.0), (64, 0.5, 2.0)]
  assert stages(num_steps=1) == [(32, 0.125, 1.0), (64, 0.0, 0.0)]


@needs_libtpu
def test_the_recipe_estimate_of_a_run_of_num_steps_is_of_those_steps():
  """25 epochs of 8 steps, at most 10 steps: the recipe is 10 estimated steps (it was 200)."""
  report = compile_only.compile_run(helpers.tiny_classifier_config(num_epochs=25.0, num_steps=10), "v5e:2x2",
                                    evaluation=False)
  train, = report.steps
  assert (train["epochs"], report.to_json()["num_steps"]) == (10 / 8, 10)
  assert report.estimated_recipe_seconds == pytest.approx(10 * train["estimated_step_seconds"])
  assert report.lines()[-1].startswith("Recipe (25 epochs, at most 10 steps): estimated ")


def test_discarding_small_losses_compiles_the_discarding_step_for_the_epochs_it_trains():
  """papers/003 §3.1: the smallest losses discarded until epoch 0.5 (a run compiles a (size, discard fraction)
  step): a schedule of 32 then 64 at epoch 0.25 trains 32 discarding, 64 discarding until 0.5, then 64 not;
  compile-only compiled the plain step only. The any-batch pair likewise."""
  discard = {"loss.discard_fraction": 0.25, "loss.discard_until_epoch": 0.5}
  config = helpers.tiny_classifier_config(batch_sizes=(32, 64), batch_size_boundaries=(0.25,), **discard)
  variants = lambda run: [(p.name, p.batch_size, p.discard_fraction) for p in run.programs]
  assert variants(compile_only.abstract_run(config, jax.devices())) == [
      ("train", 32, 0.25), ("train", 64, 0.25), ("train", 64, 0.0), ("eval", 32, 0.0)]
  any_batch = helpers.tiny_classifier_config(**discard, **{"batch.micro_batch_size": 16})
  assert variants(compile_only.abstract_run(any_batch, jax.devices()))[:4] == [
      ("accumulate", 32, 0.25), ("apply", 32, 0.25), ("accumulate", 32, 0.0), ("apply", 32, 0.0)]
  report = compile_only.compile_run(config, evaluation=False)
  assert [(s["batch_size"], s["discard_fraction"], s["epochs"]) for s in report.steps] == [
      (32, 0.25, 0.25), (64, 0.25, 0.25), (64, 0.0, 0.5)]
  assert report.fits and ("  train step at batch 64, discarding the smallest losses (loss.discard_fraction=0.25): "
                          "fits") in report.lines()


def test_a_simulated_compressor_is_noted_with_the_bits_a_real_encoder_would_send():
  """1-bit SGD is simulated (the devices all-reduce the decoded float32 gradient), so the report's all-reduce is the
  uncompressed one: a note says so, with the n + 64 bits per leaf of n entries that the encoder sends."""
  config = helpers.tiny_classifier_config(**{"compression.name": "one_bit"})
  run = compile_only.abstract_run(config, jax.devices())
  leaves = [math.prod(leaf.shape) for leaf in jax.tree.leaves(run.state.params)]
  sent, whole = (sum(leaves) + 64 * len(leaves)) / 8 / 2**20, 4 * sum(leaves) / 2**20
  report = compile_only.compile_run(config, evaluation=False)
  assert report.steps[0]["collective_bytes"]["all-reduce"] >= 4 * sum(leaves)
  assert report.notes == [
      "config.compression 'one_bit' is simulated: each device encodes and decodes its gradient and the devices "
      "all-reduce the decoded float32 values (lbjax.optim.compression.compressed_pmean), so the all-reduce bytes above "
      f"are those of the uncompressed gradient; a real encoder would send {sent:.3f} MiB per device per step, "
      f"{whole / sent:.1f}x less than the float32 gradient's {whole:.3f} MiB (lbjax.optim.compression.bits_per_step)."]


def test_steps_per_call_compiles_the_call_and_reports_its_figures_per_step():
  """With 4 steps per call the run's program is the call: its FLOPs and all-reduce bytes, counted
  through the scan and divided by 4, are one step's; its memory holds the 4 batches."""
  one = compile_only.compile_run(helpers.tiny_classifier_config(), evaluation=False).steps[0]
  four = compile_only.compile_run(helpers.tiny_classifier_config(steps_per_call=4), evaluation=False).steps[0]
  assert (one["steps_per_call"], four["steps_per_call"]) == (1, 4)
  assert four["flops_per_device"] == pytest.approx(one["flops_per_device"], rel=1e-4)
  assert four["collective_bytes"]["all-reduce"] == pytest.approx(one["collective_bytes"]["all-reduce"], rel=0.01)
  assert four["memory"]["arguments"] > one["memory"]["arguments"]


def test_the_any_batch_step_compiles_its_two_programs_once_per_run():
  config = helpers.tiny_language_model_config(**{"batch.micro_batch_size": 8})
  run = compile_only.abstract_run(config, jax.devices())
  assert [(p.name, p.num_microbatches) for p in run.programs] == [("accumulate", 2), ("apply", 2), ("eval", 1)]
  report = compile_only.compile_run(config)
  step = report.steps[0]
  assert step["step"] == "any_batch" and step["programs"] == ["accumulate", "apply"] and report.fits


def test_a_step_that_cannot_fit_exits_4_with_what_to_change_and_no_traceback(capsys, tmp_path):
  """An MNIST LSTM of 65,536 units: 128 GiB of parameters on each of 8 CPU devices, more than any host has."""
  status, _, err, report = _compile(capsys, tmp_path, "mnist_lstm", "--config.model_options.hidden_size=65536",
                                    "--config.model_options.transform_size=65536", "--config.eval_batch_size=8")
  assert status == 4
  assert "The train step at batch 128 does not fit: it needs" in err
  assert "--config.mesh.fsdp" in err and "larger slice" in err
  assert "Traceback" not in err and len(err.splitlines()) <= 8
  assert report["fits"] is False and report["memory_per_device_bytes"] > report["hbm_bytes"]


def test_topology_without_libtpu_says_what_to_install(capsys, tmp_path, monkeypatch):
  monkeypatch.setattr(topology, "libtpu_installed", lambda: False)
  status, _, err, _ = _compile(capsys, tmp_path, "mnist_lstm", "--topology", "v5p:2x2x1")
  assert status == 2 and "pip install 'lbjax[tpu]'" in err and "Traceback" not in err


def test_topology_needs_compile_only(capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["--config", "mnist_lstm", "--topology", "v5p:2x2x1", "--workdir", "w"])
  assert exit_info.value.code == 2 and "add --compile-only" in capsys.readouterr().err


@needs_libtpu
def test_an_unknown_topology_is_a_message(capsys, tmp_path):
  status, _, err, _ = _compile(capsys, tmp_path, "mnist_lstm", "--topology", "v3:3x3")
  assert status == 2 and "is not a TPU topology" in err and "v3:32x32" in err


# A 0 reached libtpu, which divided by it: SIGFPE, and nothing on the console.
@pytest.mark.parametrize("name", ["foo", "v5p", "v5p:2x", "v5p:2x2x1-big", "v3:0x0", "v5e:2x0", "v4:2x2x00"])
def test_a_malformed_topology_name_is_refused_before_libtpu_loads(capsys, tmp_path, monkeypatch, name):
  monkeypatch.setattr(topology, "libtpu_installed", lambda: pytest.fail("looked for libtpu"))
  status, out, err, _ = _compile(capsys, tmp_path, "mnist_lstm", "--topology", name)
  assert status == 2 and not out
  assert err.splitlines() == [f"lbjax-train: --topology {name!r} is not a TPU topology name: names look like "
                              f"{topology.EXAMPLES} (a TPU generation, a colon, the chips along each axis, at least 1 "
                              "each), or GPUs: h100, h100:8, h200:2x8.", "(Set LBJAX_TRACEBACK=1 for the traceback.)"]


@needs_libtpu
def test_an_unsupported_topology_is_the_message_alone_without_libtpus_start_up_lines(tmp_path):
  """libtpu, starting on a machine without TPUs, writes five lines (TPU_ACCELERATOR_TYPE, TPU_WORKER_HOSTNAMES)
  to file descriptor 2; they are dropped, so the refusal is all the console shows."""
  result = subprocess.run([sys.executable, "-m", "lbjax.main", "--config", "mnist_lstm", "--compile-only", "--topology",
                           "v5p:3x3x3", "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=300)
  assert result.returncode == 2 and not result.stdout
  lines = result.stderr.splitlines()
  assert len(lines) == 2 and lines[0].startswith("lbjax-train: --topology 'v5p:3x3x3' is not a TPU topology libtpu "
                                                 "knows (INVALID_ARGUMENT: Topology layout")
  assert "TPU_WORKER_HOSTNAMES" not in result.stderr


@needs_libtpu
def test_mnist_lstm_data_parallel_collectives_are_the_gradient_bytes(capsys, tmp_path):
  """One all-reduce per step: the float32 gradient of every parameter, and the loss and accuracy means."""
  status, out, _, report = _compile(capsys, tmp_path, "mnist_lstm", "--topology", "v5p:2x2x1",
                                    "--config.model_options.transform_size=32", "--config.model_options.hidden_size=48")
  assert status == 0 and "fits" in out
  assert all(key in report for key in COMPILE_JSON_KEYS)
  assert report["devices"] == 4 and report["device_kind"] == "TPU v5" and report["hbm_bytes"] == 95 * 10**9
  gradient_bytes = 4 * _mnist_lstm_parameters(32, 48)
  assert report["collective_bytes"] == {"all-reduce": gradient_bytes + 2 * 4, "reduce-scatter": 0, "all-gather": 0,
                                        "collective-permute": 0, "all-to-all": 0}
  train = report["steps"][0]
  assert train["memory"]["parameters"] == gradient_bytes and train["estimated_step_seconds"] > 0
  assert report["flops_per_step"] > 0 and train["estimated_recipe_seconds"] == pytest.approx(
      train["estimated_step_seconds"] * train["steps_per_epoch"] * 25)


@needs_libtpu
@pytest.mark.parametrize("mesh", ["data", "fsdp", "model", "stage"])
def test_ptb_lstm_compiles_for_a_small_topology_on_every_mesh(capsys, tmp_path, mesh):
  """The PTB LSTM (embedding = hidden size, so the two layers pipeline) on v4:2x2x1 (4 megacore chips)."""
  layout = {"data": [], "fsdp": ["--config.mesh.fsdp=2"], "model": ["--config.mesh.model=2"],
            "stage": ["--config.mesh.stage=2", "--config.pipeline.num_microbatches=2"]}
  status, out, err, report = _compile(
      capsys, tmp_path, "ptb_lstm", "--topology", "v4:2x2x1", "--config.batch_size=64", "--config.eval_batch_size=16",
      "--config.model_options.hidden_size=64", "--config.model_options.embed_size=64", *layout[mesh])
  assert status == 0, err
  assert report["devices"] == 4 and report["hbm_bytes"] == 32 * 2**30  # a v4 device is a chip (megacore)
  assert report["mesh"][mesh] == (4 if mesh == "data" else 2)
  collectives = report["collective_bytes"]
  if mesh == "fsdp":
    assert collectives["all-gather"] > 0 or collectives["reduce-scatter"] > 0
  if mesh == "stage":
    assert collectives["collective-permute"] > 0


@needs_libtpu
def test_resnet_tiny_compiles_with_its_head_sharded_over_model(capsys, tmp_path):
  status, _, err, report = _compile(capsys, tmp_path, "resnet50_imagenet:smoke=true", "--topology", "v5p:2x2x1",
                                    "--config.mesh.model=2", "--config.eval_batch_size=32")
  assert status == 0, err
  assert report["mesh"]["model"] == 2 and report["fits"]


@needs_libtpu
def test_a_bfloat16_resnet_sums_its_gradients_in_bfloat16_unless_told_otherwise():
  """Under jit the partitioner all-reduces a bfloat16 model's kernel gradients where the convolutions make
  them, in bfloat16: about half the float32 parameter bytes. `model_options.param_dtype_gradients=True` makes
  those products float32, and `mesh.per_device_gradients=True` takes each device's float32 gradient: either
  way the all-reduce sums float32 (docs/running.md), the parameter bytes and a few more."""
  all_reduce = {}
  for name, option in (("plain", "--config.mesh.per_device_gradients=False"),
                       ("per_device", "--config.mesh.per_device_gradients=True"),
                       ("param_dtype", "--config.model_options.param_dtype_gradients=True")):
    loaded = config_files.load("resnet50_imagenet:smoke=true", ["--config.model_options.dtype=bfloat16", option])
    report = compile_only.compile_run(loaded.config, "v5p:2x2x1", evaluation=False)  # the train step: half the time
    record = report.to_json()
    parameter_bytes = record["steps"][0]["memory"]["parameters"]
    all_reduce[name] = (record["collective_bytes"]["all-reduce"] / parameter_bytes,
                        record["steps"][0]["all_reduce_16bit_bytes"] / parameter_bytes)
    assert ("summed in 16-bit floats" in "\n".join(report.lines())) == (name == "plain")
  assert all_reduce["plain"][0] < 0.6 and all_reduce["plain"][1] > 0.4
  for name in ("per_device", "param_dtype"):  # float32 sums (per_device: a bf16[10] operand summed into an f32)
    assert 1.0 <= all_reduce[name][0] < 1.1 and all_reduce[name][1] == 0


@pytest.fixture
def empty_compilation_cache(tmp_path):
  """JAX's persistent compilation cache in an empty directory for this test (conftest's shared one after)."""
  shared = jax.config.jax_compilation_cache_dir
  jax.config.update("jax_compilation_cache_dir", str(tmp_path / "jax-cache"))
  compilation_cache.reset_cache()
  yield tmp_path / "jax-cache"
  jax.config.update("jax_compilation_cache_dir", shared)
  compilation_cache.reset_cache()


@needs_libtpu
def test_a_topology_compile_neither_reads_nor_writes_the_persistent_cache(empty_compilation_cache):
  """A compile-only client cannot load cached executables: twice the same TPU compile writes no entry and
  warns of none, and a local compile after it is cached again."""
  config = helpers.tiny_classifier_config(dataset="mnist")
  config.data_options = {}
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(2):
      assert compile_only.compile_run(config, "v3:2x2").fits
  assert not [w for w in caught if "compilation cache" in str(w.message)]
  assert not empty_compilation_cache.exists() or not any(empty_compilation_cache.iterdir())
  jax.jit(lambda x: x * 3.0 + 1.0)(jnp.arange(5.0)).block_until_ready()
  assert any(empty_compilation_cache.iterdir())


@pytest.mark.parametrize("refusal", [
    "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM, the total memory required for HLO "
    "temporaries (43.56G) exceeds available HBM (15.48G). HLO module: jit_step.",  # libtpu 0.0.50.1 (jax 0.12)
    "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: XLA:TPU compile permanent error. Ran out of memory in memory "
    "space hbm. Used 43.02G of 15.48G hbm. Exceeded hbm capacity by 27.54G.",  # libtpu 0.0.40 (jax 0.10)
])
def test_the_batch_that_fits_is_scaled_by_the_compilers_own_figures(refusal):
  """7,500 examples per device need about 43G of 15.48G: 2,665 would fit, and 2,500 divides the 7,500."""
  message = _refused_report(refusal, parameter_bytes=2**30).does_not_fit_message()
  assert "--config.max_device_batch=2500 (now 7500" in message
  assert "they alone exceed" not in message and "--config.mesh.fsdp=N (now 1)" in message


def _refused_report(refusal: str, parameter_bytes: int, held_bytes: int = 0) -> compile_report.CompileReport:
  """The report of a train step at batch 60,000 on 8 devices of 16 GiB that the compiler refused with `refusal`;
  parameters and momentum of `parameter_bytes` each."""
  train = types.SimpleNamespace(name="train", batch_size=60_000, num_microbatches=1, per_step=1.0, steps_per_call=1,
                                resident_state=None, discard_fraction=0.0)
  leaf = jax.ShapeDtypeStruct((parameter_bytes // 4,), jnp.float32)
  state = types.SimpleNamespace(params={"w": leaf}, opt_state={"momentum": leaf}, compression_state=None)
  step = compile_report.step_record([compile_report.out_of_memory_figures(train, refusal, state)], 60_000, 1, 25.0,
                                    16 * 2**30 - held_bytes)
  return compile_report.CompileReport("v3:2x2", "tpu", 8, "TPU v3", {"data": 8, "fsdp": 1, "stage": 1, "model": 1},
                                      16 * 2**30, "table", False, [step], 25.0, None, held_bytes=held_bytes)


def test_a_refused_step_whose_state_alone_exceeds_the_device_is_told_to_split_it():
  """Parameters and momentum of 8 GiB each on a 16 GiB device: the refusal of the compiler carried no memory
  figures, and fsdp, the one remedy, went unsaid."""
  refusal = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries (32.01G) "
             "exceeds available HBM (15.75G).")
  message = _refused_report(refusal, parameter_bytes=8 * 2**30).does_not_fit_message()
  assert "parameters and optimizer state (16.00 GiB per device) split over devices: --config.mesh.fsdp=N (now 1); " \
         "they alone exceed the device's memory" in message


def test_a_step_that_fits_the_device_but_not_beside_the_training_set_it_holds_says_so():
  """A 12 GiB step on a 16 GiB device that holds a 6 GiB training set: the message said it needs less than the
  device has, and a slice of 1x the devices."""
  figures = compile_report.ProgramFigures(
      "train", 64, 1, 1.0, 12 * 2**30, {"parameters": 2**30, "optimizer_state": 2**30, "temporaries": 10 * 2**30},
      None, dict.fromkeys(compile_report.COLLECTIVES, 0), None, None)
  step = compile_report.step_record([figures], 64, 1, 1.0, 10 * 2**30)
  report = compile_report.CompileReport("v5e:2x4", "tpu", 8, "TPU v5 lite", {"data": 8, "fsdp": 1, "stage": 1,
                                                                            "model": 1},
                                        16 * 2**30, "table", False, [step], 1.0, None, held_bytes=6 * 2**30)
  message = report.does_not_fit_message()
  assert not report.fits
  assert "it needs 12.00 GiB per device; a TPU v5 lite device has 16.00 GiB, 10.00 GiB of it beside the training " \
         "set it holds (6.00 GiB)" in message
  assert "--config.train_data_on_device=False (it takes 6.00 GiB of each device)" in message
  assert "about 2x the 8 devices" in message


@needs_libtpu
def test_mnists_pixels_are_scaled_without_a_gather_on_a_tpu():
  """A TPU gathers element by element: MNIST's 256-entry table, gathered per pixel, cost 14.8 ms per 2,048
  images in XLA's v5p cost model; the arithmetic form (`lbjax.data.PixelScale`) is elementwise."""
  (device, *_) = topology.topology_devices("v5p:2x2x1")
  pixels = jax.ShapeDtypeStruct((2048, 28, 28), jnp.uint8, sharding=jax.sharding.SingleDeviceSharding(device))
  with compile_only.persistent_cache_set_aside():  # a topology's compiler cannot load cached executables
    compiled = jax.jit(data.MNIST_NORMALIZATION).lower(pixels).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  assert " gather(" not in compiled.as_text() and cost["optimal_seconds"] < 1e-4


@needs_libtpu
def test_a_step_that_cannot_fit_on_a_tpu_exits_4_with_the_compilers_figures(capsys, tmp_path):
  """The MNIST LSTM of 4,096 units on all 60,000 digits at once: 7,500 sequences per v3 TensorCore, whose
  activations XLA refuses at compile time (CompileTimeHbmOom); the refusal is the message, exit 4."""
  status, _, err, report = _compile(capsys, tmp_path, "mnist_lstm", "--topology", "v3:2x2",
                                    "--config.model_options.hidden_size=4096", "--config.batch_size=60000")
  assert status == 4 and "does not fit: the compiler ran out of memory" in err and "Traceback" not in err
  # 7,500 x 15.48G available / 24.89G needed (43.56G before lstm_unroll kept only the gates) = 4,664, at most
  # half the 7,500: 3,750 divides it.
  assert "--config.max_device_batch=3750" in err
  assert report["fits"] is False and report["hbm_bytes"] == 16 * 2**30 and report["device_kind"] == "TPU v3"
  # Its memory is the compiler's figure for what it needed, at least, not the small eval step's (it read 1.5 MiB).
  needed, _ = compile_report.compiler_hbm_figures(report["steps"][0]["compiler_message"])
  assert report["steps"][0]["memory_per_device_bytes"] == report["memory_per_device_bytes"] == needed
  assert needed > report["hbm_bytes"] and report["memory_per_device_is_lower_bound"]


@needs_libtpu
def test_the_eval_step_must_fit_beside_the_optimizer_state_that_stays_resident(capsys, tmp_path):
  """An MNIST LSTM of 12,288 units with Adam on a 16 GiB v5e chip: the eval step at batch 10,000 takes 14.70 GiB,
  its parameters among its arguments, and the train state is not donated to it: Adam's 4.55 GiB stay on the
  device beside it, 19.25 GiB in all (it was judged to fit on its own 14.70 GiB)."""
  status, out, err, report = _compile(capsys, tmp_path, "mnist_lstm:optimizer=adam", "--topology", "v5e:1x1",
                                      "--config.model_options.hidden_size=12288", "--config.batch_size=8",
                                      "--config.eval_batch_size=10000")
  if report is None and jax.__version_info__ < (0, 12):  # CI 2026-12-02, jax 0.10's libtpu: no report; not traced
    pytest.skip(f"the libtpu of jax {jax.__version__} wrote no report for this run (exit {status}): {err[-500:]}")
  train, evaluation = report["steps"]
  assert train["fits"] and train["resident_bytes"] == 0
  adam = train["memory"]["optimizer_state"]
  assert adam > 4.5 * 2**30 and evaluation["memory"]["arguments"] >= evaluation["memory"]["parameters"]
  assert 0 <= evaluation["resident_bytes"] - adam <= 64  # and the step counter, the key and the non-finite marker
  assert status == 4 and not evaluation["fits"] and not report["fits"] and "Traceback" not in err
  in_all = evaluation["memory_per_device_bytes"] + evaluation["resident_bytes"]
  assert report["memory_per_device_bytes"] == in_all > report["hbm_bytes"]
  assert ("memory per device 14.70 GiB of 16.00 GiB, beside the optimizer state 4.55 GiB resident (19.25 GiB in "
          "all): parameters 2.27 GiB, activations and temporaries 12.42 GiB") in out
  assert ("The eval step at batch 10000 does not fit: it needs 14.70 GiB per device beside the optimizer state that "
          "stays resident while it runs (4.55 GiB), 19.25 GiB in all; a TPU v5 lite device has 16.00 GiB. ") in err
  assert "a smaller config.eval_batch_size (now 10000, 10000 per device)" in err and "--config.mesh.fsdp=N" in err


def test_a_workdir_that_is_a_file_is_refused_before_anything_compiles(capsys, tmp_path, monkeypatch):
  existing = tmp_path / "notes.txt"
  existing.write_text("not a run")
  monkeypatch.setattr(compile_only, "compile_run", lambda *a, **k: pytest.fail("compiled before checking --workdir"))
  status = cli.main(["--config", "mnist_lstm", "--compile-only", "--workdir", str(existing)])
  _, err = capsys.readouterr()
  assert status == 2 and "Traceback" not in err
  assert f"--workdir {str(existing)!r} is a file, not a directory" in err
  assert existing.read_text() == "not a run"
