"""The critical batch size measured directly (Merrill et al. 2025) against the gradient noise scale, and a
batch-size warm-up built on it.

  python -m experiments.critical_batch measure \
      --config adaptive_batch_mnist:run=legw,large_batch=128,epochs=4 --overrides data_options.eval_split=validation \
      --checkpoints 0,0.25,0.5,1,2,4 --batch_sizes 128,256,512,1024,2048,4096,8192 --budget_epochs 0.5 \
      --tolerance 0.02 --out docs/results/critical_batch_mnist --workdir runs/critical_batch_mnist
  python -m experiments.critical_batch warmup --config adaptive_batch_mnist:epochs=2 \
      --overrides data_options.eval_split=validation --cbs docs/results/critical_batch_mnist.csv --seeds 0,1,2 \
      --out docs/results/critical_batch_mnist_warmup --workdir runs/critical_batch_mnist_warmup

`measure` (the method of Merrill et al. 2025, arXiv 2505.23971, §3):
1. trains the reference run, the config at its smallest batch B0 (`<workdir>/reference`, resumable; it
   saves a checkpoint at every `config.eval_every_epochs`, all kept);
2. from the state of the reference run at each checkpoint epoch (epoch 0: its initial state; the checkpoint
   saved there, at the step boundary the epoch falls in: a reference run without it, e.g. one trained
   outside `measure` with fewer kept, is refused with the epochs it saved), trains a
   branch at every batch size B of the grid for the same number of examples, `budget`: the restored
   parameters, optimizer and data position, so every branch reads the same examples in the same order;
   the learning rate at B is the config's scaling rule at B on the run's clock (as a fixed-batch run at
   B, or `batch.policy="adaptive"` at B, would use at that epoch), times each `--lr_multipliers` entry
   (the best branch of the grid counts);
3. takes each branch's loss on the evaluation split (the whole split, after the budget) and the
   critical batch size at that checkpoint: the largest B such that every branch with B' <= B ends
   within the relative `tolerance` of the B0 branch's loss, loss(B') <= (1 + tolerance) loss(B0).
The budget is rounded to the nearest whole number of every batch of the grid (a multiple of their least
common multiple; a grid whose multiple is twice the budget or more is refused), so every branch sees exactly the
same examples (at batch B, budget/B updates). Beside it, the gradient noise scale
B_noise = tr(Sigma)/|G|^2 the adaptive policy uses (`lbjax.train.batch_policy`: the EMA of the
estimates from the micro-batch and the whole batch) as the reference run recorded it at each checkpoint.

All branches of a process share one `Run` built from the reference config on the any-batch step
(`config.batch.micro_batch_size` > 0, required): every batch of the grid runs on the same two compiled
programs, so the grid costs no compile beyond the first. A branch is recorded in `<out>_branches.csv`
as it finishes (skipped when the command runs again; an interrupted branch starts again from its
checkpoint); several processes may share the grid (the same command started N times): each takes the
next branch neither recorded nor locked by another (`<workdir>/branches/<branch>.lock`), and the CSV is
merged under a lock. Outputs: `<out>_branches.csv` (every branch) with `<out>_branches.json` (the budget
and the reference config its branches were trained with), `<out>.csv` and `<out>.md` (the CBS table: per
checkpoint the loss ratio of every batch, the CBS and B_noise; only the branches of this grid's
checkpoints, batches and LR multipliers count), `<out>.png` (CBS and B_noise over training).

A table never mixes two measurements: before training anything, `measure` refuses a finished reference
run of another recipe in `--workdir` (give another `--workdir`), and branches recorded in
`<out>_branches.csv` of another budget or reference recipe, or without their `.json` (give another `--out`),
each with the fields that differ. It does not train them again in place: that would overwrite a finished
measurement. Another grid on the same budget and recipe (more checkpoints, batches or LR multipliers)
reads back the branches it shares.

Both commands choose on the evaluation split (`measure` each branch's LR and the CBS, `warmup` its target
and the updates to it), so both refuse a config that evaluates on the test split (MNIST's default) unless
`--allow_test_split` is given: pass `--overrides data_options.eval_split=validation` (`valid` for PTB, its
default). Their tables name the split.

`warmup` trains, with each seed, in `<workdir>/<run>_seed<s>` (resumable, `experiments.adaptive_batch`;
several processes may share the runs, each skipping a run another one holds):
  baseline:   the config's run=baseline (its smallest batch throughout);
  legw:       run=legw at the warm-up's final batch (LEGW, papers/001);
  adaptive:   run=adaptive with the warm-up's final batch as its largest (noise-scale policy);
  cbs_warmup: the batch of the measured CBS curve: from each checkpoint epoch on, the CBS measured
              there (never shrinking, within [B0, final batch]), and the LR of the scaling rule at the
              batch in force (`rule_at_batch_in_force`), as the adaptive policy sets it;
then writes `<out>.md`/`.csv`/`.png`: per run over seeds, the updates and examples to the first
evaluation at the baseline's final quality on the evaluation split (its mean over seeds; `--targets`
adds fixed ones), the final quality, and each finished run's final test metric (evaluated once, after
training: choices on validation, the test split only as the last figure). `--tolerance` builds the
warm-up from the CBS at another tolerance, read from the table's loss ratios.

Modules: `grid` (the reference config and the grid, checked before any training), `branches` (branch
points, training a branch on the shared `Run`, the `<out>_branches.csv` shared by processes), `measure`
(the CBS table and plot), `warmup` (the warm-up's configs, `rule_at_batch_in_force`, its table and plot),
`cli` (the command line).
"""
