"""Executes every notebook in notebooks/ at tiny sizes (LBJAX_NOTEBOOK_TINY=1) with nbclient."""

import os
import pathlib
import re
import tempfile
import tomllib
import types

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

REPO = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def test_there_are_the_three_notebooks():
  assert [p.name[:3] for p in NOTEBOOKS] == ["01_", "02_", "03_"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_tiny(path, tmp_path, monkeypatch):
  monkeypatch.setenv("LBJAX_NOTEBOOK_TINY", "1")
  monkeypatch.setenv("TMPDIR", str(tmp_path))  # the notebooks' tempfile.mkdtemp workdirs go with tmp_path
  notebook = nbformat.read(path, as_version=4)
  first = notebook.cells[1].source if notebook.cells[0].cell_type == "markdown" else notebook.cells[0].source
  assert 'if "google.colab" in sys.modules' in first and "pip install" in first
  client = nbclient.NotebookClient(notebook, timeout=180, kernel_name="python3",
                                   resources={"metadata": {"path": str(tmp_path)}})
  client.execute()
  errors = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
            if o.output_type == "error"]
  assert not errors
  images = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
            if "image/png" in o.get("data", {})]
  assert images, "the notebook should draw its plot"
  assert os.environ["LBJAX_NOTEBOOK_TINY"] == "1"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_install_cell_installs_from_the_project_url_without_touching_jax(path):
  url = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
  install = nbformat.read(path, as_version=4).cells[1].source
  assert re.search(r'^LBJAX_SOURCE = "git\+' + re.escape(url) + '"', install, re.MULTILINE)
  [pip] = [line.strip() for line in install.splitlines() if line.strip().startswith(("%pip", "!pip"))]
  assert pip == '%pip install -q "lbjax[tfds,notebooks] @ {LBJAX_SOURCE}"'  # no -U, no jax pin
  assert "<" not in install  # no placeholder such as <your-org>


def test_install_commands_in_the_docs_name_the_project_url():
  """README.md and docs/*.md install lbjax from pyproject.toml's Repository URL, not a placeholder."""
  url = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
  sources = {}
  for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
    for line in path.read_text().splitlines():
      for source in re.findall(r"lbjax(?:\[[^\]]*\])? @ ([^'\"\s]+)", line):
        sources.setdefault(source, []).append(path.name)
  assert sources, "docs/running.md installs lbjax on a pod and a GPU node"
  assert set(sources) == {"git+" + url}, sources



@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if "train_and_evaluate(" in p.read_text()],
                         ids=lambda p: p.stem)
def test_every_run_a_notebook_starts_at_full_size_is_valid(path, monkeypatch, tmp_path):
  """The notebook at full size (TINY off, as on Colab) with `train_and_evaluate` replaced by the trainer's checks
  of the config, which leave a final evaluation record and train nothing: every run it starts must pass them
  (notebook 03's 640-16,000 batches with micro-batches of 512 did not). Cells that need what a real run returns
  may fail; the checks of every run they reach count."""
  from lbjax import train  # pylint: disable=import-outside-toplevel
  monkeypatch.delenv("LBJAX_NOTEBOOK_TINY", raising=False)
  monkeypatch.setenv("MPLBACKEND", "Agg")
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the notebooks' mkdtemp workdirs
  checked, refused = [], []

  def check(config, workdir):
    try:
      train.validate(config)
    except train.ConfigError as error:
      refused.append(f"{workdir}: {error}")
    checked.append(workdir)
    pathlib.Path(workdir).mkdir(parents=True, exist_ok=True)
    final = '{"kind": "eval", "step": 1, "epoch": 1.0, "accuracy": 0.5, "perplexity": 100.0, "final": true}\n'
    (pathlib.Path(workdir) / "metrics.jsonl").write_text(final)
    return types.SimpleNamespace(step=1, eval_metrics={"accuracy": 0.5, "perplexity": 100.0},
                                 compiled_batch_sizes=())

  namespace = {}
  for cell in nbformat.read(path, as_version=4).cells:
    if cell.cell_type != "code" or "%pip" in cell.source:
      continue
    try:
      exec(compile(cell.source, f"{path.name} cell", "exec"), namespace)  # pylint: disable=exec-used
    except Exception:  # pylint: disable=broad-except  (a cell that needs a real run's results)
      pass
    if "train_and_evaluate" in namespace:
      namespace["train_and_evaluate"] = check
  assert checked and not refused, refused
