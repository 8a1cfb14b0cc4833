#!/usr/bin/env bash
# The PTB runs owed to a GPU session, for a lent device machine: several processes ("lanes") share one GPU,
# working down the variant tables (JOBS) and the batch warm-up comparisons (WARMUPS) in order of priority; a
# packer writes $OUT/tables.tgz every 30 s, so a call cut off at its limit still returns what finished.
#
#   owed now: the PTB batch warm-up comparison (`experiments.critical_batch warmup`, 4 runs x seeds 0-2: the
#   baseline B=20, LEGW, the noise-scale policy and the warm-up from the measured CBS curve), whose CPU runs
#   (about 70 min each, two at a time; seeds 0-1 and part of 2) were lost with the machine on 2026-12-01; on
#   the H200 a PTB run takes 40-190 s. The runs resume from their checkpoints in a second call to a warm machine.
#   Every committed PTB variant table has seeds 0-2 of every row. To run more seeds of a table, add it to
#   JOBS as "table results-prefix seeds [rows]" (for example "ptb_lstm_fig7_50_epochs ptb_lstm_fig7_50_epochs
#   3,4"). A warm-up comparison runs whole (it does not start from its committed tables: drop it from WARMUPS
#   once committed); its lanes share its run directories, each training a run no other lane trains, and each
#   writes the comparison's files from the runs finished so far after each of its runs.
# Done on 2026-11-26 and committed: the headline both ways (ptb_lstm_headline.md, "Evaluated again"; the
# stream evaluation needs the runs' checkpoints, so it is `experiments.reevaluate` on the machine that
# trained them), the five hypotheses rows, and seed 1 of Figure 5.2's LEGW rows. Done on 2026-11-28
# (BUDGET_SECONDS=400, one 421 s call): Figure 5.2's seeds 1-2 but Adam B=20 seed 2, Figure 6.2's LEGW seed 2.
# Done on the CPU (2026-11-27 to 11-29): seeds 1-2 of `decay_from_10_clip_0.25` (ptb_lstm_640_hypotheses), the
# rest of Figure 6.2's seeds 1-2, Adam B=20 seed 2 of Figure 5.2 and Figure 7.2's seeds 1-2 of LEGW and LR 0.8
# and seed 1 of LR 0.1 and 0.2. Done on 2026-11-30 (LANES=6 BUDGET_SECONDS=300, one 160 s call): the rest of
# Figure 7.2 (seed 2 of LR 0.1 and 0.2, seeds 1-2 of LR 0.4 and 1.6), 148-161 s each, six at once. A table's
# done rows never run again (the lanes start from the committed CSVs).
#
# Here, once (.whl/, ignored by .gitignore: the ml-collections wheel the device image lacks, and the PTB files, xz):
#   bash experiments/gpu_tables.sh --prepare
# On the device (the `run` tool of the device machine), carrying .whl:
#   run(command="bash experiments/gpu_tables.sh", carry=[".whl"], timeout_s=600)
# Back here, the tables it finished (CSV, markdown, plot; not the lanes' logs) go over the committed ones:
#   tar xzf <files_at>/tables.tgz -C docs/results --wildcards './ptb_lstm_*' './critical_batch_*'
# `--dry-run` prints what would run; LANES (default 4) and BUDGET_SECONDS (default 480, the lanes'
# share of the call) tune it. The mechanics can be tried here (CPU; trains a minute, records nothing):
#   OUT=/tmp/o PYTHON=.venv/bin/python LANES=2 BUDGET_SECONDS=45 bash experiments/gpu_tables.sh
set -uo pipefail
cd "$(dirname "$0")/.."

TABLES=experiments/tables
RESULTS=docs/results
OUT_DIR=/tmp/gpu_tables/out
RUNS=/tmp/gpu_tables/runs
DATA=/tmp/gpu_tables/data  # PTB, unpacked from .whl/ptb.tar.xz (not into .whl, which then carries 5.7 MiB more)
PYTHON=${PYTHON:-python3}  # the device image's; here, for a check of the mechanics, a venv's
LANES=${LANES:-4}
BUDGET_SECONDS=${BUDGET_SECONDS:-480}
# (table, results prefix, seeds, rows if not all): the order is the priority.
JOBS=()
# (adaptive-batch config, CBS table in docs/results, results prefix, seeds): run before JOBS.
WARMUPS=("adaptive_batch_ptb critical_batch_ptb critical_batch_ptb_warmup 0,1,2")
if [[ ${#JOBS[@]} -eq 0 && ${#WARMUPS[@]} -eq 0 && "${1:-}" != "--prepare" ]]; then
  echo "gpu_tables.sh: nothing is owed (JOBS and WARMUPS are empty); add a table to JOBS to run more seeds" \
       "(see the top)" >&2
  exit 0
fi

if [[ "${1:-}" == "--prepare" ]]; then
  mkdir -p .whl
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    -d .whl "ml-collections==1.1.0"
  tar cJf .whl/ptb.tar.xz -C ../shared/data ptb  # 1.4 MiB instead of 5.7: beside gpu_suite's 53 MiB site
  du -sh .whl
  exit 0
fi

lane_commands() {  # the commands one lane runs, in order
  local job table out seeds rows config cbs
  for job in "${WARMUPS[@]}"; do  # the valid split's perplexity decides, as in critical_batch_notes.md
    read -r config cbs out seeds <<< "$job"
    echo "$PYTHON -m experiments.critical_batch warmup --config $config --overrides data_options.eval_split=valid" \
         "--cbs $RESULTS/$cbs.csv --seeds $seeds --out $OUT_DIR/$out --workdir $RUNS/$out"
  done
  for job in "${JOBS[@]}"; do
    read -r table out seeds rows <<< "$job"
    echo "$PYTHON -m experiments.variant_table $TABLES/$table.json --out $OUT_DIR/$out --workdir $RUNS/$table" \
         "--seeds $seeds${rows:+ --rows $rows}"
  done
}

if [[ "${1:-}" == "--dry-run" ]]; then
  echo "each of $LANES lanes, for at most $BUDGET_SECONDS s:"; lane_commands | sed 's/^/  /'
  echo "packed into \$OUT/tables.tgz"
  exit 0
fi

: "${OUT:?run this on the device machine, where OUT is set (or use --dry-run / --prepare here)}"
mkdir -p "$DATA" && tar xJf .whl/ptb.tar.xz -C "$DATA" || exit 1
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH="/tmp/site:$PWD" LBJAX_DATA_DIR="$DATA" PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # the lanes share the GPU's memory
mkdir -p "$OUT_DIR" "$RUNS"
for job in "${JOBS[@]}"; do  # start from the committed tables: only what they lack runs
  read -r table out _ <<< "$job"
  [[ -f "$RESULTS/$out.csv" && ! -f "$OUT_DIR/$out.csv" ]] && cp "$RESULTS/$out.csv" "$OUT_DIR/"
done
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || echo "no nvidia-smi"; } | tee "$OUT_DIR/device.txt"

pack() { tar czf "$OUT/tables.tgz.partial" -C "$OUT_DIR" . && mv "$OUT/tables.tgz.partial" "$OUT/tables.tgz"; }
( while sleep 30; do pack; done ) & packer=$!

lanes=()
for lane in $(seq "$LANES"); do  # each lane its own process group, so the budget stops its trainings too
  setsid bash -c "$(lane_commands | paste -sd';')" > "$OUT_DIR/lane$lane.log" 2>&1 &
  lanes+=($!)
done
# SIGTERM: a training saves a checkpoint at its next step and its table records nothing for it.
( sleep "$BUDGET_SECONDS"; for pid in "${lanes[@]}"; do kill -TERM -- "-$pid" 2>/dev/null; done ) & timer=$!
wait "${lanes[@]}"
kill "$timer" 2>/dev/null
kill "$packer" 2>/dev/null
pack
tail -n 3 "$OUT_DIR"/lane*.log
