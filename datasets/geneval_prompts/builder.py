"""Build the `geneval_prompts` dataset: GenEval's object-composition prompts with their metadata.

Loads a copy the user downloaded (never downloads): GenEval's ``prompts/evaluation_metadata.jsonl``
(github.com/djghosh13/geneval) or Flow-GRPO's ``dataset/geneval`` folder
(``train_metadata.jsonl`` / ``test_metadata.jsonl``, same record format). Each line is
``{"tag": ..., "include": [{"class": ..., "count": ..., "color"?: ..., "position"?: [rel, idx]}],
"exclude"?: [...], "prompt": ...}``; meta keeps everything but the prompt. See CARD.md.
"""

from __future__ import annotations

from pathlib import Path

DOWNLOAD = (
    "Download the prompts first (this project never downloads), e.g. the GenEval benchmark:\n"
    "  mkdir -p data/geneval && wget -O data/geneval/evaluation_metadata.jsonl "
    "https://raw.githubusercontent.com/djghosh13/geneval/main/prompts/evaluation_metadata.jsonl\n"
    "or Flow-GRPO's train/test split:\n"
    "  for s in train test; do wget -O data/geneval/${s}_metadata.jsonl "
    "https://raw.githubusercontent.com/yifan123/flow_grpo/main/dataset/geneval/${s}_metadata.jsonl; done\n"
    "then pass path='data/geneval'."
)
TAGS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")


def _prompt_list():
    from mmrl.data import builder_module

    return builder_module("prompt_list")


def resolve(path, split: str = "test") -> Path:
    """The metadata file: ``path`` itself, or in a folder ``{split}_metadata.jsonl`` (Flow-GRPO)
    before ``evaluation_metadata.jsonl`` (GenEval's ``prompts/`` folder)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"GenEval metadata not found at {p}.\n{DOWNLOAD}")
    if p.is_file():
        return p
    for name in (f"{split}_metadata.jsonl", "evaluation_metadata.jsonl"):
        if (p / name).is_file():
            return p / name
    raise FileNotFoundError(f"no {split}_metadata.jsonl or evaluation_metadata.jsonl in {p}.\n{DOWNLOAD}")


def _check(rec: dict, where: str) -> None:
    if not isinstance(rec.get("tag"), str):
        raise ValueError(f"{where}: GenEval record needs a string 'tag' (one of {TAGS})")
    groups = [("include", rec.get("include"))] + ([("exclude", rec["exclude"])] if "exclude" in rec else [])
    for key, objs in groups:
        if not isinstance(objs, list) or (key == "include" and not objs):
            raise ValueError(f"{where}: GenEval record needs {key!r} as a list of objects")
        for o in objs:
            if not isinstance(o, dict) or not isinstance(o.get("class"), str) or not isinstance(o.get("count"), int):
                raise ValueError(f"{where}: each {key!r} entry needs a 'class' string and an int 'count', got {o!r}")


def build(
    path, split: str = "test", tags=None, num_prompts: int | None = None, shuffle: bool = False, seed: int = 0
) -> dict:
    """GenEval prompts from ``path`` -> ``{"prompt", "meta"}``; meta is the record without
    ``prompt``: ``tag``, ``include`` (each ``class``, ``count``, optional ``color`` and
    ``position`` = [relation, index of the reference object in include]) and ``exclude`` when
    present. ``tags`` keeps only those tags (of `TAGS`); then ``shuffle`` / ``num_prompts`` as in
    `prompt_list`."""
    split = "test" if split == "eval" else split  # PromptSim asks for "eval"; the sets ship "test"
    io = _prompt_list()
    file = resolve(path, split)
    rows = io.read_jsonl(file, hint=DOWNLOAD)
    for line, rec in rows:
        _check(rec, f"{file}, line {line}")
    if tags is not None:
        tags = [tags] if isinstance(tags, str) else list(tags)
        unknown = sorted(set(tags) - set(TAGS))
        if unknown:
            raise ValueError(f"unknown GenEval tags {unknown}; known: {list(TAGS)}")
        rows = [(line, rec) for line, rec in rows if rec["tag"] in tags]
        if not rows:
            raise ValueError(f"no prompts with tags {tags} in {file}")
    prompts = [rec["prompt"] for _, rec in rows]
    metas = [{k: v for k, v in rec.items() if k != "prompt"} for _, rec in rows]
    return io.select(prompts, metas, num_prompts, shuffle, seed)
