"""Typed experiment configs: ``@dataclass`` trees loaded from YAML plus dotted command-line overrides.

Example::

    from dataclasses import dataclass, field
    from mmrl.config import Variants, load_config, save_config

    @dataclass
    class TrainerConfig:
        lr: float = 1e-5
        epochs: int = 1

    @dataclass
    class AlgoConfig(Variants):            # the section's `type` key picks a registered variant
        type: str = "ppo"                  # the base itself is the variant named by this default
        gamma: float = 0.99

    @AlgoConfig.variant("grpo")
    @dataclass
    class GRPOConfig(AlgoConfig):          # extra keys exist only when `type: grpo`
        group_size: int = 8

    @dataclass
    class ExperimentConfig:
        name: str                          # no default: required
        trainer: TrainerConfig = field(default_factory=TrainerConfig)
        algorithm: AlgoConfig = field(default_factory=AlgoConfig)

    cfg = load_config(ExperimentConfig, "configs/x.yaml", ["trainer.lr=3e-6", "algorithm.type=grpo"])
    assert isinstance(cfg.algorithm, GRPOConfig)
    save_config(cfg, "ckpt/config.yaml")   # load_config(ExperimentConfig, "ckpt/config.yaml") == cfg

Rules:

* Field types: int, float, str, bool, ``X | None``, ``list[X]``, ``tuple[X, ...]``/``tuple[X, Y]``,
  ``Literal[...]`` (the allowed values), ``dict[str, Any]`` (free-form), ``Any``, and dataclasses
  (sections). At most three levels: root -> section -> subsection (keys ``a.b.c``, plus keys inside
  free-form dicts); a deeper schema raises TypeError. Schemas using ``from __future__ import
  annotations`` must be module-level classes (the hints are resolved with ``get_type_hints``).
* Strict values: bool is not an int, nothing becomes a str (quote it), ints are fine for floats.
  One coercion: PyYAML follows YAML 1.1 and reads ``1e-5`` (no dot) as the string "1e-5", so
  numeric strings are turned into floats for float fields. Lists become tuples for tuple fields.
* A section not given keeps its default (the ``default_factory`` instance); a section given is that
  default with the given keys on top. A section field without default is built from its keys.
* Variants: ``type`` picks a registered class; changing it (YAML or override) builds the new class
  from its own defaults plus the given keys, and keys it lacks are errors. Don't name a field
  ``variant``; a variant's own ``__post_init__`` must call ``super().__post_init__()``.
* After the tree is built, each dataclass's ``validate(self)`` (if defined) runs, innermost first,
  for cross-field checks; a ValueError/ConfigError raised there comes back as ConfigError prefixed
  with the section's key path.
* Every bad file, dict or override raises ConfigError (a ValueError) naming the full key path and
  the allowed keys or values, before any work starts; schema bugs raise TypeError.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

import yaml

__all__ = ["ConfigError", "Variants", "variants_of", "load_config", "to_dict", "save_config", "config_keys"]

T = TypeVar("T")
MAX_DEPTH = 3  # levels of dataclasses: root -> section -> subsection
_MISSING = dataclasses.MISSING
_NONE = type(None)
_FLOAT_RE = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_KEY_RE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


class ConfigError(ValueError):
    """An invalid config file, dict or override; the message names the key path and the fix."""


def check_range(obj: Any, rules: dict[str, str]) -> None:
    """Raise `ConfigError` for the first field of ``obj`` outside its rule. Rules: ``">0"``,
    ``">=0"``, ``">=1"``, ``">1"``, ``"0..1"`` (inclusive); a None value passes (an optional field
    left unset). The message names the key, its value and the valid range."""
    tests = {
        ">0": lambda v: v > 0,
        ">=0": lambda v: v >= 0,
        ">=1": lambda v: v >= 1,
        ">1": lambda v: v > 1,
        "0..1": lambda v: 0 <= v <= 1,
    }
    for name, rule in rules.items():
        value = getattr(obj, name)
        if value is not None and not tests[rule](value):
            valid = {"0..1": "between 0 and 1"}.get(
                rule, rule.replace(">=", ">= ").replace(">0", "> 0").replace(">1", "> 1")
            )
            raise ConfigError(f"'{name}' = {value!r} must be {valid}")


class Variants:
    """Mixin for a section whose ``type`` key selects a registered dataclass subclass.

    The base must be a dataclass with a ``type: str`` field; its default names the base itself.
    Register subclasses with ``@Base.variant("name")`` placed above ``@dataclass``.
    """

    _registry: ClassVar[dict[str, type]]  # the family's variants (set on its base)
    _variant_name: ClassVar[str]  # the ``type`` a registered variant is selected by
    __dataclass_fields__: ClassVar[dict[str, Any]]  # every family is a dataclass

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if Variants in cls.__bases__:
            cls._registry = {}  # one registry per family, shared by its subclasses

    @classmethod
    def variant(cls, name: str):
        """Class decorator registering a ``@dataclass`` subclass under the ``type`` value ``name``."""

        def register(sub: type) -> type:
            if not (isinstance(sub, type) and issubclass(sub, cls) and "__dataclass_fields__" in vars(sub)):
                raise TypeError(
                    f"@{cls.__name__}.variant({name!r}) must decorate a @dataclass subclass "
                    f"of {cls.__name__} (put @dataclass below it)"
                )
            if "type" not in sub.__dataclass_fields__:
                raise TypeError(f"{cls.__name__} needs a field `type: str = '<default variant>'`")
            if name in cls._registry:
                raise TypeError(f"variant {name!r} of {cls.__name__} is already registered")
            cls._registry[name] = sub
            sub._variant_name = name
            return sub

        return register

    @classmethod
    def variant_class(cls, name: str) -> type | None:
        """The class of variant ``name`` of this family, or None. A family whose variants live in a
        registry of their own (policies: one registration carries config and class, plugins
        included) overrides this and `variant_names`."""
        return variants_of(cls).get(name)

    @classmethod
    def variant_names(cls) -> list[str]:
        """Every ``type`` value this family accepts (for error messages and `config_keys`)."""
        return list(variants_of(cls))

    def __post_init__(self) -> None:  # GRPOConfig() gets type "grpo" even when built by hand
        name = type(self).__dict__.get("_variant_name")
        if name is not None and getattr(self, "type", None) != name:
            object.__setattr__(self, "type", name)


# ----------------------------------------------------------------------------------------- public


def variants_of(cls: type) -> dict[str, type]:
    """Type name -> class for ``cls`` and its registered subclasses (the family's base counts under
    its default ``type``)."""
    root = next(k for k in cls.__mro__ if Variants in k.__bases__ and issubclass(k, Variants))
    found = dict(root._registry)
    default = root.__dataclass_fields__["type"].default
    if isinstance(default, str) and default not in found:
        found = {default: root, **found}
    return {name: k for name, k in found.items() if issubclass(k, cls)}


def load_config(schema: type[T], source: str | Path | dict | None = None, overrides: Sequence[str] = ()) -> T:
    """Build ``schema`` from a YAML file path (or a dict, or nothing) plus ``key.path=value`` overrides.

    Override values are parsed with ``yaml.safe_load`` (``1e-5``, ``true``, ``[a,b]``, ``null``).
    """
    if not dataclasses.is_dataclass(schema):
        raise TypeError(f"load_config needs a @dataclass schema, got {schema!r}")
    list(_walk(schema, "", 0, None))  # schema checks (depth) before reading anything
    data: Any = copy.deepcopy(source) if isinstance(source, dict) else {}
    if isinstance(source, (str, Path)):
        path = Path(source)
        if path.is_dir():
            raise ConfigError(
                f"config {path} is a folder, not a config file: give its .yaml file (a run folder's config is "
                "checkpoints/iter_N/config.yaml; `mmrl eval RUN_FOLDER` takes the folder itself)"
            )
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
        if data is None:  # empty, or comments only: it would train every default without a word
            raise ConfigError(
                f"config file {path} is empty: write the keys to change (mmrl init quickstart writes a complete one)"
            )
    if not isinstance(data, dict):
        raise ConfigError(f"a config must be a mapping of keys at the top level, got {_show(data)}")
    for text in overrides:
        _apply_override(data, text)
    cfg = _build(schema, data, "", None)
    _validate(cfg, "")
    return cfg


def to_dict(cfg: Any) -> Any:
    """Plain YAML-able data (dicts, lists, scalars) from a config tree; variants keep their ``type``."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if f.init}
    if isinstance(cfg, (list, tuple)):
        return [to_dict(v) for v in cfg]
    if isinstance(cfg, dict):
        return {k: to_dict(v) for k, v in cfg.items()}
    return cfg


def save_config(cfg: Any, path: str | Path) -> Path:
    """Write ``cfg`` as YAML that ``load_config(type(cfg), path)`` reads back to an equal object."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=False))
    return path


def config_keys(schema: type, with_help: bool = False) -> list[str]:
    """One line per key: ``trainer.lr: float = 1e-05``; variant-only keys end with ``[type=grpo]``;
    ``with_help`` adds, on the next line, the comment that documents the key in its dataclass."""
    lines = []
    for key, hint, default, note, owner in _walk(schema, "", 0, None):
        line = f"{key}: {_name(hint)}" + (" (required)" if default is _MISSING else f" = {default!r}")
        line += f"  [{note}]" if note else ""
        doc = field_help(owner).get(key.rsplit(".", 1)[-1]) if with_help else None
        lines.append(line + (f"\n      {doc}" if doc else ""))
    return lines


def field_help(cls: type) -> dict[str, str]:
    """Field name -> the comment that documents it in ``cls``'s source (the ``# ...`` lines right
    above the field and its trailing ``# ...``), for `config_keys`; {} when the source is not there."""
    import inspect

    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            lines = inspect.getsource(klass).splitlines()
        except (OSError, TypeError):
            continue
        above: list[str] = []
        for line in lines[1:]:
            text = line.strip()
            if text.startswith("#"):
                above.append(text.lstrip("# ").rstrip())
                continue
            m = re.match(r"([A-Za-z_]\w*)\s*:[^#]*?(#\s*(.*))?$", text)
            if m and line.startswith("    ") and not line.startswith("     "):
                doc = " ".join([*above, *([m.group(3).strip()] if m.group(3) else [])]).strip()
                if doc:
                    out[m.group(1)] = doc
            above = []
    return out


# -------------------------------------------------------------------------------------- internals


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _show(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def _suggest(word: Any, choices: Sequence[Any]) -> str:
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _name(hint: Any) -> str:
    if isinstance(hint, type) and get_origin(hint) is None:
        return hint.__name__
    return repr(hint).replace("typing.", "")


def _describe(hint: Any) -> str:
    if get_origin(hint) in (Union, types.UnionType):
        return " or ".join("null" if a is _NONE else _describe(a) for a in get_args(hint))
    simple = {bool: "a bool (true/false)", int: "an int", float: "a float", str: "a string", dict: "a mapping"}
    origin = get_origin(hint) or hint
    return simple.get(origin) or (f"a list ({_name(hint)})" if origin in (list, tuple) else _name(hint))


def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if f.init}


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not _MISSING else f.default


def _section(hint: Any) -> type | None:
    """The dataclass behind ``Section`` or ``Section | None``, else None."""
    if get_origin(hint) in (Union, types.UnionType):
        options = [a for a in get_args(hint) if a is not _NONE]
        hint = options[0] if len(options) == 1 else None
    return hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None


def _apply_override(data: dict, text: str) -> None:
    key, eq, raw = text.partition("=")
    key = key.strip()
    if not eq or not _KEY_RE.fullmatch(key):
        raise ConfigError(f"override {text!r} must look like key.path=value (e.g. trainer.lr=1e-5)")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = raw  # e.g. `run.name=a: b`; the type check still applies
    *parents, leaf = key.split(".")
    node = data
    for i, part in enumerate(parents):
        if node.get(part) is None:
            node[part] = {}
        node = node[part]
        if not isinstance(node, dict):
            raise ConfigError(f"override {text!r}: config key '{'.'.join(parents[: i + 1])}' is a value, not a section")
    node[leaf] = value


def _pick_variant(cls: type[Variants], data: dict, path: str, base: Any) -> tuple[type, Any, str]:
    key = _join(path, "type")
    own_default = cls.__dict__.get("_variant_name", cls.__dataclass_fields__["type"].default)
    name = data.get("type", base.type if base is not None else own_default)
    if name is _MISSING:
        raise ConfigError(f"config key '{key}' is required; one of: {', '.join(cls.variant_names())}")
    chosen = cls.variant_class(name) if isinstance(name, str) else None
    if chosen is None or not issubclass(chosen, cls):
        known = cls.variant_names()
        raise ConfigError(
            f"config key '{key}' = {name!r} is not one of the registered types: "
            f"{', '.join(known)}{_suggest(name, known)}"
        )
    return chosen, (base if type(base) is chosen else None), name


def _build(cls: type, data: Any, path: str, base: Any) -> Any:
    """Dataclass ``cls`` from mapping ``data``; ``base`` is the default instance the keys go on top of."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config key '{path}' must be a section (a mapping of keys), got {_show(data)}")
    variant = None
    if issubclass(cls, Variants):
        cls, base, variant = _pick_variant(cls, data, path, base)
    fields, hints = _fields(cls), typing.get_type_hints(cls)
    for k in (k for k in data if k not in fields):
        where = (f"under '{path}'" if path else "at the top level") + (f" (type '{variant}')" if variant else "")
        foreign = getattr(cls, "FOREIGN_NAMES", {}).get(str(k))  # another tool's name for a key of ours
        hint = f" (mmrl's name for it: {foreign})" if foreign else _suggest(k, sorted(fields))
        valid = ", ".join(sorted(fields))
        raise ConfigError(f"unknown config key '{_join(path, str(k))}'. Valid keys {where}: {valid}{hint}")
    kwargs = {}
    for name, f in fields.items():
        key = _join(path, name)
        default = getattr(base, name) if base is not None else _default(f)
        if name in data:
            sub_base = default if dataclasses.is_dataclass(default) else None
            kwargs[name] = _convert(hints[name], data[name], key, sub_base)
        elif base is not None:
            kwargs[name] = default
        elif default is _MISSING:
            section = _section(hints[name])
            if section is None:
                raise ConfigError(f"config key '{key}' is required")
            kwargs[name] = _build(section, {}, key, None)
    if variant is not None:
        kwargs["type"] = variant
    return cls(**kwargs)


def _convert(hint: Any, value: Any, key: str, base: Any = None) -> Any:
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return value
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _build(hint, value, key, base)
    if origin in (Union, types.UnionType):
        if value is None and _NONE in args:
            return None
        options = [a for a in args if a is not _NONE]
        if len(options) == 1:
            return _convert(options[0], value, key, base)
        for option in options:
            try:
                return _convert(option, value, key, base)
            except ConfigError:
                pass
    elif origin is Literal:
        if any(value == a and type(value) is type(a) for a in args):
            return value
        raise ConfigError(
            f"config key '{key}' = {value!r} is not one of: {', '.join(map(str, args))}{_suggest(value, args)}"
        )
    elif hint in (bool, int, str):
        if isinstance(value, hint) and not (hint is int and isinstance(value, bool)):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and _FLOAT_RE.fullmatch(value.strip()):
            return float(value)  # YAML 1.1 reads `1e-5` as a string
        if isinstance(value, str) and value.strip().lower() in ("inf", "+inf", "infinity"):
            return float("inf")  # YAML's own spelling is `.inf`
    elif hint in (list, tuple) or origin in (list, tuple):
        if isinstance(value, (list, tuple)):
            if origin is tuple and args and args[-1] is not Ellipsis:
                if len(value) != len(args):
                    raise ConfigError(
                        f"config key '{key}' must have {len(args)} items ({_name(hint)}), got {len(value)}: {value!r}"
                    )
                items = [_convert(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value))]
            else:
                items = [_convert(args[0] if args else Any, v, f"{key}[{i}]") for i, v in enumerate(value)]
            return tuple(items) if (origin or hint) is tuple else items
    elif hint is dict or origin is dict:
        if isinstance(value, dict):
            return {k: _convert(args[1] if args else Any, v, f"{key}.{k}") for k, v in value.items()}
    else:
        raise TypeError(f"config key '{key}': unsupported field type {_name(hint)}")
    raise ConfigError(f"config key '{key}' must be {_describe(hint)}, got {_show(value)}")


def _validate(obj: Any, path: str) -> None:
    for f in dataclasses.fields(obj):
        child = getattr(obj, f.name)
        if dataclasses.is_dataclass(child) and not isinstance(child, type):
            _validate(child, _join(path, f.name))
    hook = getattr(obj, "validate", None)
    if callable(hook):
        try:
            hook()
        except ValueError as e:
            where = f"config section '{path}'" if path else "config"
            raise ConfigError(f"{where}: {e}") from e


def _wraps(cls: type) -> bool:
    """Whether section class ``cls`` holds a section of its own kind (a policy wrapping a policy)."""
    hints = typing.get_type_hints(cls)
    return any((s := _section(hints[name])) is not None and issubclass(cls, s) for name in _fields(cls))


def _walk(cls: type, prefix: str, depth: int, inst: Any, variants: bool = True, outer: tuple[type, ...] = ()):
    """Yield ``(key, hint, default, note, class)`` for every leaf key; checks the depth limit.
    ``outer``: the classes of the sections around this one, whose variants are not listed again
    inside themselves (a policy wrapping a policy, ``policy.base`` of DSRL, lists no wrapper: neither
    itself nor another, such as residual RL's)."""
    if depth >= MAX_DEPTH:
        raise TypeError(
            f"config schema is too deep at '{prefix}' ({cls.__name__}): at most {MAX_DEPTH} "
            f"levels of dataclasses (root -> section -> subsection)"
        )
    if inst is not None:
        cls = type(inst)
    hints, own = typing.get_type_hints(cls), set()
    for name, f in _fields(cls).items():
        key, default = _join(prefix, name), (getattr(inst, name) if inst is not None else _default(f))
        own.add(key)
        section = _section(hints[name])
        if section is not None:
            sub = default if dataclasses.is_dataclass(default) else None
            yield from _walk(section, key, depth + 1, sub, outer=(*outer, cls))
        else:
            yield key, hints[name], default, "", cls
    if variants and issubclass(cls, Variants):
        for vname in cls.variant_names():
            try:
                sub = cls.variant_class(vname)
            except ImportError:  # a variant whose optional dependencies are not installed has no keys here
                continue
            assert sub is not None, "a name of variant_names() has a class"
            if sub in outer or (_wraps(sub) and any(_wraps(o) for o in outer)):
                continue
            for key, hint, default, note, owner in _walk(sub, prefix, depth, None, variants=False, outer=outer):
                if key not in own and not key.startswith(tuple(k + "." for k in own)):
                    yield key, hint, default, note or f"type={vname}", owner
