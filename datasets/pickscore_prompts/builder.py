"""Build the `pickscore_prompts` dataset: Pick-a-Pic captions, as used for PickScore alignment.

Loads a copy the user downloaded (never downloads): Flow-GRPO's ``dataset/pickscore`` folder
(``train.txt`` / ``test.txt``, one caption per line), a single text file, a JSONL file with a
``caption`` (or ``prompt``) key, or parquet files of the Hugging Face dataset
``yuvalkirstain/pickapic_v1`` (column ``caption``; needs pyarrow). See CARD.md.
"""

from __future__ import annotations

from pathlib import Path

DOWNLOAD = (
    "Download the prompts first (this project never downloads), e.g. Flow-GRPO's split:\n"
    "  mkdir -p data/pickscore && for s in train test; do wget -O data/pickscore/$s.txt "
    "https://raw.githubusercontent.com/yifan123/flow_grpo/main/dataset/pickscore/$s.txt; done\n"
    "then pass path='data/pickscore'. See datasets/pickscore_prompts/CARD.md for the Pick-a-Pic parquet route."
)


def _prompt_list():
    from mmrl.data import builder_module

    return builder_module("prompt_list")


def _parquet_captions(files: list[Path]) -> list[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ImportError("reading Pick-a-Pic parquet files needs pyarrow: pip install pyarrow") from exc
    out: list[str] = []
    for f in files:
        table = pq.read_table(f, columns=["caption"])
        out.extend(c for c in table.column("caption").to_pylist() if c)
    return out


def build(
    path,
    split: str = "train",
    num_prompts: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
    dedupe: bool = True,
    min_words: int = 0,
) -> dict:
    """Pick-a-Pic captions from ``path`` -> ``{"prompt", "meta"}`` (meta ``{"source": "pickapic"}``).

    ``path``: a folder holding ``{split}.txt`` (Flow-GRPO layout: "train" or "test"), or parquet
    files (``*.parquet`` under it, recursively; those whose name contains ``split`` when any do), or
    one ``.txt`` / ``.jsonl`` / ``.parquet`` file. ``dedupe`` (default on: Pick-a-Pic repeats a
    caption once per comparison) keeps first occurrences; ``min_words`` drops shorter captions
    (Flow-GRPO kept captions of at least 6 words); then ``shuffle`` / ``num_prompts`` as in
    `prompt_list`.
    """
    split = "test" if split == "eval" else split  # PromptSim asks for "eval"; the sets ship "test"
    io = _prompt_list()
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"Pick-a-Pic prompts not found at {p}.\n{DOWNLOAD}")
    if p.is_dir():
        txt = p / f"{split}.txt"
        parquet = sorted(p.rglob("*.parquet"))
        if txt.exists():
            captions = [t for _, t in io.read_lines(txt, comments=False)]
        elif parquet:
            named = [f for f in parquet if split in f.name]
            captions = _parquet_captions(named or parquet)
        else:
            raise FileNotFoundError(f"no {split}.txt or *.parquet under {p}.\n{DOWNLOAD}")
    elif p.suffix.lower() == ".parquet":
        captions = _parquet_captions([p])
    elif p.suffix.lower() in io.JSONL_SUFFIXES:
        captions = [r["prompt"] for _, r in io.read_jsonl(p, key=("caption", "prompt"))]
    else:
        captions = [t for _, t in io.read_lines(p, comments=False)]
    captions = [c.strip() for c in captions if c and c.strip()]
    if min_words:
        captions = [c for c in captions if len(c.split()) >= min_words]
    if not captions:
        raise ValueError(f"no captions left in {p} (min_words={min_words})")
    return io.select(captions, [{"source": "pickapic"} for _ in captions], num_prompts, shuffle, seed, dedupe)
