"""One `Registry` type for every pluggable component.

Components register under a name with either the object itself or a lazy ``"module:attr"`` string,
so importing mmrl never imports an optional heavy dependency. A missing optional dependency fails
only when that component is used, with the ``pip install mmrl[extra]`` command that fixes it.

Third-party packages add components through entry points, one group per registry::

    [project.entry-points."mmrl.simulators"]
    my_sim = "my_pkg.sim:MySimulator"

or a whole module whose import registers several components (group ``mmrl.plugins``). The core
imports its own adapter packages by name, never a class of theirs (`load_plugin_modules`): the
repository's ``simulators/`` and ``rewards/``, which a wheel installs as ``mmrl_simulators`` and
``mmrl_rewards`` (top-level names that belong to mmrl; `adapter_package` says which is here), so that
an installed mmrl never takes the names ``simulators`` / ``rewards`` from another project.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from mmrl.capabilities import Component


class MissingDependencyError(ImportError):
    """An optional dependency of a component is not installed; the message names the extra."""


class UnknownComponentError(KeyError):
    def __str__(self) -> str:  # KeyError quotes its message; show it plainly
        return str(self.args[0])


@dataclass
class Entry:
    name: str
    target: Any  # the object, or "module:attr" to import lazily
    description: str = ""
    extra: str | None = None  # the pip extra that provides its dependencies
    fix: str | None = None  # how to install them, where `pip install mmrl[extra]` is not the way
    spec: Any = None  # what was registered (target is replaced by the object once loaded)

    def __post_init__(self) -> None:
        self.spec = self.target

    def load(self, kind: str) -> Any:
        if not isinstance(self.target, str):
            return self.target
        module_name, _, attr = self.target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            hint = self.fix or (f"pip install 'mmrl[{self.extra}]'" if self.extra else "check your installation")
            raise MissingDependencyError(
                f"{kind} '{self.name}' needs a package that is not installed ({exc.name or exc}). Fix: {hint}"
            ) from exc
        self.target = getattr(module, attr) if attr else module
        return self.target


class Registry:
    """Named components of one kind (policies, simulators, rewards, ...)."""

    def __init__(self, kind: str, group: str, builtins: tuple[str, ...] = (), entry_type: type | None = None):
        self.kind = kind
        self.group = group  # entry-point group for third-party plugins
        self._builtins = builtins  # modules whose import registers the built-in components
        self.entry_type = entry_type  # what every entry must be once loaded (None: anything)
        self._entries: dict[str, Entry] = {}
        self._discovered = False

    def register(
        self,
        name: str,
        target: Any = None,
        *,
        description: str = "",
        extra: str | None = None,
        fix: str | None = None,
    ) -> Callable:
        """Register ``target`` (object or "module:attr") under ``name``; usable as a decorator."""

        def add(obj: Any) -> Any:
            prev = self._entries.get(name)
            same = prev is not None and (prev.spec is obj or prev.target is obj or prev.spec == obj)
            if prev is not None and not same and not isinstance(prev.spec, str):
                # a lazy "module:attr" may be replaced by its object; anything else is a clash
                raise ValueError(f"{self.kind} '{name}' is already registered ({prev.spec!r})")
            doc = description or _first_line(obj)
            self._entries[name] = Entry(name, obj, doc, extra, fix)
            return obj

        return add if target is None else add(target)

    def _discover(self) -> None:
        if self._discovered:
            return
        self._discovered = True
        for module in self._builtins:
            importlib.import_module(module)
        load_plugin_modules()
        for ep in metadata.entry_points(group=self.group):
            if ep.name not in self._entries:
                self._entries[ep.name] = Entry(ep.name, ep.value, f"(plugin from {ep.value})")

    def names(self) -> list[str]:
        self._discover()
        return sorted(self._entries)

    def describe(self) -> list[tuple[str, str]]:
        self._discover()
        return [(n, self._entries[n].description) for n in sorted(self._entries)]

    def get(self, name: str) -> Any:
        self._discover()
        if name not in self._entries:
            raise UnknownComponentError(
                f"unknown {self.kind} '{name}'. Registered: {', '.join(self.names()) or '(none)'}"
            )
        obj = self._entries[name].load(self.kind)
        if self.entry_type is not None and not isinstance(obj, self.entry_type):
            raise TypeError(
                f"{self.kind} '{name}' ({self._entries[name].spec!r}) must be a "
                f"{self.entry_type.__module__}.{self.entry_type.__name__}, got {type(obj).__name__}: "
                f"register it as {self.entry_type.__name__}(fn, needs=...)"
            )
        return obj

    def build(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self.get(name)(*args, **kwargs)

    def __contains__(self, name: str) -> bool:
        self._discover()
        return name in self._entries


_PLUGIN_MODULES_LOADED = False
ADAPTER_PACKAGES = ("simulators", "rewards")  # the repository's adapter folders (registered on import)


def _spec_folder(name: str) -> Path | None:
    """The folder the package ``name`` would be imported from here (imports nothing), or None."""
    spec = importlib.util.find_spec(name)
    return None if spec is None or spec.origin is None else Path(spec.origin).resolve().parent


def adapter_package(name: str) -> str:
    """The import name of adapter package ``name`` (``simulators``, ``rewards``) here: a name that
    every process started from this one can import too, since spawned workers (ManiSkill's, LIBERO's,
    gymnasium's async envs, placement's sim workers) unpickle their targets by it.

    In a source checkout: ``name`` itself where the checkout is on ``sys.path`` (run from its root, or
    ``PYTHONPATH``); else ``mmrl_<name>`` where an editable install maps that name onto the checkout's
    folder (an installed console script run from anywhere else); else the checkout's folder imported
    by location under ``name`` (another project's ``name`` shadows it; spawned workers cannot import
    it). Outside a checkout (a wheel): ``mmrl_<name>``, as the wheel installs it."""
    from mmrl.utils.shipped import checkout_folder

    folder = checkout_folder(name)
    installed = f"mmrl_{name}"
    if folder is None or not (folder / "__init__.py").is_file() or installed in sys.modules:
        return installed
    if name not in sys.modules:
        on_path = _spec_folder(name) == folder
        if not on_path and _spec_folder(installed) == folder:
            return installed  # the editable install's name: importable in every process
        if not on_path:
            # not on sys.path and not installed, or another project's: the checkout's, by location
            spec = importlib.util.spec_from_file_location(
                name, folder / "__init__.py", submodule_search_locations=[str(folder)]
            )
            assert spec is not None and spec.loader is not None  # a .py path always gets a source loader
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
    return name


def adapter(module: str) -> Any:
    """An adapter module by its repository name (``"simulators.reach"``), wherever it is installed:
    how one adapter, or a dataset recipe, imports another (`adapter_package`)."""
    top, _, rest = module.partition(".")
    package = adapter_package(top)
    return importlib.import_module(f"{package}.{rest}" if rest else package)


def load_plugin_modules() -> None:
    """Import mmrl's own adapter packages (`ADAPTER_PACKAGES`), then every module of the
    ``mmrl.plugins`` entry-point group, once (each registers its components on import). A plugin
    that fails to import is reported, not fatal to the others."""
    global _PLUGIN_MODULES_LOADED
    if _PLUGIN_MODULES_LOADED:
        return
    _PLUGIN_MODULES_LOADED = True
    for name in ADAPTER_PACKAGES:
        adapter(name)
    for ep in metadata.entry_points(group="mmrl.plugins"):
        if ep.value in ADAPTER_PACKAGES:  # an older install's entry point for a built-in: imported above
            continue
        try:
            ep.load()
        except ImportError as exc:
            warnings.warn(f"mmrl plugin '{ep.name}' ({ep.value}) failed to import and is skipped: {exc}", stacklevel=2)


def _first_line(obj: Any) -> str:
    doc = getattr(obj, "__doc__", None) if not isinstance(obj, str) else None
    return doc.strip().splitlines()[0] if doc else ""


POLICIES = Registry("policy", "mmrl.policies", ("mmrl.policies",))
SIMULATORS = Registry("simulator", "mmrl.simulators")  # built-ins: the `simulators` package (adapter_package)
REWARDS = Registry("reward", "mmrl.rewards")  # built-ins: the `rewards` package (adapter_package)
#: estimate(batch, algo, last_values) -> (advantages, returns), as `mmrl.capabilities.Component`s
ADVANTAGES = Registry("advantage estimator", "mmrl.advantages", ("mmrl.algorithms",), entry_type=Component)
#: objective(policy, minibatch, algo) -> (loss, metrics), as `mmrl.capabilities.Component`s
OBJECTIVES = Registry("objective", "mmrl.objectives", ("mmrl.trainer.objectives",), entry_type=Component)
DATASETS = Registry("dataset", "mmrl.datasets", ("mmrl.data",))

ALL = {
    "policies": POLICIES,
    "simulators": SIMULATORS,
    "rewards": REWARDS,
    "advantages": ADVANTAGES,
    "objectives": OBJECTIVES,
    "datasets": DATASETS,
}
