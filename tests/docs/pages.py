"""Reading the documentation as the docs tests do: pages, their front matter, their fenced blocks
with the ``<!-- docs-test: ... -->`` marker above each, and their inline code outside blocks.

Markers (the line right above a block's opening fence):

- ``<!-- docs-test: skip REASON -->``: the block is not run (a hub checkpoint, a GPU);
- ``<!-- docs-test: file PATH -->``: the block is written to PATH in the scratch folder, not run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)[^\n]*$")
MARKER = re.compile(r"<!--\s*docs-test:\s*(?P<kind>skip|file)\s*(?P<arg>.*?)\s*-->")


@dataclass
class Block:
    lang: str
    text: str
    line: int  # 1-based line of the opening fence
    marker: tuple[str, str] | None = None  # ("skip", reason) / ("file", path)


@dataclass
class Page:
    path: Path
    text: str
    meta: dict = field(default_factory=dict)
    body: str = ""
    blocks: list[Block] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.relative_to(ROOT).as_posix()

    def prose(self) -> str:
        """The body with every fenced block and HTML comment removed (what a reader reads as text)."""
        lines = self.body.splitlines()
        keep, inside, fence = [], False, ""
        for ln in lines:
            m = FENCE.match(ln)
            if m and not inside:
                inside, fence = True, m.group("fence")
                continue
            if inside and ln.strip().startswith(fence[:3]) and ln.strip().strip(fence[0]) == "":
                inside = False
                continue
            if not inside:
                keep.append(ln)
        return re.sub(r"<!--.*?-->", "", "\n".join(keep), flags=re.S)


def read_page(path: Path) -> Page:
    text = path.read_text()
    meta, body, offset = {}, text, 0
    if text.startswith("---\n"):
        end = text.index("\n---\n", 4)
        meta = yaml.safe_load(text[4:end]) or {}
        body = text[end + 5 :]
        offset = text[: end + 5].count("\n")
    page = Page(path, text, meta, body)
    lines = body.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = len(m.group("indent")), m.group("fence"), m.group("lang").lower()
        j = i + 1
        while j < len(lines) and not (lines[j].strip().startswith(fence) and lines[j].strip().strip(fence[0]) == ""):
            j += 1
        content = "\n".join(ln[indent:] if ln[:indent].strip() == "" else ln for ln in lines[i + 1 : j])
        above = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        mk = MARKER.search(above)
        marker = (mk.group("kind"), mk.group("arg")) if mk else None
        page.blocks.append(Block(lang, content + "\n", offset + i + 1, marker))
        i = j + 1
    return page


def all_pages(include_readme: bool = True) -> list[Page]:
    """Every Markdown page of the site (generated assets aside), and the README."""
    paths = sorted(p for p in DOCS.rglob("*.md") if "assets" not in p.parts)
    if include_readme:
        paths += [ROOT / "README.md", ROOT / "CONTRIBUTING.md"]  # the site includes CONTRIBUTING.md
    return [read_page(p) for p in paths]


def inline_code(text: str) -> list[str]:
    """The inline code spans of prose (single or double backticks)."""
    return [m.group(2).strip() for m in re.finditer(r"(`+)(.+?)\1", text)]
