"""The front door and the site's ground rules: a README of at most 300 lines, no internal issue
numbers in the README or the guides, nothing that points outside the repository, and reference
pages that are what the code generates now (scripts/gen_reference.py)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest

from tests.docs.pages import DOCS, ROOT

README = ROOT / "README.md"
USER_PAGES = [README, *sorted((DOCS / "guides").glob("*.md")), *sorted((DOCS / "getting-started").glob("*.md"))]


def _generator():
    spec = importlib.util.spec_from_file_location("docs_gen_reference", ROOT / "scripts" / "gen_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_is_a_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines (at most 300: guides, results and stories go to docs/)"


@pytest.mark.parametrize("path", USER_PAGES, ids=[p.relative_to(ROOT).as_posix() for p in USER_PAGES])
def test_no_internal_issue_numbers_on_user_pages(path):
    found = re.findall(r"\b[Ii]ssues? #?\d+", path.read_text())
    assert not found, f"{path.relative_to(ROOT)} cites internal issue numbers {found}: say what was found instead"


def test_nothing_points_outside_the_repository():
    pages = [README, ROOT / "CONTRIBUTING.md", *DOCS.rglob("*.md")]
    bad = [p.relative_to(ROOT).as_posix() for p in pages if "shared/" in p.read_text() or "../../" in p.read_text()]
    assert not bad, f"pages pointing outside the repository (shared/ or ../../): {bad}"


def test_the_reference_pages_are_what_the_code_generates():
    """A new key, component or argument changes the generated text: the committed pages must be rebuilt
    (python scripts/gen_reference.py), and one without documentation fails the generator itself. In a
    fresh interpreter: components other tests register in this process are not mmrl's."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_reference.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:] or proc.stdout[-3000:]


def test_an_undocumented_config_key_stops_the_generator(monkeypatch):
    """A key whose documenting comment is gone (here trainer.lr's) stops the generator, naming the key."""
    import mmrl.config

    gen = _generator()
    real = mmrl.config.field_help

    def without_lr(cls):
        helps = dict(real(cls))
        if cls.__name__ == "TrainerConfig":
            helps.pop("lr", None)
        return helps

    monkeypatch.setattr(mmrl.config, "field_help", without_lr)
    with pytest.raises(gen.Undocumented, match=r"trainer\.lr \("):
        gen.config_page()
