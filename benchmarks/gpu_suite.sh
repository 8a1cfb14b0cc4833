#!/usr/bin/env bash
# Every GPU measurement of issue 29, each under its own time limit, packed into one archive.
#
#   bash benchmarks/gpu_suite.sh --prepare                 # here: build .whl/ (git-ignored, < 64 MiB) to carry
#   bash benchmarks/gpu_suite.sh [--parts LIST] [--out DIR] # on the device machine (default --out: $OUT)
#   bash benchmarks/gpu_suite.sh --dry-run [--out DIR]     # here: every part at tiny sizes on the CPU
#   bash benchmarks/gpu_suite.sh --unpack ARCHIVE...       # here: the archives' tables into benchmarks/README.md
#
# Parts (in this order; --parts takes a comma-separated subset):
#   install        unpack .whl/site-cp312.tar.xz into /tmp/site and drop every package the image already
#                  has at the same or a newer version (the image's jax, flax and their stack are never
#                  shadowed); records the versions in use
#   e2e            benchmarks/resnet50_end_to_end.py: the grid below (each point its own limit); the first
#                  point also times the step with LARS in the flat layout and with momentum SGD in the same
#                  rounds (ResNet-50 step, LARS per leaf and flat / momentum)
#   e2e_more       the rest of the grid (another device call)
#   loop           benchmarks/train_loop.py: whole loop vs bare step, MNIST LSTM (B=128) and ResNet-tiny,
#                  also with 10 steps per device call (config.steps_per_call) and that program alone, and
#                  with the training set held on the device (config.train_data_on_device), and with the
#                  batches drawn ahead but placed by the step's call
#   loop_trace     benchmarks/loop_trace.py: the same two models' loops traced with jax.profiler (config.profile),
#                  fed four ways (as configured, training set on the device, 10 steps per call, both): the share
#                  of the loop's time the GPU computes, beside the bare step's; their traces kept in the archive
#                  (traces/)
#   optimizer      benchmarks/optimizer.py on the ResNet-50 tree: lars and lamb per leaf, in the flat and the
#                  fused layout (Pallas kernels, lbjax.optim.fused) and optax's, 50 updates per call; each
#                  row's call also traced (the kernels' device time per update, the kernels that take it)
#   fused_tests    tests/optim/test_fused.py with the Pallas kernels compiled by Triton for the GPU (on the
#                  CPU they run in Pallas's interpreter): LARS, LAMB, PercentDelta and momentum SGD (Nesterov,
#                  bfloat16 leaves and state, no selected leaf, inject_hyperparams, MultiSteps, shard_map,
#                  vmap) against the per-leaf layout on the GPU itself
#   step_options   the ResNet-50 step alone, as configured and with LARS in the flat layout (each also, in the
#                  same rounds, with the state in the layouts XLA prefers: --compare-state-layouts) and with
#                  each switch that trades speed for
#                  numerics: --config.deterministic=True (issue 30),
#                  --config.model_options.param_dtype_gradients=True (float32 kernel gradients) and
#                  --config.model_options.bn_group_size=256 (BN over the device's batch, not ghost BN 32),
#                  and --max-device-batch=128 (the resnet50_imagenet config's own: two accumulated halves)
#   max_pool       benchmarks/max_pool.py: the ResNet stem's max-pool gradient, JAX's select-and-scatter vs
#                  lbjax.models.pooling's placements (what the trainer uses on GPUs), with XLA's defaults and
#                  with the deterministic-ops flags
#   repeatability  benchmarks/repeatability.py: the PTB LSTM and ResNet-tiny (synthetic data) trained twice,
#                  each run in a process of its own, with XLA's defaults and with config.deterministic=True;
#                  are the two final states bit-identical?
#   xla_flags      benchmarks/xla_flags.py: the MNIST LSTM (B=128) and PTB LSTM (B=20) steps with XLA's
#                  defaults, with command buffers (CUDA graphs) that take in while loops and conditionals,
#                  and with none, each in processes of its own, alternated
# Each part's log, the results file and benchmarks/README.md (with the sections the benchmarks wrote) are
# packed into <out>/gpu_suite.tgz after every part, so a call cut short still returns what it finished.
# A part that fails does not stop the next ones; the suite then ends with exit status 1, naming them.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
WHEELS="$ROOT/.whl"
SITE="${SITE:-/tmp/site}"  # where the carried packages are unpacked
MODE=run
PARTS="install,e2e,loop,loop_trace,optimizer,fused_tests,step_options,max_pool,repeatability,xla_flags"
OUT_DIR="${OUT:-$ROOT/gpu_suite_out}"
ARCHIVES_IN=()
E2E_RESULTS="benchmarks/resnet50_end_to_end.jsonl"  # every GPU session's end-to-end rows, committed

while [ $# -gt 0 ]; do
  case "$1" in
    --prepare) MODE=prepare ;;
    --dry-run) MODE=dry-run ;;
    --unpack) MODE=unpack; shift; ARCHIVES_IN=("$@"); [ $# -gt 0 ] || { echo "--unpack needs archives" >&2; exit 2; }
              break ;;
    --parts) PARTS="${2:?--parts needs a list}"; shift ;;
    --out) OUT_DIR="${2:?--out needs a folder}"; shift ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 0 ;;  # the comment block above
    *) echo "gpu_suite.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

# Time limits of the parts, in seconds (a device call runs at most 600 s; a session has about 900 s).
LIMIT_INSTALL=60
LIMIT_E2E_POINT=220  # 200 before the first point traced its step (--trace-steps 5: a few seconds more, not yet timed on a GPU)
LIMIT_LOOP=300
LIMIT_LOOP_TRACE=240
LIMIT_OPTIMIZER=360
LIMIT_FUSED_TESTS=240  # 25 tests of small trees (the deviceless one left out); not yet run on a GPU
LIMIT_STEP_OPTIONS=420
LIMIT_MAX_POOL=60
LIMIT_REPEATABILITY=240
LIMIT_XLA_FLAGS=200
if [ "$MODE" = dry-run ]; then  # tiny sizes, but a CPU compiles and steps slowly (and this one is shared)
  LIMIT_INSTALL=300 LIMIT_E2E_POINT=900 LIMIT_LOOP=600 LIMIT_LOOP_TRACE=600 LIMIT_OPTIMIZER=300 LIMIT_FUSED_TESTS=600 LIMIT_STEP_OPTIONS=1200 LIMIT_MAX_POOL=300
  LIMIT_REPEATABILITY=600 LIMIT_XLA_FLAGS=600
fi
# The end-to-end grid: batch per device, decode workers, XLA flag set (benchmarks/resnet50_end_to_end.py), and
# optionally one config override. At 384 per GPU, as configured and with BatchNorm over the device's batch
# (MLPerf's; its step alone was 0.947x the ghost-BN step at 256 on 2026-11-30).
E2E_FIRST=("256 14 default")
E2E_MORE=("384 14 latency_hiding" "384 14 latency_hiding --config.model_options.bn_group_size=384")
# measured 2026-11-27: "256 14 latency_hiding" "384 14 default"; not yet: "512 14 latency_hiding"

# The packages lbjax needs beyond the device image (jax 0.11.2, flax 0.12.10 and their stack), pinned to
# the versions the project's newest test environment runs. optax and orbax are fallbacks: the image's are
# used when they are at least these. pytest runs the fused_tests part.
PACKAGES=(ml-collections==1.1.0 optax==0.2.8 orbax-checkpoint==0.12.8 tensorflow-datasets==4.9.10 grain==0.2.18
          array-record==0.8.6 pillow==13.0.0 simplejpeg==1.9.0 opencv-python-headless==5.0.0.93 turbojpeg==0.0.2
          pytest==9.2.0)
# Never carried: the image's stack (and pyarrow, 52 MB, which tensorflow-datasets' data_source does not import).
EXCLUDED='^(jax|jaxlib|jax_cuda|jax_plugins|nvidia|numpy|scipy|ml_dtypes|opt_einsum|flax|tensorstore|pyarrow)[-_]'

prepare() {
  local tmp
  tmp="$(mktemp -d)"
  local pip=("$PYTHON" -m pip)
  local platform=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
                  --python-version 3.12 --only-binary=:all:)
  mkdir -p "$tmp/dl" "$tmp/site" "$WHEELS"
  # promise (a tensorflow-datasets dependency) is published as a source archive only: build its wheel here.
  "${pip[@]}" wheel -q --no-deps -w "$tmp/dl" promise || return 1
  "${pip[@]}" download -q -d "$tmp/dl" --find-links "$tmp/dl" "${platform[@]}" --no-deps optax==0.2.8 \
      orbax-checkpoint==0.12.8 || return 1
  "${pip[@]}" download -q -d "$tmp/dl" --find-links "$tmp/dl" "${platform[@]}" \
      $(printf '%s\n' "${PACKAGES[@]}" | grep -v -E '^(optax|orbax-checkpoint)==') || return 1
  local wheels
  wheels=$(ls "$tmp/dl"/*.whl | grep -v -E "/$(echo "$EXCLUDED" | sed 's/^\^//')")
  "${pip[@]}" install -q --no-deps --no-compile --target "$tmp/site" "${platform[@]}" $wheels || return 1
  # Not needed to run: scripts, type stubs, and tensorflow-datasets' test data and tests (a third of it).
  rm -rf "$tmp/site/bin"
  find "$tmp/site" \( -name dummy_data -o -name testdata \) -type d -prune -exec rm -rf {} +
  find "$tmp/site" \( -name "*_test.py" -o -name "*.pyi" \) -type f -delete
  tar -C "$tmp/site" -cf - . | xz -9 -T2 > "$WHEELS/site-cp312.tar.xz" || return 1
  ls "$tmp/dl" > "$WHEELS/wheels.txt"
  rm -rf "$tmp"
  echo "Wrote $WHEELS/site-cp312.tar.xz ($(du -m "$WHEELS/site-cp312.tar.xz" | cut -f1) MiB; carry .whl) from:"
  cat "$WHEELS/wheels.txt"
}

# Drops from $1 (a --target site folder) every distribution the interpreter already has at the same or a
# newer version, so that the carried packages only fill gaps.
prune_site() {
  "$PYTHON" - "$1" <<'EOF'
import importlib.metadata, pathlib, shutil, sys
site = pathlib.Path(sys.argv[1])
others = [p for p in sys.path if p and pathlib.Path(p).resolve() != site.resolve()]
def key(version):
  parts = []
  for piece in version.replace("-", ".").split("."):
    digits = "".join(c for c in piece if c.isdigit())
    parts.append(int(digits) if digits else 0)
  return parts
kept, dropped = [], []
for info in sorted(site.glob("*.dist-info")):
  ours = importlib.metadata.Distribution.at(info)
  name, version = ours.metadata["Name"], ours.version
  theirs = next(importlib.metadata.distributions(name=name, path=others), None)
  if theirs is None or key(theirs.version) < key(version):
    kept.append(f"{name} {version}" + (f" (image: {theirs.version})" if theirs else ""))
    continue
  for line in (info / "RECORD").read_text().splitlines():
    path = site / line.split(",")[0]
    if path.is_file():
      path.unlink()
  shutil.rmtree(info, ignore_errors=True)
  dropped.append(f"{name} {version} (image: {theirs.version})")
print("carried, in use:", ", ".join(kept) or "none")
print("carried, the image's used instead:", ", ".join(dropped) or "none")
EOF
}

RESULTS=""
pack() {
  cp "$ROOT/benchmarks/README.md" "$RESULTS/README.md"
  # Not the trainers' checkpoints (written on SIGTERM, after the timed windows) nor the dry run's unpacked site.
  tar czf "$OUT_DIR/gpu_suite.tgz" --exclude=./site-check --exclude='./work/*/checkpoints' -C "$RESULTS" . 2>/dev/null
}

# part NAME LIMIT COMMAND...: runs COMMAND under its limit, its output in NAME.log, then packs the archive.
part() {
  local name="$1" limit="$2"
  shift 2
  local start=$SECONDS
  echo "== $name (limit ${limit}s): $*" | tee -a "$RESULTS/suite.log"
  timeout --signal=TERM --kill-after=20 "$limit" "$@" > "$RESULTS/$name.log" 2>&1
  local status=$?
  echo "== $name: exit $status after $((SECONDS - start))s" | tee -a "$RESULTS/suite.log"
  tail -n 4 "$RESULTS/$name.log"
  [ "$status" -eq 0 ] || FAILED_PARTS="$FAILED_PARTS $name"
  pack
  return 0  # the next parts still run: a lent GPU's minutes are spent on what works
}
FAILED_PARTS=""

install_part() {
  if [ ! -f "$WHEELS/site-cp312.tar.xz" ]; then
    echo "no $WHEELS/site-cp312.tar.xz: nothing to install (run --prepare here and carry .whl)"
  else
    rm -rf "$SITE" && mkdir -p "$SITE" && tar -C "$SITE" -xJf "$WHEELS/site-cp312.tar.xz" || return 1
    prune_site "$SITE"
  fi
  "$PYTHON" -c "import sys, jax, flax; print(sys.version.split()[0], jax.__version__, flax.__version__, jax.devices())"
  local modules="lbjax.train, lbjax.data.imagenet, tensorflow_datasets, grain, cv2, simplejpeg, pytest"
  "$PYTHON" -c "import $modules; print('imports ok')"
  nvidia-smi 2>/dev/null || true
}

# e2e_points COMPARE POINT...: one part per point; COMPARE=yes times momentum SGD's step at the first point. The
# first point's step is also traced (5 steps, jax.profiler: its busy time and the kernels that take its time; the
# trace is packed under work/step_trace_*).
e2e_points() {
  local compare="$1" point batch workers flags override name first=yes
  shift
  for point in "$@"; do
    read -r batch workers flags override <<< "$point"
    local extra=()
    name="e2e_b${batch}_w${workers}_${flags}"
    [ -n "$override" ] && extra+=("--override=$override") && name+="_${override##*.}" && name="${name//=/_}"
    [ "$compare" = yes ] && extra+=(--compare-momentum)
    [ "$first" = yes ] && extra+=(--trace-steps 5)
    compare=no first=no
    if [ "$MODE" = dry-run ]; then
      part "e2e_dry_run" "$LIMIT_E2E_POINT" "$PYTHON" -m benchmarks.resnet50_end_to_end --dry-run "${extra[@]}" \
          --xla-flags "$flags" --results "$RESULTS/e2e.jsonl" --work-root "$RESULTS/work"
      return
    fi
    part "$name" "$LIMIT_E2E_POINT" "$PYTHON" -m benchmarks.resnet50_end_to_end \
        --batch-per-device "$batch" --decode-workers "$workers" --xla-flags "$flags" "${extra[@]}" \
        --results "$RESULTS/e2e.jsonl" --work-root "$RESULTS/work"
  done
}

e2e_table() {
  [ -s "$RESULTS/e2e.jsonl" ] || return 0
  if [ "$MODE" = dry-run ]; then
    "$PYTHON" -c "import json, sys; [print(json.loads(l)['xla_flags'], 'ok') for l in open(sys.argv[1])]" \
        "$RESULTS/e2e.jsonl"
  else
    "$PYTHON" -m benchmarks.resnet50_end_to_end --table "$RESULTS/e2e.jsonl" > "$RESULTS/e2e_table.log" 2>&1
  fi
  pack
}

step_options_part() {  # each option in turn; one that fails (an XLA abort) does not keep the rest from running
  local size=() option failed=0
  local batch=256 half=128  # the step's batch per device; the config's own max_device_batch (two halves)
  [ "$MODE" = dry-run ] && size=(--dry-run) batch=8 half=8  # ghost BN 8 there: no halves, the path only
  # the first two: as configured and with LARS in the flat layout, each in the same rounds with the state in
  # XLA's layouts (--compare-state-layouts; the flat layout with XLA's layouts compiles to the fewest kernels);
  # the first also with jax.nn.relu in the model (--compare-jax-relu: what lbjax.models.relu's barrier gives)
  for option in "--compare-state-layouts --compare-jax-relu --override=--config.deterministic=False" \
      "--compare-state-layouts --override=--config.optimizer.layout=flat" \
      --override=--config.deterministic=True \
      --override=--config.model_options.param_dtype_gradients=True \
      "--override=--config.model_options.bn_group_size=$batch" "--max-device-batch=$half"; do
    # shellcheck disable=SC2086  # $option: one or two words
    "$PYTHON" -m benchmarks.resnet50_end_to_end "${size[@]}" --step-only $option \
        --results "$RESULTS/e2e.jsonl" --work-root "$RESULTS/work" || failed=1
  done
  return "$failed"
}

# unpack ARCHIVE...: in the order given, each archive's accelerator sections that its run changed (the README
# it packed against the one it started from) replace ours, and its measured end-to-end rows join $E2E_RESULTS,
# whose section is then written from all of them.
unpack() {
  local archive tmp
  # Writing the table needs no device: without this, JAX's CUDA plugin (the gpu-compile extra) prints its
  # failed start on a machine without a GPU.
  export JAX_PLATFORMS=cpu
  "$PYTHON" -c "import lbjax, jax" 2> /dev/null \
    || { echo "--unpack writes the end-to-end section with lbjax: $PYTHON cannot import it (set PYTHON)" >&2; exit 2; }
  for archive in "${ARCHIVES_IN[@]}"; do
    tmp="$(mktemp -d)"
    tar xzf "$archive" -C "$tmp" || exit 1
    [ -f "$tmp/README.before.md" ] || { echo "$archive has no README.before.md (packed by an older gpu_suite.sh)"; exit 1; }
    "$PYTHON" - "$tmp/README.before.md" "$tmp/README.md" "$ROOT/benchmarks/README.md" <<'EOF'
import re, sys
pattern = re.compile(r"<!-- BEGIN (\S+) -->\n## (.*?)\n\n(.*?)\n<!-- END \1 -->", re.DOTALL)
before, after, local = (open(p).read() for p in sys.argv[1:])
sections = lambda text: {m.group(1): m.group(0) for m in pattern.finditer(text)}
started_from, ours = sections(before), sections(local)
for name, section in sections(after).items():
  # Only accelerator sections (a dry run on a CPU rewrites CPU sections with its meaningless numbers); the
  # end-to-end one is written from the merged rows below.
  if section == started_from.get(name) or not name.endswith(("-gpu", "-tpu")):
    continue
  local = local.replace(ours[name], section) if name in ours else local.rstrip("\n") + "\n\n" + section + "\n"
  print("section", name, "taken from", sys.argv[2])
open(sys.argv[3], "w").write(local)
EOF
    if [ -s "$tmp/e2e.jsonl" ]; then  # the measured rows not already there (an archive unpacked twice adds none)
      touch "$ROOT/$E2E_RESULTS"
      grep -v '"dry_run": true' "$tmp/e2e.jsonl" | grep -vxF -f "$ROOT/$E2E_RESULTS" >> "$ROOT/$E2E_RESULTS"
    fi
    echo "Logs and results of $archive (e2e.jsonl, env.log, one log per part) are in $tmp"
  done
  if [ -s "$ROOT/$E2E_RESULTS" ]; then
    "$PYTHON" -m benchmarks.resnet50_end_to_end --table "$E2E_RESULTS" > /dev/null || exit 1
  fi
}

case "$MODE" in
  prepare) prepare; exit $? ;;
  unpack) unpack; exit $? ;;
esac

mkdir -p "$OUT_DIR"
RESULTS="$(mktemp -d "${TMPDIR:-/tmp}/gpu-suite-XXXX")"
mkdir -p "$RESULTS/work"
cp "$ROOT/benchmarks/README.md" "$RESULTS/README.before.md"  # --unpack takes only the sections this run changes
if [ "$MODE" = dry-run ]; then
  SITE="$RESULTS/site-check"  # unpacked and pruned as on the device, but not imported (cp312 wheels)
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export WHEELS SITE MODE RESULTS PYTHON
export -f install_part prune_site step_options_part
echo "gpu_suite.sh $MODE, parts $PARTS, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD)" \
    | tee "$RESULTS/suite.log"

for name in ${PARTS//,/ }; do
  case "$name" in
    install) part env "$LIMIT_INSTALL" bash -c install_part ;;
    e2e) e2e_points yes "${E2E_FIRST[@]}"; e2e_table ;;
    e2e_more) e2e_points no "${E2E_MORE[@]}"; e2e_table ;;
    loop)
      if [ "$MODE" = dry-run ]; then
        part loop "$LIMIT_LOOP" "$PYTHON" -m benchmarks.train_loop --rounds 2 --steps 4 --log-every 2 --steps-per-call 2 \
            --models resnet_tiny --no-readme --max-spread 1000
      else
        part loop "$LIMIT_LOOP" "$PYTHON" -m benchmarks.train_loop --rounds 7 --write-noisy
      fi ;;
    loop_trace)
      if [ "$MODE" = dry-run ]; then
        part loop_trace "$LIMIT_LOOP_TRACE" "$PYTHON" -m benchmarks.loop_trace --repeats 1 --skip 2 --traced 2 \
            --log-every 2 --steps-per-call 2 --models resnet_tiny --no-readme --keep-traces "$RESULTS/traces"
      else
        part loop_trace "$LIMIT_LOOP_TRACE" "$PYTHON" -m benchmarks.loop_trace --repeats 3 \
            --keep-traces "$RESULTS/traces"
      fi ;;
    optimizer)
      if [ "$MODE" = dry-run ]; then
        part optimizer "$LIMIT_OPTIMIZER" "$PYTHON" -m benchmarks.optimizer --trees ptb_lstm --rounds 2 \
            --seconds-per-round 0.01 --no-readme --max-spread 1000 --updates-per-call 2 --trace
      else
        # The four the targets compare, lars and lamb in the flat and the fused layout, momentum SGD fused, and
        # lars with one rate vector (what leaf-local rates cost on a GPU), 50 updates per call (one update per
        # call took at least 1.2 ms on the H200 whatever its kernels: most likely the host's dispatch of ~800
        # arrays; 50 per call leave ~0.02 ms of it per update, and the loop adds ~2 small kernels per update,
        # compiled for an H100 here; the compile time does not depend on the count). Each row compiles
        # once; the fused rows took 17 s (momentum), 22 s (lars) and 106 s (lamb) on the H200 (2026-11-30, at
        # b40ebda, when they compiled twice and the part ran out of time), in one kernel per pass; since
        # 2026-12-01 a kernel takes up to 96 leaves, which compile 1.6x-2.6x faster here.
        part optimizer "$LIMIT_OPTIMIZER" "$PYTHON" -m benchmarks.optimizer --trees resnet50 --rounds 21 --write-noisy \
            --updates-per-call 50 --trace \
            --optimizers "momentum SGD (lbjax momentum), fused layout;optax.lars;lbjax lars;lars, one rate vector (the design of 2026-11-26, experiment);lbjax lars, flat layout;lbjax lars, fused layout;optax.lamb;lbjax lamb (all leaves);lbjax lamb (all leaves), flat layout;lbjax lamb (all leaves), fused layout"
      fi ;;
    fused_tests)  # (the test that compiles for an H100 without one is in test_multi_tensor.py: its counts are the benchmark's)
      if [ "$MODE" = dry-run ]; then
        part fused_tests "$LIMIT_FUSED_TESTS" "$PYTHON" -m pytest -q -p no:cacheprovider tests/optim/test_fused.py
      else
        part fused_tests "$LIMIT_FUSED_TESTS" env JAX_PLATFORMS=cuda "$PYTHON" -m pytest -q -p no:cacheprovider \
            tests/optim/test_fused.py
      fi ;;
    step_options) part step_options "$LIMIT_STEP_OPTIONS" bash -c step_options_part; e2e_table ;;
    max_pool)
      if [ "$MODE" = dry-run ]; then
        part max_pool "$LIMIT_MAX_POOL" "$PYTHON" -m benchmarks.max_pool --batch 2 --rounds 2 --no-readme --max-spread 1000
      else  # each mode its own process: the deterministic flags are read when the backend starts
        part max_pool "$LIMIT_MAX_POOL" "$PYTHON" -m benchmarks.max_pool --batch 256 --write-noisy
        part max_pool_deterministic "$LIMIT_MAX_POOL" "$PYTHON" -m benchmarks.max_pool --batch 256 --deterministic \
            --write-noisy
      fi ;;
    repeatability)
      if [ "$MODE" = dry-run ]; then
        part repeatability "$LIMIT_REPEATABILITY" "$PYTHON" -m benchmarks.repeatability --steps 2 --no-readme
      else
        part repeatability "$LIMIT_REPEATABILITY" "$PYTHON" -m benchmarks.repeatability --steps 50
      fi ;;
    xla_flags)
      if [ "$MODE" = dry-run ]; then
        part xla_flags "$LIMIT_XLA_FLAGS" "$PYTHON" -m benchmarks.xla_flags --cases mnist_lstm:8 --rounds 1 \
            --inner-rounds 1 --seconds-per-round 0.01 --no-readme --max-spread 1000
      else
        part xla_flags "$LIMIT_XLA_FLAGS" "$PYTHON" -m benchmarks.xla_flags --rounds 2 --write-noisy
      fi ;;
    *) echo "gpu_suite.sh: unknown part $name (install, e2e, e2e_more, loop, loop_trace, optimizer, fused_tests, step_options," \
            "max_pool, repeatability, xla_flags)" >&2
       exit 2 ;;
  esac
done
pack
echo "Archive: $OUT_DIR/gpu_suite.tgz ($(du -k "$OUT_DIR/gpu_suite.tgz" | cut -f1) KiB)"
if [ -n "$FAILED_PARTS" ]; then  # packed all the same; the status says that not every part ran to exit 0
  echo "gpu_suite.sh: parts that did not exit 0:$FAILED_PARTS (their logs are in the archive)" | tee -a "$RESULTS/suite.log"
  exit 1
fi
