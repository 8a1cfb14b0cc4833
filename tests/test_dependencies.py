"""A flax that cannot import under the installed jax is named, with what to install."""

from importlib import metadata
import types

import jax.experimental
import pytest

from lbjax import dependencies


@pytest.fixture
def installed(monkeypatch):
  def install(flax_version: str, jax_has_hi_primitive: bool):
    monkeypatch.setattr(metadata, "version", lambda name: {"flax": flax_version}[name])
    hijax = types.ModuleType("jax.experimental.hijax")
    if jax_has_hi_primitive:
      hijax.HiPrimitive = object
    monkeypatch.setitem(__import__("sys").modules, "jax.experimental.hijax", hijax)
    monkeypatch.setattr(jax.experimental, "hijax", hijax, raising=False)
  return install


@pytest.mark.parametrize("flax_version", ["0.12.8", "0.12.9"])
def test_an_old_flax_under_a_jax_without_hi_primitive_is_refused_with_the_fix(installed, flax_version):
  installed(flax_version, jax_has_hi_primitive=False)
  with pytest.raises(ImportError, match=rf"flax {flax_version} does not work with jax .*flax>=0.12.10"):
    dependencies.check_flax_works_with_jax()


@pytest.mark.parametrize("flax_version, jax_has_hi_primitive", [("0.12.8", True), ("0.12.10", False),
                                                                  ("0.12.12", False), ("0.13.0rc1", False)])
def test_working_pairs_pass(installed, flax_version, jax_has_hi_primitive):
  installed(flax_version, jax_has_hi_primitive)
  dependencies.check_flax_works_with_jax()


def test_the_installed_pair_works():
  dependencies.check_flax_works_with_jax()
