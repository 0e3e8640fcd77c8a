"""A newcomer adds a simulator, a reward, a policy, an estimator / objective and a dataset by following
only the extending pages (docs/extending/): each page's example is built exactly as written there and
its own commands run on it.

For each page, in a scratch folder that stands for the user's project:

- every block under ``<!-- docs-test: file PATH -->`` is written to PATH (the module, the
  ``pyproject.toml``, a config, a test file);
- ``pip install -e .`` is what the page says to run first; here it is done as pip leaves it: the
  project folder on ``PYTHONPATH`` (an editable install) and a ``.dist-info`` folder whose
  ``entry_points.txt`` comes from the page's ``[project.entry-points."mmrl.*"]`` tables (the
  repository's own plugin test, tests/cli/test_policy_plugin.py, lays out a plugin so);
- every other command of the page's bash blocks runs as written, in order, in a fresh process
  (``mmrl ...`` as ``python -m mmrl ...``, ``pytest ...`` as ``python -m pytest ...``), and must
  succeed; a plain block the page introduces as what a command "prints:" must be what it printed.

So a page whose example breaks the contract, registers under a misspelled group, or shows a command
that does not work, fails here with the command's output.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.pages import DOCS, Page, read_page

EXTENDING = DOCS / "extending"
COMPONENT_PAGES = ("simulator", "reward", "policy", "algorithm", "dataset")
PLACEHOLDER = re.compile(r"\$|<[^>]*>|(?<![A-Za-z])[A-Z][A-Z0-9_]{2,}(?![a-z])")  # NAME, CONFIG: not runnable
TIMEOUT_S = 300


def has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


# pages whose example needs an optional extra: the extra, and the module that tells it is installed
NEEDS = {"dataset": ("vlm", "transformers")}  # its training run uses the tiny VLM


def commands(page: Page) -> list[str]:
    """The page's shell commands in order: continuation lines joined, comments and blank lines dropped,
    lines ending in ``# docs-test: skip`` left out."""
    out = []
    for block in page.blocks:
        if block.lang not in ("bash", "sh", "shell", "console") or block.marker:
            continue
        for line in block.text.replace("\\\n", " ").splitlines():
            line = line.strip()
            if line and not line.startswith("#") and not line.endswith("# docs-test: skip"):
                out.append(line)
    return out


def shown_output(page: Page) -> list[tuple[int, str]]:
    """(line, text) of the plain blocks the page introduces as a command's output: the nearest line
    above the block ends in "prints:"."""
    text = page.text.splitlines()
    out = []
    for b in page.blocks:
        above = next((text[k] for k in range(b.line - 2, -1, -1) if text[k].strip()), "")
        if b.lang == "" and b.marker is None and above.rstrip().endswith("prints:"):
            out.append((b.line, b.text))
    return out


def entry_points_txt(pyproject: str) -> tuple[str, str, str]:
    """(name, version, entry_points.txt) that ``pip install`` leaves for this ``pyproject.toml``."""
    import tomllib

    project = tomllib.loads(pyproject)["project"]
    groups = project.get("entry-points", {})
    text = "".join(
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in eps.items()) + "\n"
        for group, eps in groups.items()
    )
    return project["name"], project["version"], text


def install(project: Path, pyproject: str) -> Path:
    """What ``pip install -e .`` leaves: a site folder holding the distribution's ``.dist-info``."""
    name, version, eps = entry_points_txt(pyproject)
    info = project / "_site" / f"{re.sub(r'[-_.]+', '_', name)}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(eps)
    return info.parent


def run(line: str, project: Path, site: Path | None) -> subprocess.CompletedProcess:
    tokens = shlex.split(line, comments=True)
    program = {"mmrl": ["-m", "mmrl"], "pytest": ["-m", "pytest"]}.get(tokens[0])
    if program is None and tokens[:3] == ["python", "-m", "pytest"]:
        program, tokens = ["-m", "pytest"], tokens[2:]
    assert program is not None, f"the test does not know how to run `{line}`: show mmrl / pytest commands only"
    path = [str(project), *([str(site)] if site else []), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    return subprocess.run(
        [sys.executable, *program, *tokens[1:]],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def pages() -> list:
    out = []
    for path in sorted(EXTENDING.glob("*.md")):
        marks = []
        need = NEEDS.get(path.stem)
        if need and not has_module(need[1]):
            marks.append(pytest.mark.skip(reason=f"its example runs need the {need[0]} extra ({need[1]})"))
        out.append(pytest.param(path, id=path.stem, marks=marks))
    return out


def test_every_component_has_its_page():
    assert {p.stem for p in EXTENDING.glob("*.md")} >= {"index", *COMPONENT_PAGES}


@pytest.mark.parametrize("path", pages())
def test_the_page_builds_and_runs_as_written(path: Path, tmp_path: Path):
    if sys.version_info < (3, 11):
        pytest.skip("reads pyproject.toml with tomllib (Python 3.11+)")
    page = read_page(path)
    project = tmp_path / "project"
    project.mkdir()
    files = {b.marker[1]: b.text for b in page.blocks if b.marker and b.marker[0] == "file"}
    for name, text in files.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    lines = commands(page)
    if path.stem in COMPONENT_PAGES:  # what the acceptance asks of each: a package, its check, its test
        assert "pyproject.toml" in files, f"{page.name} shows no pyproject.toml to register its example"
        assert 'entry-points."mmrl.' in files["pyproject.toml"], f"{page.name}: no mmrl entry point"
        assert any(re.match(r"mmrl (check|train) ", ln) for ln in lines), f"{page.name} runs no mmrl check / train"
        for test_file in (name for name in files if name.startswith("tests/")):
            assert any("pytest" in ln and test_file in ln for ln in lines), f"{page.name} never runs {test_file}"
    site, printed = None, []
    for line in lines:
        if PLACEHOLDER.search(line):
            continue
        if line.startswith("pip install"):
            assert line == "pip install -e .", f"{page.name}: only `pip install -e .` is emulated, not `{line}`"
            site = install(project, files["pyproject.toml"])
            continue
        done = run(line, project, site)
        output = (done.stdout + done.stderr)[-4000:]
        assert done.returncode == 0, f"{page.name}: `{line}` failed (exit {done.returncode}):\n{output}"
        printed.append(done.stdout)
    for at, shown in shown_output(page):  # what the page says a command prints is what it printed
        assert shown in printed, f"{page.name}: the output shown at line {at} is not what the command printed"


def test_entry_points_are_written_as_pip_writes_them():
    pyproject = (
        '[project]\nname = "mmrl-x"\nversion = "0.1.0"\n\n'
        '[project.entry-points."mmrl.advantages"]\nrank = "mmrl_x:RANK"\n\n'
        '[project.entry-points."mmrl.objectives"]\ncispo = "mmrl_x:CISPO"\n'
    )
    assert entry_points_txt(pyproject) == (
        "mmrl-x",
        "0.1.0",
        "[mmrl.advantages]\nrank = mmrl_x:RANK\n\n[mmrl.objectives]\ncispo = mmrl_x:CISPO\n\n",
    )
