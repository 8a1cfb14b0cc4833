"""Every `papers/00N` named in the repository's code and docs has its section in docs/papers.md."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAPERS_MD = ROOT / "docs" / "papers.md"
REFERENCE = re.compile(r"papers/(00[0-9])")
SKIP_DIRS = {".git", ".venv", "venv", "build", "dist", "node_modules", "__pycache__"}


def _sources():
  """The repository's *.py and *.md files, outside hidden, virtual-environment and build folders."""
  for path in sorted(ROOT.rglob("*")):
    relative = path.relative_to(ROOT)
    if path.suffix not in (".py", ".md") or not path.is_file():
      continue
    if any(part in SKIP_DIRS or part.startswith(".") for part in relative.parts[:-1]):
      continue
    yield path


def _sections():
  return set(re.findall(r"^## papers/(00[0-9])\s*$", PAPERS_MD.read_text(encoding="utf-8"), re.M))


def test_every_paper_reference_has_a_section_in_docs_papers_md():
  sections = _sections()
  where = {}
  for path in _sources():
    for number in REFERENCE.findall(path.read_text(encoding="utf-8", errors="replace")):
      where.setdefault(number, path.relative_to(ROOT))
  assert where, "found no papers/00N reference at all: is ROOT the repository?"
  missing = {f"papers/{n}": str(p) for n, p in sorted(where.items()) if n not in sections}
  assert not missing, (
      f"docs/papers.md has no '## papers/00N' section for {sorted(missing)} (first named in: "
      f"{missing}); add one with the paper's citation and what lbjax takes from it.")


def test_the_five_shared_papers_have_sections():
  assert {"000", "001", "002", "003", "004"} <= _sections()
