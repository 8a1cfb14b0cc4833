"""The models the trainer benchmarks run, as trainer configs, plus a hand-written baseline step.

`trainer_config(model, batch_size)` is a `lbjax.train.default_config()` on that model's synthetic
twin (no files needed); `TrainerStep` is the trainer's own compiled step (built on
`lbjax.train.run.Run`, the object `train_and_evaluate` drives, compiled exactly as it compiles), and
`HandStep` the minimal `jax.jit` step a user would write for the same model, loss and optimizer
(nnx.split/merge + optax, donated buffers); `TrainerCall` the trainer's program of k steps;
`trace_steps` traces calls of any of them with `jax.profiler` and reads the device's time back.

`STATE_LAYOUTS`: how the train state sits in device memory. "default": row-major, as the trainer places
it. "xla": the layouts XLA's layout assignment prefers for the step, which it picks when the step is
compiled with `Layout.AUTO` for the state (an experiment of issue 29: on a GPU XLA then keeps the 4-d
convolution kernels and their optimizer state in cuDNN's OHWI order instead of transposing them around
every convolution; the trainer does not do this).
"""

import argparse
import contextlib
import dataclasses
import pathlib
import time
from typing import Any, Callable
from unittest import mock

from flax import nnx
import jax
from jax.experimental.layout import Format
from jax.experimental.layout import Layout
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from lbjax import models
from lbjax import train
from lbjax.train import build
from lbjax.train import protocols
from lbjax.train import run as run_lib
from lbjax.train import step_calls
from lbjax.train import step as train_step_lib
from lbjax.train import trace_analysis

MODELS = ("mnist_lstm", "ptb_lstm", "resnet_tiny", "resnet18", "resnet50")
# The workload names (used in the benchmark tables and flags) -> `config.model`, a class of lbjax.models.
MODEL_CLASSES = {"mnist_lstm": "MnistLSTM", "ptb_lstm": "PtbLSTM", "resnet_tiny": "ResNetTiny",
                 "resnet18": "ResNet18", "resnet50": "ResNet50"}
LEARNING_RATE = 0.01
MOMENTUM = 0.9
STATE_LAYOUTS = ("default", "xla")


def layouts_chosen_by_xla(shardings: Any) -> Any:
  """`shardings` (a tree of them) as `in_shardings`/`out_shardings` that leave each array's layout to XLA."""
  return jax.tree.map(lambda sharding: Format(Layout.AUTO, sharding), shardings)


def with_state_layouts_chosen_by_xla(program: Any) -> Any:
  """A `lbjax.train.compile_only.Program` of a train step (state, batch, learning rate) -> (state,
  metrics) whose state, in and out, is laid out as XLA prefers (`STATE_LAYOUTS`)."""
  state_in, *other_in = program.in_shardings
  state_out, *other_out = program.out_shardings
  return dataclasses.replace(program, in_shardings=(layouts_chosen_by_xla(state_in), *other_in),
                             out_shardings=(layouts_chosen_by_xla(state_out), *other_out))


def parse_case(item: str, sizes: tuple[str, ...] = ("BATCH",)) -> tuple:
  """A command line's `MODEL:SIZE:...` case -> (model, size, ...): MODEL one of `MODELS`, then one integer >= 1
  per name in `sizes` (e.g. ("BATCH", "MICRO")). An argparse type's check: raises `argparse.ArgumentTypeError`
  naming the case and the expected form."""
  fields = item.split(":")
  model, numbers = fields[0], fields[1:]
  if model not in MODELS or len(numbers) != len(sizes) or not all(n.isdigit() and int(n) >= 1 for n in numbers):
    raise argparse.ArgumentTypeError(
        f"{item!r}: a case is {':'.join(('MODEL', *sizes))} with MODEL one of {', '.join(MODELS)} and "
        f"{', '.join(sizes)} {'integers' if len(sizes) > 1 else 'an integer'} >= 1")
  return (model, *(int(n) for n in numbers))


def trainer_config(model: str, batch_size: int, *, num_train_examples: int = 4096,
                   image_size: int = 32) -> ml_collections.ConfigDict:
  """A momentum-SGD trainer config for `model` on its synthetic dataset at `batch_size`.

  Args:
    model: one of `MODELS` (the workload name; `config.model` is its class, `MODEL_CLASSES`).
    batch_size: global batch size (for ptb_lstm: rows of 20-token windows).
    num_train_examples: synthetic training-set size (tokens for ptb_lstm are 20x this).
    image_size: side of the synthetic images (ResNets).
  """
  if model not in MODELS:
    raise ValueError(f"Unknown model {model!r}; choose one of {', '.join(MODELS)}.")
  config = train.default_config()
  config.model = MODEL_CLASSES[model]
  config.batch_size = batch_size
  config.scaling.base_batch_size = batch_size
  config.lr.base = LEARNING_RATE
  config.optimizer = {"name": "momentum", "momentum": MOMENTUM}  # lbjax.optim.momentum
  config.progress = False
  config.checkpoint_every_steps = 0
  config.eval_batch_size = batch_size
  if model == "mnist_lstm":
    config.dataset = "synthetic_mnist"
    config.data_options.num_train_examples = num_train_examples
    config.data_options.num_eval_examples = batch_size
  elif model == "ptb_lstm":
    config.dataset = "synthetic_ptb"
    config.data_options.vocab_size = 10000
    config.data_options.num_train_tokens = 20 * num_train_examples
    config.data_options.num_eval_tokens = 20 * batch_size + 1
  else:
    config.dataset = "synthetic_images"
    config.data_options.image_size = image_size
    config.data_options.num_train_examples = num_train_examples
    config.data_options.num_eval_examples = batch_size
    config.data_options.num_classes = 10
  return config


class TrainerStep:
  """The trainer's compiled step for one config, ready to call repeatedly on one placed batch."""

  def __init__(self, config: ml_collections.ConfigDict, state_layouts: str = "default"):
    if state_layouts not in STATE_LAYOUTS:
      raise ValueError(f"state_layouts must be one of {', '.join(STATE_LAYOUTS)}, got {state_layouts!r}.")
    self.state_layouts = state_layouts
    self.run = run_lib.Run(config)
    self.batch_size = config.batch_size
    self.state = self.run.state
    self.stream = self.run.stream
    local = self.stream.next_batch(self.batch_size)
    protocols.take_carry_reset(local)  # the language model's flag: not an input of the step
    self.state = self.state._replace(carry=self.run.parts.zero_carry(self.batch_size))  # None: no carry
    self.host_batch = local
    self.batch = build.global_batch(local, self.run.parts.batch_sharding)
    self.learning_rate = build.host_scalar(LEARNING_RATE, self.run.parts.replicated)
    self.compiled = self.compile()
    if state_layouts == "xla":  # once, before timing: the state moved into the layouts the step was compiled for
      self.state = jax.device_put(self.state, self.compiled.input_formats[0][0])

  def compile(self) -> jax.stages.Compiled:
    """Compiles the step as `Run.train_step` does: `make_train_step` with the run's micro-batch
    count, jitted with the state's and batch's shardings and the state donated (with
    `state_layouts="xla"`, the state in and out in the layouts XLA chooses)."""
    run = self.run
    step = train_step_lib.make_train_step(run.parts.graphdef, run.task, run.parts.optimizer, run.mesh,
                                          run.resolved.batch.num_microbatches(self.batch_size, run.data_parallel_size))
    state_shardings = jax.tree.map(lambda x: x.sharding, self.state)
    state = self.state
    if self.state_layouts == "xla":  # lowered with shapes: an array's own layout would contradict AUTO
      state_shardings = layouts_chosen_by_xla(state_shardings)
      state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    batch_shardings = jax.tree.map(lambda x: x.sharding, self.batch)
    return jax.jit(step, in_shardings=(state_shardings, batch_shardings, run.parts.replicated),
                   out_shardings=(state_shardings, run.parts.replicated), donate_argnums=(0,),
                   ).lower(state, self.batch, self.learning_rate).compile()

  def __call__(self) -> Any:
    """One step on the fixed batch; returns the metrics (device arrays)."""
    self.state, metrics = self.compiled(self.state, self.batch, self.learning_rate)
    return metrics

  def close(self) -> None:
    """Releases the device buffers of the state and batch."""
    for leaf in jax.tree.leaves((self.state, self.batch)):
      leaf.delete()


class TrainerCall:
  """The trainer's compiled call of `steps` steps (`config.steps_per_call`, `Run.step_call`'s program)
  on `steps` copies of a `TrainerStep`'s batch, stacked and placed once, ready to call repeatedly: the scanned
  program's device time per step, without the loop's host work. With `unrolled` the scan is unrolled
  on every backend (the trainer unrolls it only where `step.loops_slow_down_convolutions`, on CPU
  devices): the same steps without a device-side loop."""

  def __init__(self, trainer_step: TrainerStep, steps: int, unrolled: bool = False):
    run = trainer_step.run
    self.trainer_step, self.steps = trainer_step, steps
    self.batches = build.global_call_batches([trainer_step.host_batch] * steps, run.parts.call_batch_sharding)
    self.learning_rates = (trainer_step.learning_rate,) * steps
    unroll = (mock.patch.object(step_calls, "loops_slow_down_convolutions", lambda params, mesh: True)
              if unrolled else contextlib.nullcontext())
    with unroll:
      self.compiled = run.parts.train_step_call(trainer_step.batch_size, 0.0, steps, trainer_step.state,
                                                self.batches).lower(
          trainer_step.state, self.batches, self.learning_rates).compile()

  def __call__(self) -> Any:
    """One call of `steps` steps on the fixed batch (the state is the trainer step's, passed on);
    returns the stacked metrics."""
    step = self.trainer_step
    step.state, metrics = self.compiled(step.state, self.batches, self.learning_rates)
    return metrics


class HandStep:
  """A minimal user-written step: value_and_grad of the same loss, optax momentum SGD, donation.

  Uses the trainer's model builder and the same host batch, so only the step differs.
  """

  def __init__(self, trainer_step: TrainerStep):
    run = trainer_step.run
    model = run.task.build_model(nnx.Rngs(run.resolved.seed))
    self.graphdef, params, model_state = nnx.split(model, nnx.Param, nnx.BatchStat)
    zero_carry = run.task.zero_carry(model, trainer_step.batch_size)  # host arrays, or None
    self.language_model = zero_carry is not None
    optimizer = optax.sgd(LEARNING_RATE, momentum=MOMENTUM)
    graphdef, language_model = self.graphdef, self.language_model
    images = None if language_model else run.task.images  # a language model's task has no images

    def loss_fn(params, model_state, batch, carry):
      model = nnx.merge(graphdef, params, model_state)
      if language_model:
        logits, carry = model(batch["inputs"], carry, train=True)
        loss = models.softmax_cross_entropy(logits, batch["targets"])
      else:
        logits = model(images(batch), train=True)  # the dataset's normalisation of uint8 pixels, as the trainer's
        loss = models.softmax_cross_entropy(logits, batch["labels"])
      return loss, (nnx.to_pure_dict(nnx.state(model, nnx.BatchStat)), carry)

    def step(params, model_state, opt_state, batch, carry):
      (loss, (model_state, carry)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
          params, model_state, batch, carry)
      updates, opt_state = optimizer.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), model_state, opt_state, carry, loss

    self._step = jax.jit(step, donate_argnums=(0, 1, 2, 4))
    self.params, self.model_state = nnx.to_pure_dict(params), nnx.to_pure_dict(model_state)
    self.opt_state = optimizer.init(self.params)
    self.batch = {k: jnp.asarray(v) for k, v in trainer_step.host_batch.items()}
    # One buffer per leaf (the zero carry may share one), as donation needs.
    self.carry = jax.tree.map(lambda x: jnp.array(np.array(x)), zero_carry) if self.language_model else None

  def compiled(self) -> jax.stages.Compiled:
    """The compiled executable of this step (for cost and memory analysis)."""
    return self._step.lower(self.params, self.model_state, self.opt_state, self.batch,
                            self.carry).compile()

  def __call__(self) -> jax.Array:
    """One step on the fixed batch; returns the loss."""
    self.params, self.model_state, self.opt_state, self.carry, loss = self._step(
        self.params, self.model_state, self.opt_state, self.batch, self.carry)
    return loss


def trace_steps(step: Callable[[], Any], steps: int, directory: pathlib.Path, *, top: int = 15) -> dict:
  """`steps` calls of `step` (after one untraced call) traced with `jax.profiler` into `directory`, each a
  `StepTraceAnnotation`, the device waited for before and after: the traced wall time and the device's busy
  time per step, its share, the kernels per step and the `top` kernels by total time, read from the trace
  (`lbjax.train.trace_analysis`); `device_time` says why not where the trace holds no kernels."""
  jax.block_until_ready(step())
  jax.profiler.start_trace(str(directory))
  start = time.perf_counter()
  for number in range(steps):
    with jax.profiler.StepTraceAnnotation("train", step_num=number + 1):
      result = step()
  jax.block_until_ready(result)
  seconds = time.perf_counter() - start
  jax.profiler.stop_trace()
  path = trace_analysis.latest_trace_file(directory)
  profile = jax.profiler.ProfileData.from_file(str(path))
  platform = jax.devices()[0].platform
  busy = trace_analysis.device_busy(profile, platform)
  record = {"trace": str(path), "steps": steps, "wall_ms_per_step": 1e3 * seconds / steps}
  if busy is None:
    return {**record, "device_time": f"no {platform} kernels in the trace"}
  return {**record, **busy.per_step(steps, seconds),
          "top_kernels": [[name, launches / steps, 1e3 * total / steps]
                          for name, launches, total in trace_analysis.kernel_totals(profile, platform)[:top]]}
