"""Executes every notebook in notebooks/ at tiny sizes (LBJAX_NOTEBOOK_TINY=1) with nbclient."""

import os
import pathlib

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((pathlib.Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


def test_there_are_the_three_notebooks():
  assert [p.name[:3] for p in NOTEBOOKS] == ["01_", "02_", "03_"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_tiny(path, tmp_path, monkeypatch):
  monkeypatch.setenv("LBJAX_NOTEBOOK_TINY", "1")
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
