"""Every ```python block of the documentation runs as written (tests/docs/pages.py for the markers).

A page's blocks run in order in one namespace, in a scratch folder whose ``configs/`` is the
repository's and where the page's ``<!-- docs-test: file PATH -->`` blocks are written first.
``mmrl.train(config, ...)`` gets the short settings `scripts/param_fingerprints.py` keeps for every
shipped config (a few envs, a few warm-start steps) and one RL iteration appended, so a guide's
example runs in seconds with the code path the user runs.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

import mmrl
from tests.docs.pages import ROOT, Page, all_pages

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _fingerprint_settings():
    spec = importlib.util.spec_from_file_location("docs_param_fingerprints", ROOT / "scripts" / "param_fingerprints.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.COMMON, module.SHORT


COMMON, SHORT = _fingerprint_settings()


def short_overrides(config) -> list[str]:
    """The overrides that make a run of ``config`` (a path or a dict) take seconds."""
    name = Path(str(config)).stem if not isinstance(config, dict) else ""
    extra = SHORT.get(name, ["sim.num_envs=4", "sim.eval_num_envs=4", "trainer.eval_episodes=4"])
    return [*COMMON, *extra, "trainer.iterations=1"]


def runnable(page: Page) -> list:
    return [b for b in page.blocks if b.lang in ("python", "py") and b.marker is None]


def write_files(page: Page, folder: Path) -> None:
    """Write the page's ``docs-test: file`` blocks into ``folder`` (any language)."""
    for block in page.blocks:
        if block.marker and block.marker[0] == "file":
            path = folder / block.marker[1]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.text)


PAGES = [p for p in all_pages(include_readme=False) if runnable(p)]


def test_the_harness_finds_the_docs_python():
    """The pages with runnable Python exist and are found (an empty list would pass every check)."""
    assert len(PAGES) >= 3, [p.name for p in PAGES]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_python_blocks_run_as_written(page: Page, tmp_path, monkeypatch):
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    write_files(page, tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    real = mmrl.train

    def train(config, *overrides, **kwargs):
        return real(config, *overrides, *short_overrides(config), **kwargs)

    monkeypatch.setattr(mmrl, "train", train)
    scope: dict = {"__name__": "__docs__"}
    for block in runnable(page):
        try:
            exec(compile(block.text, f"{page.name}:{block.line}", "exec"), scope)
        except Exception as exc:
            raise AssertionError(
                f"{page.name}, the python block at line {block.line}, fails as written: {type(exc).__name__}: "
                f"{exc} (fix the page, or mark a block that cannot run on a CPU with "
                "<!-- docs-test: skip REASON -->)"
            ) from exc
    for name in [m for m in sys.modules if m.split(".")[0] in {p.stem for p in tmp_path.iterdir()}]:
        sys.modules.pop(name, None)  # modules the page wrote: a later page may write its own
