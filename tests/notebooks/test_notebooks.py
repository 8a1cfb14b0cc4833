"""Executes every notebook in notebooks/ at tiny sizes (LBJAX_NOTEBOOK_TINY=1) with nbclient."""

import os
import pathlib
import re
import tomllib

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
