"""Config files, their variants and command-line overrides: one path for every setting.

A config is a module with

  get_config() -> ConfigDict      the baseline run;
  VARIANTS: dict[str, Variant]    the keys of `name:key=value,...`;
  finalize(config, presets)       optional: settings that follow from others (e.g. LEGW's baseline
                                  warm-up when `scaling.rule` is "legw"), and the presets.

An override of a whole argument section swaps the function it names: `--config.optimizer=adamw` makes the
section `{name: "adamw"}`, dropping the arguments the config set for the old optimizer; a dict literal,
`--config.optimizer={'name': 'adamw', 'weight_decay': 0.01}` or `--config.model_options={}`, gives the
new arguments. The section's recipe fields (`scaling.base_batch_size`; `lr.base`, `lr.warmup`,
`lr.warmup_epochs`) are kept unless the dict gives them, and a dict without the name keeps the name.

A `Variant` with a `field` is an alias: `:batch=8192` is exactly `--config.batch_size=8192`. Both are
typed by the field (a bad value names the key and the type it wants), and both are applied before
`finalize`, which therefore sees the same config whichever way a field was set; fields set explicitly
are applied again after it, so an explicit setting always wins. A variant without a field is a
preset (e.g. `recipe=zaremba`), handed to `finalize` typed and checked against its choices.

`--config mnist_lstm` is the packaged `lbjax.configs.mnist_lstm`; `--config path/to/file.py` a
user's file; either may end in `:variant`. This module belongs to the command line (with `lbjax.main`):
it imports the configs and the trainer, and neither imports it.
"""

import ast
from collections.abc import Collection, Mapping, Sequence
import dataclasses
import functools
import importlib
import importlib.util
import pathlib
import pkgutil
import traceback
from types import ModuleType
from typing import Any

import ml_collections

from lbjax import configs as packaged_configs
from lbjax.configs import Variant
from lbjax.train import names
from lbjax.train import config as config_lib
from lbjax.train.config import ARGUMENT_SECTIONS, SECTION_NAME_FIELDS, trainer_fields
from lbjax.train.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class LoadedConfig:
  """A resolved config and where it came from (shown by the console and written to config.json)."""
  config: ml_collections.ConfigDict
  source: str  # "mnist_lstm" or a file path
  variant: str
  overrides: tuple[str, ...]
  description: str


def packaged_names() -> list[str]:
  """The configs shipped in `lbjax.configs`."""
  return sorted(m.name for m in pkgutil.iter_modules(packaged_configs.__path__) if not m.name.startswith("_"))


def _what_a_config_file_defines() -> str:
  example = pathlib.Path(packaged_configs.__file__).parent / "mnist_lstm.py"
  return ("A config file defines get_config() returning lbjax.train.default_config() with its changes (and "
          f"optionally VARIANTS and finalize(config, presets)); copy a packaged one, e.g. {example}.")


def _failure_in_file(path: pathlib.Path, error: Exception) -> str:
  """What went wrong running the user's file: the error and the line of the file it came from."""
  if isinstance(error, SyntaxError) and error.filename and pathlib.Path(error.filename) == path:
    return f"has a syntax error at line {error.lineno}: {error.msg}"
  lines = [frame.lineno for frame in traceback.extract_tb(error.__traceback__)
           if frame.filename and pathlib.Path(frame.filename) == path]
  where = f" at line {lines[-1]}" if lines else ""
  if isinstance(error, ImportError):
    return f"failed to import{where}: {error}. Install the module it needs, or remove the import"
  return f"raised {type(error).__name__}{where}: {error}"


def _module_from_file(path: pathlib.Path) -> ModuleType:
  spec = importlib.util.spec_from_file_location(f"lbjax_user_config_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except Exception as e:  # pylint: disable=broad-except  (the user's code: any error is the file's)
    raise ConfigError(f"Config file {path} {_failure_in_file(path, e)}. {_what_a_config_file_defines()}") from e
  return module


@functools.cache
def _run_fields() -> frozenset[str]:
  """The field paths every run config has: `default_config()`'s outside the argument sections (whose fields
  are a function's arguments), and each argument section's own fields (its name and the like)."""
  own = {path for path in config_lib.field_paths(config_lib.default_config())
         if path.split(".")[0] not in ARGUMENT_SECTIONS}
  own |= {f"{section}.{field}" for section in ARGUMENT_SECTIONS for field in trainer_fields(section)}
  return frozenset(own)


def _file_config(module: ModuleType, source: str) -> ml_collections.ConfigDict:
  """`module.get_config()`, checked to be a whole run config: every field of `default_config()` outside the
  argument sections (whose fields are a function's arguments), and no field it does not have."""
  get_config = getattr(module, "get_config", None)
  if not callable(get_config):
    raise ConfigError(f"Config file {source} defines no get_config(). {_what_a_config_file_defines()}")
  try:
    config = get_config()
  except Exception as e:  # pylint: disable=broad-except  (the user's code: any error is the file's)
    path = pathlib.Path(module.__file__) if getattr(module, "__file__", None) else None
    raise ConfigError(f"Config file {source}: get_config() "
                      f"{_failure_in_file(path, e) if path else f'raised {type(e).__name__}: {e}'}. "
                      f"{_what_a_config_file_defines()}") from e
  if not isinstance(config, ml_collections.ConfigDict):
    raise ConfigError(f"Config file {source}: get_config() returned a {type(config).__name__}, not an "
                      f"ml_collections.ConfigDict. {_what_a_config_file_defines()}")
  own = _run_fields()
  present = config_lib.field_paths(config)
  missing = sorted(own - present) + [section for section in ARGUMENT_SECTIONS
                                     if not isinstance(config.get(section), ml_collections.ConfigDict)]
  if missing:
    shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
    raise ConfigError(f"Config file {source}: get_config() returned a config without {shown}. "
                      f"{_what_a_config_file_defines()}")
  unknown = sorted(path for path in present - own if path.split(".")[0] not in ARGUMENT_SECTIONS)
  if unknown:
    details = [f"{path!r}{names.did_you_mean(path, sorted(own))}" for path in unknown]
    raise ConfigError(f"Config file {source}: get_config() sets fields a run does not have: {', '.join(details)}. "
                      "Only the argument sections (" + ", ".join(ARGUMENT_SECTIONS) + ") take new fields, their "
                      "functions' arguments.")
  return config


def config_module(source: str) -> ModuleType:
  """The config module `source` names: a packaged config or a `.py` file."""
  if source.endswith(".py") or "/" in source:
    path = pathlib.Path(source)
    if path.is_file():
      return _module_from_file(path)
    packaged = path.stem if path.stem in packaged_names() else None
    hint = f" The packaged config {packaged!r} is `--config {packaged}`." if packaged else ""
    raise ConfigError(f"Config file {source} not found.{hint} Packaged configs: {', '.join(packaged_names())}.")
  if source not in packaged_names():
    close = names.suggestions(source, packaged_names())
    hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
    raise ConfigError(f"No config named {source!r}.{hint} Packaged configs: {', '.join(packaged_names())}; "
                      "or pass a file, --config path/to/my_config.py.")
  return importlib.import_module(f"{packaged_configs.__name__}.{source}")


def describe_module(module: ModuleType) -> str:
  """The first line of a config's docstring: what it reproduces."""
  return (module.__doc__ or "").strip().splitlines()[0] if module.__doc__ else ""


_BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _parse_as(text: str, kind: type) -> Any:
  """`text` as a value of `kind`; ValueError or SyntaxError if it is not one."""
  if kind is bool:
    if text.lower() not in _BOOLEANS:
      raise ValueError(text)
    return _BOOLEANS[text.lower()]
  if kind in (tuple, list):
    value = ast.literal_eval(text)
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)
  if kind in (int, float, str):
    return kind(text)
  return _literal(text)


def _parse_typed(text: str, kind: type, where: str) -> Any:
  text = text.strip()
  try:
    return _parse_as(text, kind)
  except (ValueError, SyntaxError):
    raise ConfigError(f"{where}={text!r}: expected {'true/false' if kind is bool else kind.__name__}.") from None


def _literal(text: str) -> Any:
  """A new field's value: a Python literal where it parses as one (1e-4, True, (1, 2)), true/false in any case
  as the bool a typed field takes, else the text. ('false' left as text was a true string to a function that
  tests it: optax.sgd's nesterov='false' turned Nesterov on.)"""
  if text.strip().lower() in ("true", "false"):
    return text.strip().lower() == "true"
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def _field_type(config: ml_collections.ConfigDict, path: str, where: str) -> type | None:
  """The type of an existing field; None for a new field of an argument section; an error otherwise."""
  *parents, leaf = path.split(".")
  node = config
  for i, part in enumerate(parents):
    if part not in node or not isinstance(node[part], ml_collections.ConfigDict):
      sections = [k for k in node.keys() if isinstance(node[k], ml_collections.ConfigDict)]
      close = names.suggestions(part, sections)
      hint = f" Did you mean {'.'.join(parents[:i] + [close[0]])!r}?" if close else ""
      raise ConfigError(f"{where}: config has no section {'.'.join(parents[:i + 1])!r}.{hint}")
    node = node[part]
  if leaf in node:
    if isinstance(node[leaf], ml_collections.ConfigDict):
      example = next(iter(node[leaf]), "x")
      raise ConfigError(f"{where}: {path!r} is a section; set one of its fields, e.g. --config.{path}.{example}=...; "
                        f"only the argument sections ({', '.join(ARGUMENT_SECTIONS)}) can be replaced whole.")
    value = node[leaf]
    return None if value is None else type(value)
  if parents and parents[0] in ARGUMENT_SECTIONS and len(parents) == 1:
    return None
  close = names.suggestions(leaf, list(node.keys()))
  hint = f" Did you mean {'.'.join(parents + [close[0]])!r}?" if close else ""
  raise ConfigError(f"{where}: config has no field {path!r}.{hint} New fields can be added only to the "
                    f"argument sections ({', '.join(ARGUMENT_SECTIONS)}), whose fields are a function's arguments.")

_SCALARS = (bool, int, float, str, type(None))


def _section_replacement(section: str, text: str, where: str) -> dict[str, Any]:
  """The fields an override of a whole argument section gives: `{name_field: text}` for a name, or the
  dict literal `text` (scalar or tuple values)."""
  name_field = SECTION_NAME_FIELDS.get(section)
  if not text.startswith("{"):
    if name_field is None:
      function = "config.model" if section == "model_options" else "config.dataset"
      raise ConfigError(f"{where}={text!r}: config.{section} holds the keyword arguments of {function}, so it takes "
                        f"a dict: --config.{section}={{}} drops them all, --config.{section}=\"{{'x': 1}}\" sets "
                        f"them; the function itself is --config.{function.split('.')[1]}=NAME.")
    return {name_field: text}
  try:
    value = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    value = None
  fields_ok = isinstance(value, dict) and all(
      isinstance(k, str) and k.isidentifier() and isinstance(v, (*_SCALARS, tuple)) for k, v in value.items())
  if not fields_ok:
    example = "{'name': 'adamw', 'weight_decay': 0.01}" if name_field == "name" else "{}"
    raise ConfigError(f"{where}={text!r}: expected a name or a Python dict literal of the section's fields with "
                      f"plain values, e.g. --config.{section}=\"{example}\" (quoted for the shell).")
  return value


def _replace_section(config: ml_collections.ConfigDict, section: str, text: str, where: str) -> None:
  """`--config.optimizer=adamw`: the section becomes the given fields, keeping its own fields (and, for a
  dict without it, its name) from before."""
  fields = _section_replacement(section, text.strip(), where)
  kept = trainer_fields(section)
  old = config[section]
  new = {k: old[k] for k in kept if k in old and k not in fields}
  new.update(fields)
  with config.ignore_type():
    config[section] = ml_collections.ConfigDict(new)


def _assign(config: ml_collections.ConfigDict, path: str, text: str, where: str) -> None:
  if path in ARGUMENT_SECTIONS and isinstance(config.get(path), ml_collections.ConfigDict):
    _replace_section(config, path, text, where)
    return
  kind = _field_type(config, path, where)
  value = _literal(text) if kind is None else _parse_typed(text, kind, where)
  if kind is float and isinstance(value, int):
    value = float(value)
  *parents, leaf = path.split(".")
  node = config
  for part in parents:
    node = node[part]
  with node.ignore_type():
    node[leaf] = value


def parse_override(item: str) -> tuple[str, str]:
  """`--config.lr.base=0.5` (or `config.lr.base=0.5`) -> ("lr.base", "0.5")."""
  text = item[2:] if item.startswith("--") else item
  if not text.startswith("config.") or "=" not in text:
    raise ConfigError(f"Override {item!r}: expected --config.<field>=<value>, e.g. --config.lr.base=0.5.")
  path, _, value = text[len("config."):].partition("=")
  return path, value


def parse_variant(variant: str, declared: Mapping[str, Variant], source: str) -> dict[str, str]:
  """`"batch=8192,rule=legw"` -> {"batch": "8192", "rule": "legw"}, keys checked against `declared`."""
  parsed = {}
  for item in filter(None, (part.strip() for part in variant.split(","))):
    key, sep, value = item.partition("=")
    key = key.strip()
    if not sep or not key:
      raise ConfigError(f"{source}:{variant}: expected comma-separated key=value pairs such as "
                        f"'batch=8192,rule=legw', got {item!r}.")
    if key not in declared:
      known = ", ".join(declared) or "none"
      raise ConfigError(f"{source}: unknown variant key {key!r}{names.did_you_mean(key, list(declared))}; this "
                        f"config understands {known}.")
    parsed[key] = value.strip()
  return parsed


def _presets(declared: Mapping[str, Variant], given: Mapping[str, str]) -> dict[str, Any]:
  """The value of every preset key (one without a field): given, or its default."""
  presets = {key: v.default for key, v in declared.items() if v.field is None}
  for key, text in given.items():
    declaration = declared[key]
    if declaration.field is None:
      value = _parse_typed(text, declaration.type, f"variant {key}")
      if declaration.choices and value not in declaration.choices:
        raise ConfigError(f"variant {key}={text!r}: choose one of {', '.join(map(str, declaration.choices))}.")
      presets[key] = value
  return presets


def _moot_keys(declared: Mapping[str, Variant], given: Mapping[str, str], presets: Mapping[str, Any]) -> dict[str, str]:
  """Each given key that applies only with other presets than these (`Variant.only_with`), with why."""
  moot = {}
  for key, text in given.items():
    if declared[key].only_with and presets[declared[key].only_with[0]] not in declared[key].only_with[1]:
      preset, values = declared[key].only_with
      moot[key] = (f"variant {key}={text} applies only with {preset}={' or '.join(map(str, values))}, and {preset} "
                   f"is {presets[preset]}: remove {key}, or set {preset}.")
  return moot


def _declared_and_given(spec: str) -> tuple[str, Mapping[str, Variant], dict[str, str]]:
  """`spec` (`name[:variant]`) read: its source, the variant keys its config declares and those it gives."""
  source, _, variant = spec.partition(":")
  declared: Mapping[str, Variant] = getattr(config_module(source), "VARIANTS", {})
  return source, declared, parse_variant(variant, declared, source)


def moot_keys(spec: str) -> dict[str, str]:
  """The variant keys of `spec` (`name[:variant]`) that its presets make moot (`Variant.only_with`), each with
  the sentence `load` refuses it with."""
  _, declared, given = _declared_and_given(spec)
  return _moot_keys(declared, given, _presets(declared, given))


def without_keys(spec: str, keys: Collection[str]) -> str:
  """`spec` (`name[:variant]`) without the variant `keys`."""
  source, _, given = _declared_and_given(spec)
  kept = ",".join(f"{key}={text}" for key, text in given.items() if key not in keys)
  return f"{source}:{kept}" if kept else source


def load(spec: str, overrides: Sequence[str] = ()) -> LoadedConfig:
  """The config `spec` (`name[:variant]` or `path.py[:variant]`) with command-line `overrides`.

  Raises:
    ConfigError: unknown config, variant key or field, or a value of the wrong type.
  """
  source, _, variant = spec.partition(":")
  module = config_module(source)
  declared: Mapping[str, Variant] = getattr(module, "VARIANTS", {})
  config = _file_config(module, source)
  explicit: list[tuple[str, str, str]] = []  # (field, value, where)
  given = parse_variant(variant, declared, source)
  presets = _presets(declared, given)
  if moot := _moot_keys(declared, given, presets):
    raise ConfigError(f"{source}:{variant}: " + " ".join(moot.values()))
  for key, text in given.items():
    if declared[key].field is not None:
      explicit.append((declared[key].field, text, f"variant {key} (config.{declared[key].field})"))
  for item in overrides:
    path, text = parse_override(item)
    explicit.append((path, text, f"--config.{path}"))
  for path, text, where in explicit:
    _assign(config, path, text, where)
  if hasattr(module, "finalize"):
    try:
      module.finalize(config, presets)
    except (ValueError, TypeError) as e:
      raise ConfigError(f"{source}: {e}") from e
    for path, text, where in explicit:  # what was set explicitly wins over what follows from it
      _assign(config, path, text, where)
  elif any(v is not None for v in presets.values()):
    raise ConfigError(f"{source}: presets {sorted(presets)} declared without a finalize(config, presets).")
  _refuse_moot(config, explicit)
  return LoadedConfig(config, source, variant, tuple(overrides), describe_module(module))


def _refuse_moot(config: ml_collections.ConfigDict, explicit: Sequence[tuple[str, str, str]]) -> None:
  """Refuses an explicit setting that the config's other settings make moot: `batch_size` beside a
  `batch_sizes` schedule that does not start at it (the schedule gives the batch of every epoch)."""
  for path, _, where in explicit:
    if path == "batch_size" and config.get("batch_sizes") and config.batch_size != config.batch_sizes[0]:
      raise ConfigError(f"{where}={config.batch_size} is not used: config.batch_sizes={tuple(config.batch_sizes)} "
                        "gives the batch size of every epoch. Set config.batch_sizes (and "
                        "config.batch_size_boundaries) instead, or --config.batch_sizes=() for a constant batch.")


def variant_help(module: ModuleType) -> list[str]:
  """One line per variant key of a config module, for `--list`."""
  lines = []
  for key, v in getattr(module, "VARIANTS", {}).items():
    what = f"= --config.{v.field}" if v.field else (" | ".join(map(str, v.choices)) if v.choices else v.type.__name__)
    default = f" (default {v.default})" if v.field is None and v.default is not None else ""
    only = f", only with {v.only_with[0]}={' or '.join(map(str, v.only_with[1]))}" if v.only_with else ""
    lines.append(f"{key:<10} {v.help} [{what}]{default}{only}")
  return lines
