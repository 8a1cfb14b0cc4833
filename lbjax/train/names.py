"""The name is the import: how a config's names become functions, and its fields their arguments.

A config names functions; it does not index tables. `optimizer.name = "lars"` is `lbjax.optim.lars`,
`"adamw"` is `optax.adamw`, and `"my_project.optim:my_transform"` is a user's own function: a name
without a colon is looked up as an attribute of the namespaces the field lists (in order), a name with
a colon is imported. The section's other fields are the function's keyword arguments, bound to its
signature before any compute (`bind`): an argument the function does not take is an error that names
the field, the function and the arguments it does take, so no setting is ever dropped.
"""

from collections.abc import Callable, Mapping, Sequence
import dataclasses
import difflib
import importlib
import inspect
from types import ModuleType
import typing
from typing import Any
import warnings

from lbjax.train.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Resolved:
  """A config name resolved to its function, with the name a reader sees (`lbjax.optim.lars`)."""
  name: str
  function: Callable[..., Any]
  qualified_name: str


@dataclasses.dataclass(frozen=True)
class Call:
  """A resolved function and the keyword arguments the config binds to it (what a run calls)."""
  resolved: Resolved
  arguments: dict[str, Any]

  def __call__(self, **more: Any) -> Any:
    return self.resolved.function(**self.arguments, **more)

  def describe(self) -> str:
    return describe(self.resolved, self.arguments)


def _public_names(namespace: ModuleType) -> list[str]:
  names = getattr(namespace, "__all__", None) or dir(namespace)
  with warnings.catch_warnings():  # reading optax's deprecated aliases warns
    warnings.simplefilter("ignore")
    return [n for n in names if not n.startswith("_") and callable(getattr(namespace, n, None))]


def _normalized(name: str) -> str:
  return name.lower().replace("_", "")


def did_you_mean(name: str, candidates: Sequence[str]) -> str:
  """" (did you mean 'x'?)" with the closest of `candidates` to a mistyped `name`, or "" if none is close."""
  close = suggestions(name, candidates)
  return f" (did you mean {close[0]!r}?)" if close else ""


def suggestions(name: str, candidates: Sequence[str]) -> list[str]:
  """Close matches of a mistyped name (`larz` -> `lars`; `mnist_lstm` -> `MnistLSTM`)."""
  same = [c for c in candidates if _normalized(c) == _normalized(name)]
  if same:
    return same
  by_normal = {_normalized(c): c for c in candidates}
  close = difflib.get_close_matches(_normalized(name), list(by_normal), n=3, cutoff=0.6)
  return [by_normal[c] for c in close]


def resolve(field: str, name: str, namespaces: Sequence[ModuleType]) -> Resolved:
  """The function `name` stands for in config field `field`.

  Args:
    field: the config field, for messages (`optimizer.name`).
    name: an attribute of one of `namespaces` (the first that has it wins), or `"module.path:attr"`.
    namespaces: the modules a bare name is looked up in.

  Raises:
    ConfigError: the name is not found (with close matches), or the import fails.
  """
  if not isinstance(name, str) or not name:
    raise ConfigError(f"config.{field} must be a name such as {_public_names(namespaces[0])[0]!r}, got {name!r}.")
  if ":" in name:
    module_name, _, attribute = name.partition(":")
    try:
      module = importlib.import_module(module_name)
    except ImportError as e:
      raise ConfigError(f"config.{field}={name!r}: cannot import module {module_name!r} ({e}). A user's "
                        "function is named 'package.module:function', with the package importable.") from e
    function = getattr(module, attribute, None)
    if not callable(function):
      raise ConfigError(f"config.{field}={name!r}: module {module_name!r} has no function {attribute!r}.")
    return Resolved(name, function, name)
  for namespace in namespaces:
    function = getattr(namespace, name, None)
    if callable(function) and not name.startswith("_"):
      return Resolved(name, function, f"{namespace.__name__}.{name}")
  known = sorted({n for namespace in namespaces for n in _public_names(namespace)})
  close = suggestions(name, known)
  hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
  where = " or ".join(n.__name__ for n in namespaces)
  listed = sorted(n for n in _public_names(namespaces[0]) if n[0].islower() or field == "model")
  raise ConfigError(f"config.{field}={name!r} is not a function of {where}.{hint} {namespaces[0].__name__} has "
                    f"{', '.join(listed)}; or name your own as 'package.module:function'.")


def parameters(function: Callable[..., Any]) -> dict[str, inspect.Parameter]:
  """The keyword-bindable parameters of `function` (a class: of its constructor)."""
  if inspect.isclass(function):  # a module's metaclass may hide the constructor's signature
    signature = inspect.signature(function.__init__)
    return {name: p for name, p in list(signature.parameters.items())[1:]
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
  signature = inspect.signature(function)
  return {name: p for name, p in signature.parameters.items()
          if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def takes(function: Callable[..., Any], name: str) -> bool:
  return name in parameters(function)


def bind(section: str, resolved: Resolved, options: Mapping[str, Any], *,
         supplied: Mapping[str, Any] = None, required: Sequence[str] = (), owned: Sequence[str] = ()
         ) -> dict[str, Any]:
  """The keyword arguments of `resolved.function`: the config's `options` and what the trainer supplies.

  Args:
    section: the config section the options come from (`optimizer`), for messages.
    resolved: the function.
    options: the section's fields other than the name; each must be an argument of the function.
    supplied: arguments the trainer provides (e.g. a model's `num_classes` from its dataset); used
      where the function takes them and the config does not set them.
    required: arguments of `supplied` the function must take (e.g. an optimizer's `learning_rate`).
    owned: arguments of `supplied` the config may not set, where the function takes them (a compressor's
      `axis_name`, which must be the mesh axes the trainer reduces over). `required` ones are owned too.

  Raises:
    ConfigError: an option the function does not take, a required argument it lacks, or a
      parameter without default that neither the config nor the trainer gives.
  """
  accepted = parameters(resolved.function)
  supplied = dict(supplied or {})
  missing_required = [r for r in required if r not in accepted]
  if missing_required:
    raise ConfigError(f"config.{section}: {resolved.qualified_name} takes no {', '.join(missing_required)} "
                      f"argument, which the trainer must pass; its arguments are {', '.join(accepted) or 'none'}.")
  options = dict(options)
  trainer_owned = sorted(set(options) & set(supplied) & (set(required) | set(owned)))
  if trainer_owned:
    raise ConfigError(f"config.{section}.{trainer_owned[0]} is set by the trainer (from the rest of the "
                      "config); remove it from the section.")
  unknown = [k for k in options if k not in accepted]
  if unknown:
    settable = [a for a in accepted if a not in required]
    lines = [f"config.{section}.{k}: {resolved.qualified_name} takes no argument {k!r}"
             + (f" (did you mean {' or '.join(map(repr, suggestions(k, settable)))}?)"
                if suggestions(k, settable) else "") for k in unknown]
    raise ConfigError("\n".join(lines) + f".\nIts arguments are: {', '.join(settable) or 'none'}. Remove the "
                      "field, or choose a function that takes it;\n" + _replace_hint(section, resolved))
  arguments = {k: v for k, v in supplied.items() if k in accepted and k not in options}
  arguments.update(options)
  unset = [name for name, p in accepted.items() if p.default is p.empty and name not in arguments]
  if unset:
    raise ConfigError(f"config.{section}: {resolved.qualified_name} needs {', '.join(unset)}; set "
                      + ", ".join(f"config.{section}.{u}" for u in unset) + ".")
  refused = [_choice_problem(section, resolved, name, value, accepted[name]) for name, value in options.items()]
  if any(refused):
    raise ConfigError("\n".join(filter(None, refused)))
  return arguments


def _choice_problem(section: str, resolved: Resolved, name: str, value: Any, parameter: inspect.Parameter
                    ) -> str | None:
  """The option's value against the choices of a `Literal[...]` annotation (e.g. a dataset's `eval_split`), which
  the function would refuse only once called (a dataset: once its data is opened)."""
  if typing.get_origin(parameter.annotation) is not typing.Literal:
    return None
  choices = typing.get_args(parameter.annotation)
  if value in choices:
    return None
  hint = did_you_mean(value, [str(c) for c in choices]) if isinstance(value, str) else ""
  return (f"config.{section}.{name}={value!r}: {resolved.qualified_name} takes {name} "
          f"{' or '.join(map(repr, choices))}{hint}.")


def _replace_hint(section: str, resolved: Resolved) -> str:
  """How to drop a section's arguments from the command line (lbjax.config_files)."""
  if section in ("model_options", "data_options"):
    return f"on the command line, --config.{section}={{}} drops all of the section's arguments."
  return (f"on the command line, --config.{section}={resolved.name} names it and drops the arguments set for the "
          "function before.")


def declared_class(function: Any) -> type | None:
  """The class a constructor builds: itself, or a factory's annotated return class (else None). Where a
  model declares what the trainer must know (`TENSOR_PARALLEL_SPECS`, `training_batch_multiple`)."""
  if isinstance(function, type):
    return function
  returned = getattr(function, "__annotations__", {}).get("return")
  return returned if isinstance(returned, type) else None


def describe(resolved: Resolved, arguments: Mapping[str, Any]) -> str:
  """`lbjax.optim.lars(momentum=0.9, weight_decay=0.0005)`: a resolved call for the console."""
  shown = ", ".join(f"{k}={_short(v)}" for k, v in arguments.items())
  return f"{resolved.qualified_name}({shown})"


def _short(value: Any) -> str:
  if callable(value) and hasattr(value, "__name__"):
    return value.__name__
  if isinstance(value, float):
    return f"{value:g}"
  return repr(value)
