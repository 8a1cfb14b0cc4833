"""ResNet-50 end to end: the trainer fed by JPEG decoding on worker processes, against its bare step.

One measurement (one point of a grid) in three parts, each in its own process so that the XLA flags
apply and each has the accelerator's memory to itself:

  data   ImageNet-like JPEGs (`lbjax.data.synthetic_jpeg`: 1/f content, quality 90, ImageNet's spread
         of sizes) written as a TFDS `imagenet2012` in array_record files, as `tfds build` leaves
         it: `--train-images` records cycling through `--distinct-images` distinct JPEGs, and a
         small validation split. Written once per folder (kept for the next points).
  step   the trainer's compiled step for the run's config (`workloads.TrainerStep`, built on the
         `Run` the trainer drives) called back to back on one batch already on the device, in
         `--rounds` rounds of `--step-repeats` steps; with `--compare-momentum` the same step with
         LARS in the flat layout (`optimizer.layout=flat`) and with momentum SGD in the same rounds
         (the LARS / momentum ratio of issue 29, per leaf and flat); with `--compare-state-layouts` the
         same step with its state in the layouts XLA prefers for it (`workloads.STATE_LAYOUTS`); with
         `--trace-steps N`, then N steps traced with `jax.profiler` (into the work root's `step_trace_*`):
         the device's busy time and the kernels that take the step's time (`lbjax.train.trace_analysis`).
  loop   the real trainer, `python -m lbjax.main --config resnet50_imagenet:batch=B` (LARS, bf16,
         LEGW recipe) on that data, decoded by `--decode-workers` grain worker processes: the
         whole loop (stream, placement, metrics, hooks), no checkpoint and no evaluation in the
         timed window. Its rate is read from its `train` records (one per `--log-every` steps)
         after the first `--warmup-windows`; once `--windows` more are written it gets a SIGTERM
         (it saves and exits, outside the timed window).

Reported: images/s of the step and of the loop, and the loop's fraction of the step's rate. Each
run appends one JSON line to `--results`; `--table FILE` writes the README section from such a file.

    python -m benchmarks.resnet50_end_to_end [--batch-per-device 256] [--decode-workers 14]
        [--xla-flags FLAGS] [--max-device-batch 0] [--compare-momentum] [--compare-state-layouts]
        [--step-only] [--trace-steps N] [--override --config.FIELD=VALUE ...] [--results FILE]
    python -m benchmarks.resnet50_end_to_end --dry-run    # the same path at tiny sizes on a CPU
    python -m benchmarks.resnet50_end_to_end --table FILE [--no-readme]

`--dry-run` trains ResNetTiny on 32x32 crops of 64 JPEGs (float32, batch 8, one decode worker):
every part runs as on the GPU, only smaller.
"""

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import pathlib
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from lbjax.data import synthetic_jpeg

CONFIG = "resnet50_imagenet"
STEP_RESULT = "STEP_RESULT "
TITLE = "ResNet-50 end to end: the trainer fed by JPEG decoding, vs its bare step"
# XLA GPU flag sets the grid names (`--xla-flags` also takes a literal flag string).
XLA_FLAG_SETS = {
    "default": "",
    "latency_hiding": "--xla_gpu_enable_latency_hiding_scheduler=true",
    "no_command_buffers": "--xla_gpu_enable_command_buffer=",
    "latency_hiding_no_command_buffers": ("--xla_gpu_enable_latency_hiding_scheduler=true "
                                          "--xla_gpu_enable_command_buffer="),
}
DRY_RUN = {"batch_per_device": 8, "decode_workers": 1, "train_images": 64, "distinct_images": 16,
           "validation_images": 8, "image_size": 32, "log_every": 2, "warmup_windows": 1, "windows": 2,
           "rounds": 2, "step_repeats": 2}
DRY_RUN_OVERRIDES = ("--config.model=ResNetTiny", "--config.model_options.bn_group_size=8",
                     "--config.model_options.dtype=float32")


def _jpeg(seed: int, index: int) -> bytes:
  """Distinct JPEG `index` (its own generator: the same bytes whatever the number of processes)."""
  rng = np.random.default_rng([seed, index])
  (height, width), = synthetic_jpeg.imagenet_like_sizes(rng, 1)
  return synthetic_jpeg.encode_jpeg(synthetic_jpeg.pink_noise_image(rng, height, width))


def write_imagenet_like(data_dir: pathlib.Path, *, train_images: int, distinct_images: int,
                        validation_images: int, seed: int = 0) -> float:
  """Writes the TFDS `imagenet2012` folder under `data_dir` (skipped when it holds the same); returns
  the seconds it took."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  from array_record.python import array_record_module  # pylint: disable=import-outside-toplevel
  start = time.perf_counter()
  recipe = {"train_images": train_images, "distinct_images": distinct_images,
            "validation_images": validation_images, "seed": seed}
  builder = tfds.builder("imagenet2012", data_dir=os.fspath(data_dir), file_format="array_record")
  marker = pathlib.Path(builder.data_dir) / "lbjax_benchmark.json"
  if marker.exists() and json.loads(marker.read_text()) == recipe:
    return 0.0
  os.makedirs(builder.data_dir, exist_ok=True)
  count = distinct_images + validation_images
  processes = min(os.cpu_count() or 1, count)
  # Spawned, not forked: the caller may hold JAX's threads (a fork of them can deadlock).
  with concurrent.futures.ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
    jpegs = list(pool.map(_jpeg, [seed] * count, range(count), chunksize=8))
  features, splits = builder.info.features, []
  for split, size, pool_of in (("train", train_images, jpegs[:distinct_images]),
                               ("validation", validation_images, jpegs[distinct_images:])):
    template = tfds.core.ShardedFileTemplate(
        data_dir=builder.data_dir, template="{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}",
        dataset_name="imagenet2012", split=split, filetype_suffix="array_record")
    path = template.sharded_filepath(shard_index=0, num_shards=1)
    writer = array_record_module.ArrayRecordWriter(os.fspath(path), "group_size:1")
    num_bytes = 0
    for index in range(size):
      record = features.serialize_example({"image": pool_of[index % len(pool_of)], "label": index % 1000,
                                           "file_name": f"{split}_{index}.JPEG"})
      writer.write(record)
      num_bytes += len(record)
    writer.close()
    splits.append(tfds.core.SplitInfo(name=split, shard_lengths=[size], num_bytes=num_bytes,
                                      filename_template=template))
  builder.info.set_splits(tfds.core.SplitDict(splits))
  builder.info.set_file_format("array_record")
  builder.info.write_to_directory(builder.data_dir)
  marker.write_text(json.dumps(recipe))
  return time.perf_counter() - start


def run_overrides(args, data_dir: pathlib.Path, *, num_workers: int) -> list[str]:
  """The `--config.` overrides of one point (the trainer's command line and the step's config)."""
  overrides = [f"--config.data_dir={data_dir}", f"--config.data_options.image_size={args.image_size}",
               f"--config.data_options.num_workers={num_workers}",
               f"--config.max_device_batch={args.max_device_batch}",
               f"--config.eval_batch_size={args.validation_images}", "--config.checkpoint_every_steps=0",
               "--config.eval_every_epochs=1000.0", f"--config.log_every={args.log_every}",
               f"--config.num_steps={args.log_every * (args.warmup_windows + args.windows + 2)}"]
  return overrides + list(DRY_RUN_OVERRIDES if args.dry_run else ()) + args.override


def run_spec(args) -> str:
  """The config the step and the trainer run: `resnet50_imagenet` at the device's batch (one device)."""
  return f"{CONFIG}:batch={args.batch_per_device}"


def config_problem(args) -> str | None:
  """Why the step process or the trainer would refuse their config (`--override`s and the flags that set config
  fields, resolved and validated as `lbjax.main` does: `config_files.load`, `validation.validate`), or None.
  Checked before any data is written; it imports lbjax's configs (and jax) but starts no backend."""
  from lbjax import config_files  # pylint: disable=import-outside-toplevel
  from lbjax.train import validation  # pylint: disable=import-outside-toplevel
  from lbjax.train.errors import ConfigError  # pylint: disable=import-outside-toplevel
  try:
    for num_workers in sorted({0, args.decode_workers}):  # the step's config, then the trainer's
      validation.validate(config_files.load(run_spec(args), run_overrides(args, pathlib.Path(args.data_dir),
                                                                          num_workers=num_workers)).config)
  except ConfigError as error:
    return (f"the step and the trainer would refuse their config ({run_spec(args)} with this command's sizes and "
            f"--override values); nothing was built or run. {error}")
  return None


def paths_problem(args) -> str | None:
  """What keeps this command from writing where its flags point, found before anything is written, or None:
  `--data-dir`, `--work-root` and `--compilation-cache` must be folders it can create or write
  (`workdir_lock.blocked_folder`), `--results` a file it can append to in such a folder."""
  from lbjax.train import workdir_lock  # pylint: disable=import-outside-toplevel
  for flag, folder in (("--data-dir", args.data_dir), ("--work-root", args.work_root),
                       ("--compilation-cache", args.compilation_cache)):
    if folder and (blocked := workdir_lock.blocked_folder(folder)):
      return (f"{flag} {folder!r} cannot be used as a folder: {workdir_lock.blocked_reason(*blocked)}. Name a folder "
              "this process can create and write.")
  if not args.results:
    return None
  results = pathlib.Path(args.results)
  if results.is_dir():
    return (f"--results {args.results!r} is a directory; --results names the file each row is appended to, e.g. "
            f"{str(results / 'rows.jsonl')!r}.")
  if blocked := workdir_lock.blocked_folder(results.parent):
    return (f"--results {args.results!r}: {workdir_lock.blocked_reason(*blocked)}. Name a file in a folder this "
            "process can write.")
  if results.exists() and not os.access(results, os.W_OK):
    return f"--results {args.results!r} is not writable by this process: each row is appended to it."
  return None


def _environment(args) -> dict[str, str]:
  env = dict(os.environ)
  env["XLA_FLAGS"] = " ".join(filter(None, (env.get("XLA_FLAGS", ""), XLA_FLAG_SETS.get(args.xla_flags,
                                                                                       args.xla_flags))))
  env["JAX_COMPILATION_CACHE_DIR"] = args.compilation_cache  # the loop may reuse the step's compile
  env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  return env


def measure_step(spec: str, overrides: list[str], rounds: int, repeats: int, momentum: bool,
                 state_layouts: bool = False, jax_relu: bool = False, trace_steps: int = 0,
                 trace_dir: pathlib.Path | None = None) -> dict:
  """Runs in the step process: the trainer's compiled step (and momentum SGD's, the step with the state in
  XLA's layouts, the step with `jax.nn.relu` in the model instead of `lbjax.models.relu`) on a placed batch;
  then, with `trace_steps`, the step traced (`workloads.trace_steps`)."""
  import jax  # pylint: disable=import-outside-toplevel
  import ml_collections  # pylint: disable=import-outside-toplevel
  from benchmarks import report  # pylint: disable=import-outside-toplevel
  from benchmarks import workloads  # pylint: disable=import-outside-toplevel
  from lbjax import config_files  # pylint: disable=import-outside-toplevel
  config = config_files.load(spec, overrides).config
  steps = {"lars": workloads.TrainerStep(config)}
  if momentum:
    for name, section in (("lars_flat", {**config.optimizer.to_dict(), "layout": "flat"}),
                          ("momentum", {"name": "momentum", "momentum": 0.9})):
      other = ml_collections.ConfigDict(config.to_dict())
      other.optimizer = section
      steps[name] = workloads.TrainerStep(other)
  if state_layouts:
    steps["lars_xla_layouts"] = workloads.TrainerStep(config, state_layouts="xla")
  if jax_relu:  # the model's ReLU swapped while this step is traced and compiled (TrainerStep compiles at once)
    from unittest import mock  # pylint: disable=import-outside-toplevel
    from lbjax.models import resnet  # pylint: disable=import-outside-toplevel
    with mock.patch.object(resnet, "relu", jax.nn.relu):
      steps["lars_jax_relu"] = workloads.TrainerStep(config)
  try:
    times = report.round_seconds(steps, rounds=rounds, repeats=repeats)
    traced = workloads.trace_steps(steps["lars"], trace_steps, trace_dir) if trace_steps else None
  finally:
    for step in steps.values():
      step.close()
  result = {"device": jax.devices()[0].device_kind, "jax": jax.__version__,
            "step_seconds": {name: statistics.median(values) for name, values in times.items()},
            "step_seconds_quartiles": {name: report.Spread.of(values).format(1e3) for name, values in times.items()}}
  if momentum:
    for name, baseline in (("lars", "momentum"), ("lars_flat", "momentum"), ("lars_flat", "lars")):
      result[f"{name}_over_{baseline}"] = report.paired_ratios(times, name, baseline).format(digits=3)
  if state_layouts:
    result["lars_xla_layouts_over_lars"] = report.paired_ratios(times, "lars_xla_layouts", "lars").format(digits=3)
  if jax_relu:
    result["jax_relu_over_lars"] = report.paired_ratios(times, "lars_jax_relu", "lars").format(digits=3)
  if traced is not None:
    result["step_trace"] = traced
  return result


def _train_records(workdir: pathlib.Path) -> list[dict]:
  path = workdir / "metrics.jsonl"
  if not path.exists():
    return []
  records = []
  for line in path.read_text().splitlines():
    try:
      record = json.loads(line)
    except json.JSONDecodeError:  # a line being written
      continue
    if record.get("kind") == "train":
      records.append(record)
  return records


def measure_loop(args, spec: str, overrides: list[str], env: dict[str, str], workdir: pathlib.Path) -> dict:
  """Runs the trainer until `--windows` timed windows are recorded (then SIGTERM); its images/s."""
  command = [sys.executable, "-m", "lbjax.main", "--config", spec, f"--workdir={workdir}", *overrides,
             "--config.progress=False"]
  needed = args.warmup_windows + args.windows
  log = workdir.with_suffix(".log")
  start = time.perf_counter()
  with open(log, "w") as output:
    process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    try:
      while process.poll() is None and len(_train_records(workdir)) < needed:
        if time.perf_counter() - start > args.loop_timeout:
          break
        time.sleep(0.5)
      if process.poll() is None:
        process.send_signal(signal.SIGTERM)  # the trainer saves and exits
      process.wait(timeout=120)
    finally:  # a timeout, or this process stopped (SIGTERM from the suite's limit): no trainer left behind
      if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
  records = _train_records(workdir)
  timed = records[args.warmup_windows:needed]
  if len(timed) < args.windows:
    tail = "\n".join(log.read_text().splitlines()[-15:])
    raise SystemExit(f"The trainer wrote {len(records)} train records ({needed} needed) before it ended "
                     f"(exit status {process.returncode}, {time.perf_counter() - start:.0f} s); "
                     f"its log {log} ends:\n{tail}")
  seconds_per_step = statistics.fmean(r["batch_size"] / r["examples_per_second"] for r in timed)
  return {"command": " ".join(command), "loop_seconds_per_step": seconds_per_step,
          "loop_windows": [round(r["examples_per_second"], 1) for r in timed],
          "loop_exit_status": process.returncode, "loop_wall_seconds": time.perf_counter() - start}


def _failure_of(stderr: str, tail_chars: int = 3000) -> str:
  """What a failed process's stderr says: its fatal log lines (XLA's `F1128 ... Check failed: ...`, which a
  native abort's stack trace then buries) and Python errors, then the tail."""
  fatal = [line for line in stderr.splitlines()
           if re.match(r"[EF]\d{4} ", line) or "Check failed" in line or re.match(r"\w+(Error|Exception): ", line)]
  head = ["(fatal lines)", *fatal[:20], "(the end of stderr)", ""] if fatal else []
  return "\n".join(head) + stderr[-tail_chars:]


def _subprocess_step(args, spec: str, overrides: list[str], env: dict[str, str]) -> dict:
  command = [sys.executable, "-m", "benchmarks.resnet50_end_to_end", "--measure-step", spec,
             f"--rounds={args.rounds}", f"--step-repeats={args.step_repeats}"]
  command += ["--compare-momentum"] * args.compare_momentum + ["--compare-state-layouts"] * args.compare_state_layouts
  command += ["--compare-jax-relu"] * args.compare_jax_relu
  if args.trace_steps:
    trace_dir = pathlib.Path(tempfile.mkdtemp(prefix=f"step_trace_b{args.batch_per_device}_", dir=args.work_root))
    command += [f"--trace-steps={args.trace_steps}", f"--trace-dir={trace_dir}"]
  command += ["--", *overrides]
  try:
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.step_timeout, check=False)
  except subprocess.TimeoutExpired as e:
    raise SystemExit(f"The step process (compiling and timing {spec}) ran past --step-timeout "
                     f"{args.step_timeout:.0f} s and was stopped; give it more (a CPU compiles ResNet-50 for "
                     f"minutes) or fewer --rounds/--step-repeats.") from e
  lines = [line for line in done.stdout.splitlines() if line.startswith(STEP_RESULT)]
  if done.returncode or not lines:
    raise SystemExit(f"The step process failed (status {done.returncode}):\n{_failure_of(done.stderr)}")
  return json.loads(lines[-1][len(STEP_RESULT):])


def _commit() -> str:
  """The lbjax commit measured (`git rev-parse --short HEAD` of this checkout; "" outside a git checkout)."""
  try:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=pathlib.Path(__file__).resolve().parents[1],
                          capture_output=True, text=True, timeout=30, check=False)
  except OSError:
    return ""
  return done.stdout.strip() if done.returncode == 0 else ""


def measure(args) -> dict:
  """One point: data, step, loop; the result row (also appended to `--results`)."""
  data_dir = pathlib.Path(args.data_dir)
  write_seconds = write_imagenet_like(data_dir, train_images=args.train_images, distinct_images=args.distinct_images,
                                      validation_images=args.validation_images)
  spec = run_spec(args)
  env = _environment(args)
  step = _subprocess_step(args, spec, run_overrides(args, data_dir, num_workers=0), env)
  batch = args.batch_per_device
  row = {"device": step["device"], "jax": step["jax"], "batch_per_device": batch,
         "decode_workers": args.decode_workers, "xla_flags": args.xla_flags, "max_device_batch": args.max_device_batch,
         "overrides": args.override, "image_size": args.image_size, "cpu_count": os.cpu_count(),
         "dry_run": args.dry_run, "step_images_per_second": batch / step["step_seconds"]["lars"],
         "step_ms": step["step_seconds_quartiles"]["lars"], "data_write_seconds": round(write_seconds, 1),
         "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": _commit()}
  if not args.step_only:
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="rn50-e2e-", dir=args.work_root))
    loop = measure_loop(args, spec, run_overrides(args, data_dir, num_workers=args.decode_workers), env, workdir)
    row.update(loop, loop_images_per_second=batch / loop["loop_seconds_per_step"])
    row["fraction_of_step"] = row["loop_images_per_second"] / row["step_images_per_second"]
  if args.compare_momentum:
    row["momentum_step_images_per_second"] = batch / step["step_seconds"]["momentum"]
    for ratio in ("lars_over_momentum", "lars_flat_over_momentum", "lars_flat_over_lars"):
      row[ratio] = step[ratio]
  if args.compare_state_layouts:
    row["lars_xla_layouts_over_lars"] = step["lars_xla_layouts_over_lars"]
  if args.compare_jax_relu:
    row["jax_relu_over_lars"] = step["jax_relu_over_lars"]
  if "step_trace" in step:
    row["step_trace"] = step["step_trace"]
  if args.results:
    pathlib.Path(args.results).parent.mkdir(parents=True, exist_ok=True)
    with open(args.results, "a") as f:
      f.write(json.dumps(row) + "\n")
  return row


def table(rows: list[dict]) -> str:
  from benchmarks import report  # pylint: disable=import-outside-toplevel
  lines = [[r["device"], r["measured_at"][:10] + (f" ({r['commit']})" if r.get("commit") else ""),
            r["batch_per_device"], r["decode_workers"], r["xla_flags"] or "default",
            r["max_device_batch"], " ".join(r["overrides"]), f"{r['step_images_per_second']:,.0f}",
            f"{r['loop_images_per_second']:,.0f}" if "loop_images_per_second" in r else "(step only)",
            f"{r['fraction_of_step']:.3f}" if "fraction_of_step" in r else "", r.get("lars_over_momentum", ""),
            r.get("lars_flat_over_momentum", ""), r.get("lars_xla_layouts_over_lars", ""),
            r.get("jax_relu_over_lars", ""),
            f"{100 * r['step_trace']['device_busy_fraction']:.0f}%"
            if "device_busy_fraction" in r.get("step_trace", {}) else ""]
           for r in rows]
  return report.markdown_table(["device", "measured (commit)", "batch per device", "decode workers", "XLA flags",
                                "max_device_batch", "other overrides", "step images/s (LARS)", "whole loop images/s",
                                "loop / step rate",
                                "LARS / momentum step time", "LARS flat layout / momentum step time",
                                "XLA's state layouts / row-major step time",
                                "jax.nn.relu / lbjax.models.relu step time", "device busy in the traced step"],
                               lines)


def row_command(row: dict) -> str:
  """The command that measures `row`'s point."""
  words = ["python -m benchmarks.resnet50_end_to_end", f"--batch-per-device {row['batch_per_device']}",
           f"--decode-workers {row['decode_workers']}", f"--xla-flags {row['xla_flags']}"]
  if row["max_device_batch"]:
    words.append(f"--max-device-batch {row['max_device_batch']}")
  words += [f"--override={override}" for override in row["overrides"]]
  if "lars_over_momentum" in row:
    words.append("--compare-momentum")
  if "lars_xla_layouts_over_lars" in row:
    words.append("--compare-state-layouts")
  if "jax_relu_over_lars" in row:
    words.append("--compare-jax-relu")
  if "loop_images_per_second" not in row:
    words.append("--step-only")
  if "step_trace" in row:
    words.append(f"--trace-steps {row['step_trace'].get('steps', 5)}")
  return " ".join(words)


# The fields `table` and `row_command` read from every row (the others are optional).
ROW_FIELDS = ("device", "jax", "cpu_count", "measured_at", "batch_per_device", "decode_workers", "xla_flags",
              "max_device_batch", "overrides", "step_images_per_second", "dry_run")


def read_rows(results: pathlib.Path) -> list[dict]:
  """The rows of a results file, one JSON object a line (blank lines skipped); exits naming the file and the
  line of one that is not JSON or not a row."""
  rows = []
  for number, line in enumerate(results.read_text().splitlines(), start=1):
    if not line.strip():
      continue
    where = f"--table {results}, line {number}"
    try:
      row = json.loads(line)
    except json.JSONDecodeError as e:
      raise SystemExit(f"{where} is not JSON ({e.msg}): {line[:80]!r}. --table reads a results file that --results "
                       "wrote, one JSON row a line (the GPU suite keeps them in benchmarks/resnet50_end_to_end.jsonl)."
                       ) from None
    missing = [field for field in ROW_FIELDS if field not in row] if isinstance(row, dict) else list(ROW_FIELDS)
    if missing:
      raise SystemExit(f"{where} is not a row that --results wrote: it lacks {', '.join(missing)}.")
    rows.append(row)
  return rows


def write_table(results: pathlib.Path, no_readme: bool) -> None:
  """The README section from every measured row of `results` (rows may come from several GPU sessions)."""
  from benchmarks import report  # pylint: disable=import-outside-toplevel
  if not results.is_file():
    raise SystemExit(f"--table {results}: no such file; --table reads a results file that --results wrote "
                     f"(the GPU suite keeps them in benchmarks/resnet50_end_to_end.jsonl) and measures nothing.")
  rows = [r for r in read_rows(results) if not r["dry_run"]]
  if not rows:
    raise SystemExit(f"{results} holds no measured (non dry-run) rows.")
  dates_by_machine = {}
  for r in rows:
    machine = f"1 x {r['device']}, jax {r['jax']}, {r['cpu_count']} CPU cores"
    dates_by_machine.setdefault(machine, set()).add(r["measured_at"])
  machines = [f"{machine} ({', '.join(sorted(dates))})" for machine, dates in dates_by_machine.items()]
  commands = "\n".join(f"    {row_command(r)}" for r in rows)
  notes = ("Step: the trainer's compiled step (`resnet50_imagenet`: LARS, "
           "bfloat16 compute, ghost BN 32) on one batch on the device, median [quartiles] of its rounds. Loop: "
           "`python -m lbjax.main --config resnet50_imagenet:batch=B` on ImageNet-like JPEGs (TFDS imagenet2012 "
           "written on the machine), decoded at reduced DCT scale by grain worker processes; the rate is the mean "
           "over the timed windows after the warm-up windows, no checkpoint or evaluation among them. LARS / "
           "momentum (LARS per leaf, and in the flat layout, `optimizer.layout=flat`), and XLA's state layouts / "
           "row-major (the step compiled with `Layout.AUTO` for the state, which is placed in what XLA chose; the "
           "trainer places it row-major): per-round ratio of step times in the same rounds, median [quartiles]. "
           "Device busy in the traced step (`--trace-steps`): the share of the wall time of a few traced steps "
           "in which the device ran kernels (`lbjax.train.trace_analysis`); the row's `step_trace` in the results "
           "file lists the kernels that take the step's time, and the suite's archive holds the trace. "
           "Each row's windows are in the results file. Rows keep what the code of their date measured: a later "
           "change is in the rows measured after it only (the stem's max-pool gradient stopped being a scatter-add "
           "on GPUs on 2026-11-27 at 12:19 UTC, after the 08:45-08:53 rows: Findings 11).")
  body = (f"Rows, in order (`bash benchmarks/gpu_suite.sh` runs them on the device machine; `--unpack` adds its "
          f"rows to `{results}` and writes this section with `python -m benchmarks.resnet50_end_to_end --table "
          f"{results}`; what each part does: the module's docstring):\n\n{commands}\n\n"
          f"Machines: {'; '.join(machines)}\n\n{table(rows)}\n\n{notes}")
  print(body)
  if not no_readme:
    report.write_section("resnet50-end-to-end", TITLE, body, per_platform=False)


def _refuse_flags_the_mode_ignores(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
  """Exit 2 on a flag that `--table` or `--dry-run` would not use. (`report` is imported only in those two modes;
  a measurement's parent imports jax only through `config_problem`, and starts no backend: the GPU is the
  children's.)"""
  if args.table:
    from benchmarks import report  # pylint: disable=import-outside-toplevel
    unused = report.flags_given(parser, args, [name for name in vars(args) if name not in ("table", "no_readme")])
    if unused:
      parser.error(f"--table writes the README section from a results file and measures nothing: drop "
                   f"{', '.join(unused)}, or run the measurement as a command of its own.")
  elif args.no_readme:
    parser.error("--no-readme goes with --table: a measurement writes no README section (its row goes to --results).")
  if args.dry_run:
    from benchmarks import report  # pylint: disable=import-outside-toplevel
    sized = report.flags_given(parser, args, DRY_RUN)
    if sized:
      parser.error(f"--dry-run measures at its own tiny sizes: drop {', '.join(sized)}, or drop --dry-run to "
                   "measure at those.")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch-per-device", type=int, default=256)
  parser.add_argument("--decode-workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
  parser.add_argument("--xla-flags", default="default",
                      help=f"one of {', '.join(XLA_FLAG_SETS)}, or literal XLA flags")
  parser.add_argument("--max-device-batch", type=int, default=0,
                      help="config.max_device_batch (0: the whole per-device batch in one pass; the config's is 128)")
  parser.add_argument("--compare-momentum", action="store_true",
                      help="also time the step with LARS in the flat layout and with momentum SGD")
  parser.add_argument("--compare-state-layouts", action="store_true",
                      help="also time the step with the train state in the layouts XLA prefers for it "
                           "(benchmarks.workloads.STATE_LAYOUTS; the trainer places it row-major)")
  parser.add_argument("--compare-jax-relu", action="store_true",
                      help="also time the step with jax.nn.relu in the model instead of lbjax.models.relu "
                           "(whose derivative reads its output, kept behind a barrier on GPUs)")
  parser.add_argument("--step-only", action="store_true", help="time the step only (no trainer run)")
  parser.add_argument("--trace-steps", type=int, default=0,
                      help="then trace this many steps of the step with jax.profiler (kept under --work-root)")
  parser.add_argument("--trace-dir", default=None, help=argparse.SUPPRESS)
  parser.add_argument("--override", action="append", default=[],
                      help="one more --config.<field>=<value> for the step and the trainer, written "
                           "--override=--config.<field>=<value> (repeatable)")
  parser.add_argument("--image-size", type=int, default=224)
  parser.add_argument("--train-images", type=int, default=16384)
  parser.add_argument("--distinct-images", type=int, default=2048)
  parser.add_argument("--validation-images", type=int, default=64)
  parser.add_argument("--log-every", type=int, default=20)
  parser.add_argument("--warmup-windows", type=int, default=2)
  parser.add_argument("--windows", type=int, default=5, help="timed windows of the loop")
  parser.add_argument("--rounds", type=int, default=5, help="rounds of the step measurement")
  parser.add_argument("--step-repeats", type=int, default=20, help="steps per round of the step measurement")
  parser.add_argument("--step-timeout", type=float, default=400.0, help="seconds for the step process")
  parser.add_argument("--loop-timeout", type=float, default=400.0, help="seconds for the trainer process")
  parser.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "lbjax-imagenet-like"))
  parser.add_argument("--work-root", default=None, help="where the trainer's workdirs go (default: a temp dir)")
  parser.add_argument("--compilation-cache", default=os.path.join(tempfile.gettempdir(), "lbjax-e2e-jax-cache"))
  parser.add_argument("--results", default=None, help="append the row as one JSON line to this file")
  parser.add_argument("--dry-run", action="store_true", help="tiny sizes, ResNetTiny: checks the path on a CPU")
  parser.add_argument("--table", default=None, help="write the README section from this results file and exit")
  parser.add_argument("--no-readme", action="store_true", help="with --table: print only")
  parser.add_argument("--measure-step", default=None, help=argparse.SUPPRESS)
  args, rest = parser.parse_known_args()
  signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # the `finally`s stop the children
  if args.measure_step:
    from lbjax.train.errors import exit_on_user_errors  # pylint: disable=import-outside-toplevel
    overrides = [a for a in rest if a != "--"]
    with exit_on_user_errors("the step process"):
      result = measure_step(args.measure_step, overrides, args.rounds, args.step_repeats, args.compare_momentum,
                            args.compare_state_layouts, args.compare_jax_relu, args.trace_steps,
                            pathlib.Path(args.trace_dir) if args.trace_dir else None)
    print(STEP_RESULT + json.dumps(result), flush=True)
    return
  if rest:
    parser.error(f"unexpected arguments {rest}")
  _refuse_flags_the_mode_ignores(parser, args)
  if any(not o.startswith("--config.") or "=" not in o for o in args.override):
    parser.error(f"--override takes --config.<field>=<value>, got {args.override}")
  if args.table:
    write_table(pathlib.Path(args.table), args.no_readme)
    return
  if args.dry_run:
    for name, value in DRY_RUN.items():
      setattr(args, name, value)
    if args.data_dir == parser.get_default("data_dir"):
      args.data_dir += "-dry-run"
  if min(args.batch_per_device, args.decode_workers, args.train_images, args.distinct_images,
         args.validation_images, args.log_every, args.windows, args.rounds, args.step_repeats) < 1:
    parser.error("sizes, counts and --decode-workers must be >= 1")
  if args.trace_steps < 0:
    parser.error("--trace-steps must be >= 0 (0: no trace)")
  if args.train_images < args.batch_per_device:
    parser.error("--train-images must be at least --batch-per-device")
  refused = paths_problem(args) or config_problem(args)
  if refused:
    parser.error(refused)
  if args.work_root:  # where the trace and the loop's workdir go (tempfile.mkdtemp makes no parent folders)
    pathlib.Path(args.work_root).mkdir(parents=True, exist_ok=True)
  row = measure(args)
  print(json.dumps(row, indent=1))
  if not args.step_only:
    print(f"step {row['step_images_per_second']:,.0f} images/s, loop {row['loop_images_per_second']:,.0f} "
          f"images/s: {row['fraction_of_step']:.3f} of the step's rate", flush=True)


if __name__ == "__main__":
  main()
