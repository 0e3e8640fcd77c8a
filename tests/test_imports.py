"""Imports run one way: adapters (`simulators`, `rewards`) import the core, the core never imports
them nor the tests; no import cycle among the core's modules, nor among its subpackages.

Every ``import`` statement counts, including those inside functions (a lazy import is still a
dependency), read from the source with `ast` so that nothing has to be importable to be checked.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ADAPTERS = ("simulators", "rewards", "tests", "benchmarks")


def core_modules() -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / "mmrl").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Modules ``name`` imports; ``from pkg import x`` counts as ``pkg.x`` where that is a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in known else base)
    return out


def graph() -> dict[str, set[str]]:
    known = core_modules()
    return {m: imports_of(m, p, known) for m, p in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in list(edges):
        if v not in index:
            visit(v)
    return found


def test_the_core_imports_no_adapter_and_no_test_helper():
    bad = sorted(
        (m, t)
        for m, targets in graph().items()
        for t in targets
        if t.split(".")[0] in ADAPTERS or t.startswith("mmrl.testing")
    )
    assert not bad, f"core modules importing adapters / test helpers: {bad}"


def test_no_simulator_adapter_imports_a_reward_adapter():
    """Reward models live in the trainer's reward stage only: no module under simulators/ builds or
    imports one (a robot simulator's frames are scored by the stage, `mmrl.trainer.reward_stage`)."""
    known = core_modules()
    bad = sorted(
        (path.name, t)
        for path in sorted((ROOT / "simulators").rglob("*.py"))
        for t in imports_of(f"simulators.{path.stem}", path, known)
        if t.split(".")[0] == "rewards"
    )
    assert not bad, f"simulator adapters importing reward adapters: {bad}"


def test_no_import_cycle_among_core_modules():
    g = graph()
    internal = {m: {t for t in ts if t in g and t != m} for m, ts in g.items()}
    assert cycles(internal) == []


def test_no_import_cycle_among_core_subpackages():
    g = graph()
    top = lambda m: ".".join(m.split(".")[:2])  # noqa: E731  (mmrl.trainer, mmrl.placement, ...)
    pkg: dict[str, set[str]] = {}
    for m, ts in g.items():
        pkg.setdefault(top(m), set()).update(top(t) for t in ts if t in g and top(t) != top(m))
    assert cycles(pkg) == [], "subpackages importing each other (lazily counts too)"


def test_the_checker_finds_what_it_looks_for():
    """The helpers themselves: a cycle and a relative import are found."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    known = core_modules()
    assert "mmrl.batch" in imports_of("mmrl.trainer.trainer", known["mmrl.trainer.trainer"], known)
