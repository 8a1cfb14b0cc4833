"""The commands the docs give (fenced and indented code blocks, inline code) are not stale: each
`lbjax-train --config ...` passes `--dry-run` (its config, variant and overrides resolve; `--workdir`,
`--compile-only` and the multi-host flags are dropped), each `python -m experiments.X ...` /
`python -m benchmarks.X ...` with arguments is accepted by its script's argument parser (its flags and their
values), an experiment with a `--dry-run` passes it too (all it checks before training, with its --out and
--workdir in a temporary folder), and a module named without arguments exists. Commands with
placeholders (`<config>`, `...`, `--batch B`, a config file of your own `my_config.py`) are templates, not
commands, and are left out."""

import argparse
import importlib.util
import pathlib
import re
import runpy
import shlex
import sys

import pytest

from lbjax import main as lbjax_main

ROOT = pathlib.Path(__file__).parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "benchmarks").glob("*.md")),
        *sorted((ROOT / "experiments").glob("*.md"))]
# A command: lbjax-train, or python -m of an experiment or a benchmark, after optional VAR=value assignments and
# a launcher (srun, timeout 600, nohup).
COMMAND = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S+\s+)*(?:(?:srun|nohup|timeout\s+\S+)\s+)?"
                     r"((?:\S*/)?lbjax-train(?:\s.*)?|"
                     r"\S*python3?(?:\.\d+)?\s+-m\s+(?:experiments|benchmarks)\.\S+(?:\s.*)?)$")
# Placeholders: <config>, ..., a single capital (--batch B, experiments.X), NAME, k, your own config (my_config.py).
PLACEHOLDER = re.compile(r"<[^>]*>|\.\.\.|(?:^|[\s=:,.])(?:[A-Z]|NAME|k)(?=$|[\s,])|\bmy_\w+\.py\b")
# What --dry-run cannot take: where a run would write, compiling for a topology, the processes of a multi-host job.
DROPPED_WITH_VALUE = {"--workdir", "--topology", "--coordinator_address", "--num_processes", "--process_id"}
DROPPED = {"--compile-only", "--distributed"}


def _documented_commands() -> list[tuple[str, str]]:
  """(file, command) for each command in a fenced block (lines joined at a trailing backslash, a comment cut),
  an indented block (4 spaces) or an inline code span of the docs."""
  found = []
  for path in DOCS:
    text = path.read_text()
    spans = [line.split(" # ")[0] for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
             for line in re.sub(r"\\\n\s*", " ", block).splitlines()]
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    spans += [line.split(" # ")[0] for line in re.sub(r"\\\n\s*", " ", prose).splitlines() if line.startswith("    ")]
    spans += [re.sub(r"\s+", " ", span) for span in re.findall(r"`([^`]+)`", prose)]
    found += [(str(path.relative_to(ROOT)), match.group(1)) for span in spans
              if (match := COMMAND.match(span.strip())) and not PLACEHOLDER.search(match.group(1))]
  # A command quoted inside another's (gcloud ... --command="lbjax-train ...") ends with the outer quote.
  return [(where, command[:-1] if command.count('"') % 2 and command.endswith('"') else command)
          for where, command in found]


COMMANDS = _documented_commands()


def _ids(commands):
  return [f"{where}: {command[:80]}" for where, command in commands]


def test_the_docs_hold_the_commands_this_test_reads():
  """The extraction finds the commands (a broken pattern would pass every test below by finding none)."""
  programs = [shlex.split(command)[0].rsplit("/", 1)[-1] for _, command in COMMANDS]
  assert programs.count("lbjax-train") >= 15 and len(COMMANDS) >= 80


TRAIN_COMMANDS = [(where, command) for where, command in COMMANDS
                  if shlex.split(command)[0].endswith("lbjax-train") and re.search(r"--config\b|--list", command)]


@pytest.mark.parametrize("where, command", TRAIN_COMMANDS, ids=_ids(TRAIN_COMMANDS))
def test_a_documented_lbjax_train_command_resolves_under_dry_run(where, command, capsys):
  argv, words = [], iter(shlex.split(command)[1:])
  for word in words:
    flag = word.split("=")[0]
    if flag in DROPPED_WITH_VALUE and "=" not in word:
      next(words, None)
    elif flag not in DROPPED | DROPPED_WITH_VALUE:
      argv.append(word)
  if "--list" not in argv:
    argv.append("--dry-run")
  assert lbjax_main.main(argv) == 0, f"{where}: `{command}` -> {capsys.readouterr().err}"


SCRIPT_COMMANDS = [(where, command) for where, command in COMMANDS if " -m " in command]


class _Parsed(Exception):
  """Raised once a script's command line is parsed: nothing after it runs."""


@pytest.mark.filterwarnings("ignore:.*found in sys.modules after import of package:RuntimeWarning")  # runpy's
@pytest.mark.parametrize("where, command", SCRIPT_COMMANDS, ids=_ids(SCRIPT_COMMANDS))
def test_a_documented_script_command_is_accepted_by_its_parser(where, command, monkeypatch, capsys):
  module, *argv = shlex.split(command)[2:]
  assert importlib.util.find_spec(module) is not None, f"{where}: `{command}`: no module {module}"
  if not argv:  # a module named in prose, or a command without arguments: it exists
    return
  parse_known_args, depth = argparse.ArgumentParser.parse_known_args, [0]

  def parse_and_stop(self, args=None, namespace=None):  # the outermost parse (a subcommand's is nested in it)
    depth[0] += 1
    try:
      namespace, extras = parse_known_args(self, args, namespace)
    finally:
      depth[0] -= 1
    if depth[0]:
      return namespace, extras
    if extras:
      self.error(f"unrecognized arguments: {' '.join(extras)}")
    raise _Parsed

  monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", parse_and_stop)
  monkeypatch.setattr(sys, "argv", [module, *argv])
  with pytest.raises(_Parsed):
    try:
      runpy.run_module(module, run_name="__main__", alter_sys=False)
    except SystemExit as e:
      pytest.fail(f"{where}: `{command}` was refused (exit {e.code}): {capsys.readouterr().err}")


# The scripts (and subcommands) with a --dry-run: everything they check before training runs too.
DRY_RUN_SCRIPTS = {"experiments.sweep", "experiments.variant_table", "experiments.lr_grid",
                   "experiments.adaptive_batch", "experiments.batch_schedule", "experiments.critical_batch warmup",
                   "experiments.lipschitz", "experiments.mclr_vs_lars", "experiments.noise_scale",
                   "experiments.compression_bytes"}
DRY_RUN_COMMANDS = [(where, command) for where, command in SCRIPT_COMMANDS
                    if " ".join(shlex.split(command)[2:4]) in DRY_RUN_SCRIPTS
                    or shlex.split(command)[2] in DRY_RUN_SCRIPTS]


@pytest.mark.filterwarnings("ignore:.*found in sys.modules after import of package:RuntimeWarning")  # runpy's
@pytest.mark.parametrize("where, command", DRY_RUN_COMMANDS, ids=_ids(DRY_RUN_COMMANDS))
def test_a_documented_experiment_passes_its_dry_run(where, command, monkeypatch, capsys, tmp_path):
  """The experiment's own checks (configs, variants, seeds, targets, tables) on what the docs give, with its
  --out and --workdir moved to a temporary folder; nothing is trained or written."""
  module, *argv = shlex.split(command)[2:]
  for flag, value in (("--out", tmp_path / "out" / "results"), ("--workdir", tmp_path / "runs")):
    argv = [f"{flag}={value}" if word.startswith(f"{flag}=") else word for word in argv]
    argv = [str(value) if i and argv[i - 1] == flag else word for i, word in enumerate(argv)]
  monkeypatch.chdir(ROOT)  # the docs' relative paths (tables, --cbs, --reference) are the repository's
  monkeypatch.setattr(sys, "argv", [module, *argv, "--dry-run"])
  try:
    runpy.run_module(module, run_name="__main__", alter_sys=False)
  except SystemExit as e:
    pytest.fail(f"{where}: `{command} --dry-run` was refused (exit {e.code}): {capsys.readouterr().err}")
  assert not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()
