"""The shapes dataset and the prompt-list recipes (prompt_list, pickscore, geneval, ocr).

The public formats are reproduced in small local files; nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from mmrl.data import DATASETS_DIR, load_dataset
from mmrl.registry import DATASETS
from rewards.shapes import COLORS, POSITIONS, parse_prompt

NEW = ("shapes", "prompt_list", "pickscore_prompts", "geneval_prompts", "ocr_prompts")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"test_builder_{name}", DATASETS_DIR / name / "builder.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def shapes():
    return _load("shapes")


def test_registered_with_cards_and_no_package_init():
    assert not (DATASETS_DIR / "__init__.py").exists()
    names = dict(DATASETS.describe())
    for name in NEW:
        assert name in names and names[name], name
        assert (DATASETS_DIR / name / "CARD.md").is_file()


# ---------------------------------------------------------------------------------------------
# shapes
# ---------------------------------------------------------------------------------------------


def test_shapes_fields_and_types(shapes):
    d = shapes.build(40, seed=0)
    assert set(d) == {"image", "prompt", "meta"}
    assert d["image"].dtype == torch.uint8 and d["image"].shape == (40, 16, 16, 3)
    assert len(d["prompt"]) == len(d["meta"]) == 40
    for prompt, meta in zip(d["prompt"], d["meta"]):
        assert parse_prompt(prompt)["objects"] == meta["objects"]
        assert meta["tag"] in ("single", "position", "counting", "color_attr")
        first = meta["objects"][0]
        assert (meta["color"], meta["shape"], meta["count"], meta["position"]) == (
            first["color"],
            first["shape"],
            first["count"],
            first["position"],
        )
        assert meta["noisy"] is False
        assert len(meta["instances"]) == sum(o["count"] for o in meta["objects"])


def test_shapes_instances_are_drawn_where_meta_says(shapes):
    d = shapes.build(64, seed=1)
    half = 8
    regions = {
        "left": (0, 0, half, 16),
        "right": (half, 0, 16, 16),
        "top": (0, 0, 16, half),
        "bottom": (0, half, 16, 16),
        "center": (4, 4, 12, 12),
        None: (0, 0, 16, 16),
    }
    for img, meta in zip(d["image"], d["meta"]):
        painted = (img != 0).any(-1)
        covered = torch.zeros(16, 16, dtype=torch.bool)
        for inst in meta["instances"]:
            x0, y0, x1, y1 = inst["box"]
            assert x1 - x0 == y1 - y0 and x1 - x0 in (5, 7)
            patch = img[y0:y1, x0:x1]
            colored = (patch == torch.tensor(COLORS[inst["color"]], dtype=torch.uint8)).all(-1)
            if inst["shape"] == "square":
                assert colored.all()
            else:
                assert 0.4 < colored.float().mean() < 0.9
            covered[y0:y1, x0:x1] = True
            if len(meta["instances"]) == 1:
                rx0, ry0, rx1, ry1 = regions[meta["position"]]
                assert rx0 <= x0 and x1 <= rx1 and ry0 <= y0 and y1 <= ry1
        assert not (painted & ~covered).any()  # nothing drawn outside the boxes


def test_shapes_pixels_hand_counted(shapes):
    # side 5 at (0, 0): circle drops the 4 corners (21 px), triangle rows 1, 1, 3, 3, 5 (13 px)
    shape = torch.tensor([[0], [1], [2]])
    box = torch.tensor([[[0, 0, 5]]]).expand(3, 1, 3)
    img = shapes.render(torch.zeros(3, 1, dtype=torch.long), shape, box, torch.ones(3, 1, dtype=torch.bool), 16)
    assert ((img != 0).any(-1)).sum((1, 2)).tolist() == [21, 25, 13]
    assert (img[2, :5, :5] != 0).any(-1).sum(1).tolist() == [1, 1, 3, 3, 5]
    assert shapes.object_sizes(16) == [5, 7] and shapes.object_sizes(32) == [9, 11, 13]


def test_shapes_deterministic_and_prefix_stable(shapes):
    a, b = shapes.build(30, seed=7), shapes.build(30, seed=7)
    assert torch.equal(a["image"], b["image"]) and a["prompt"] == b["prompt"] and a["meta"] == b["meta"]
    c = shapes.build(30, seed=8)
    assert not torch.equal(a["image"], c["image"])
    long = shapes.build(1100, seed=7)  # crosses the 1024-sample block boundary
    assert torch.equal(long["image"][:30], a["image"]) and long["prompt"][:30] == a["prompt"]
    assert long["image"].shape[0] == 1100 and long["prompt"][1050:] == shapes.build(1100, seed=7)["prompt"][1050:]


def test_shapes_32px_and_options(shapes):
    d = shapes.build(16, seed=0, image_size=32, tags=["counting"])
    assert d["image"].shape == (16, 32, 32, 3)
    assert all(m["tag"] == "counting" and m["count"] in (2, 3) for m in d["meta"])
    noisy = shapes.build(16, seed=0, caption_noise=1.0)
    clean = shapes.build(16, seed=0)
    assert torch.equal(noisy["image"], clean["image"])
    for n, c in zip(noisy["meta"], clean["meta"]):
        assert n["noisy"] and n["drawn"] == c["objects"] and n["objects"] != c["objects"] and n["tag"] == c["tag"]
    jit = shapes.build(16, seed=0, color_jitter=10)
    assert (jit["image"].int() - clean["image"].int()).abs().max() <= 10
    for bad in [
        dict(image_size=15),
        dict(image_size=8),
        dict(split="test"),
        dict(tags=["nope"]),
        dict(caption_noise=2.0),
    ]:
        with pytest.raises(ValueError):
            shapes.build(4, **bad)


def test_prompt_pools_hand_counted_and_disjoint(shapes):
    sizes = {s: {t: len(v) for t, v in shapes.spec_pool(s).items()} for s in ("all", "train", "eval")}
    # 5 colours x 3 shapes = 15; x 5 positions; x counts 2, 3; unordered pairs of different colours
    assert sizes["all"] == {"single": 15, "position": 75, "counting": 30, "color_attr": 105 - 15}
    assert sizes["eval"] == {"single": 3, "position": 15, "counting": 6, "color_attr": 18}  # round(0.2 n)
    assert sizes["train"] == {"single": 12, "position": 60, "counting": 24, "color_attr": 72}
    train, eval_ = set(shapes.prompt_pool("train")), set(shapes.prompt_pool("eval"))
    assert not train & eval_ and train | eval_ == set(shapes.prompt_pool("all")) and len(train | eval_) == 210

    # sampled prompts, in either word order, stay on their side
    def canon(p):
        return tuple(sorted(json.dumps(o, sort_keys=True) for o in parse_prompt(p)["objects"]))

    tr = {canon(p) for p in shapes.build_prompts(400, seed=0, split="train")["prompt"]}
    ev = {canon(p) for p in shapes.build_prompts(400, seed=0, split="eval")["prompt"]}
    assert tr and ev and not tr & ev
    assert {canon(p) for p in eval_} >= ev


def test_build_prompts_deterministic_and_by_name(shapes):
    a = shapes.build_prompts(50, seed=3, split="eval")
    assert set(a) == {"prompt", "meta"} and len(a["prompt"]) == 50
    assert a == shapes.build_prompts(50, seed=3, split="eval")
    assert a != shapes.build_prompts(50, seed=4, split="eval")
    assert all(set(m) == {"tag", "objects", "color", "shape", "count", "position"} for m in a["meta"])
    assert all(m["position"] in POSITIONS for m in a["meta"] if m["tag"] == "position")
    by_name = load_dataset("shapes", num_samples=50, seed=3, split="eval", prompts_only=True)
    assert by_name == a
    images = load_dataset("shapes", num_samples=6, seed=3, image_size=16)
    assert images["image"].shape == (6, 16, 16, 3)
    # the image dataset draws the same prompts as the prompt-only one for the same pool
    assert images["prompt"] == shapes.build_prompts(6, seed=3, split="train")["prompt"]


# ---------------------------------------------------------------------------------------------
# prompt_list
# ---------------------------------------------------------------------------------------------


def test_prompt_list_text(tmp_path):
    f = tmp_path / "prompts.txt"
    f.write_text("# my prompts\n\n  a cat on a mat  \nA dog\n\n#skip me\na cat on a mat\n", encoding="utf-8")
    d = load_dataset("prompt_list", path=str(f))
    assert d == {"prompt": ["a cat on a mat", "A dog", "a cat on a mat"], "meta": [{}, {}, {}]}
    assert load_dataset("prompt_list", path=f, dedupe=True)["prompt"] == ["a cat on a mat", "A dog"]
    assert load_dataset("prompt_list", path=f, comments=False)["prompt"][0] == "# my prompts"
    assert load_dataset("prompt_list", path=f, num_prompts=1)["prompt"] == ["a cat on a mat"]
    shuffled = load_dataset("prompt_list", path=f, shuffle=True, seed=1)
    assert sorted(shuffled["prompt"]) == sorted(d["prompt"])
    assert shuffled == load_dataset("prompt_list", path=f, shuffle=True, seed=1)


def test_prompt_list_jsonl(tmp_path):
    f = tmp_path / "prompts.jsonl"
    f.write_text('{"prompt": "two red apples", "count": 2, "color": "red"}\n\n{"prompt": "a tree"}\n')
    d = load_dataset("prompt_list", path=str(f))
    assert d == {"prompt": ["two red apples", "a tree"], "meta": [{"count": 2, "color": "red"}, {}]}


def test_prompt_list_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        load_dataset("prompt_list", path=str(tmp_path / "nope.txt"))
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n# only a comment\n")
    with pytest.raises(ValueError, match="no prompts"):
        load_dataset("prompt_list", path=str(empty))
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="no prompts"):
        load_dataset("prompt_list", path=str(tmp_path / "empty.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n\n{"text": "no prompt key"}\n')
    with pytest.raises(ValueError, match=r"line 3: no 'prompt' key"):
        load_dataset("prompt_list", path=str(bad))
    bad.write_text('{"prompt": "ok"}\nnot json\n')
    with pytest.raises(ValueError, match="line 2: not valid JSON"):
        load_dataset("prompt_list", path=str(bad))
    bad.write_text('["a list"]\n')
    with pytest.raises(ValueError, match="line 1: expected a JSON object"):
        load_dataset("prompt_list", path=str(bad))
    with pytest.raises(ValueError, match="format"):
        load_dataset("prompt_list", path=str(empty), format="csv")


# ---------------------------------------------------------------------------------------------
# public prompt sets, in their published formats
# ---------------------------------------------------------------------------------------------


def test_pickscore_flow_grpo_layout_and_jsonl(tmp_path):
    folder = tmp_path / "pickscore"
    folder.mkdir()
    (folder / "train.txt").write_text(
        "a majestic lion wearing a crown, digital art\n#1 best pizza ever made\n"
        "a majestic lion wearing a crown, digital art\ncat\n"
    )
    (folder / "test.txt").write_text("an astronaut riding a horse on the moon\n")
    d = load_dataset("pickscore_prompts", path=str(folder))
    assert d["prompt"] == ["a majestic lion wearing a crown, digital art", "#1 best pizza ever made", "cat"]
    assert d["meta"] == [{"source": "pickapic"}] * 3
    assert load_dataset("pickscore_prompts", path=folder, split="test")["prompt"] == [
        "an astronaut riding a horse on the moon"
    ]
    assert load_dataset("pickscore_prompts", path=folder, min_words=6)["prompt"] == [
        "a majestic lion wearing a crown, digital art"
    ]
    assert len(load_dataset("pickscore_prompts", path=folder, dedupe=False)["prompt"]) == 4
    rows = tmp_path / "pickapic.jsonl"
    rows.write_text('{"caption": "a red fox in snow", "ranking_id": 1}\n{"caption": "a red fox in snow"}\n')
    assert load_dataset("pickscore_prompts", path=str(rows))["prompt"] == ["a red fox in snow"]
    with pytest.raises(FileNotFoundError, match="wget .*pickscore/\\$s.txt"):
        load_dataset("pickscore_prompts", path=str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="no validation.txt"):
        load_dataset("pickscore_prompts", path=str(folder), split="validation")


def test_pickscore_parquet_caption_column(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="reading Pick-a-Pic parquet needs pyarrow (not installed)")
    import pyarrow.parquet as pq

    data = tmp_path / "pickapic_v1" / "data"
    data.mkdir(parents=True)
    table = pa.table({"caption": ["a cat", "a cat", "a dog"], "label_0": [1.0, 0.0, 0.5]})
    pq.write_table(table, data / "test-00000-of-00001-abc.parquet")
    pq.write_table(pa.table({"caption": ["a bird"], "label_0": [1.0]}), data / "train-00000-of-00001-abc.parquet")
    assert load_dataset("pickscore_prompts", path=str(tmp_path / "pickapic_v1"), split="test")["prompt"] == [
        "a cat",
        "a dog",
    ]


GENEVAL_RECORDS = [  # the published GenEval record format, one per tag
    {"tag": "single_object", "include": [{"class": "bench", "count": 1}], "prompt": "a photo of a bench"},
    {
        "tag": "two_object",
        "include": [{"class": "cat", "count": 1}, {"class": "tv remote", "count": 1}],
        "prompt": "a photo of a cat and a tv remote",
    },
    {
        "tag": "counting",
        "include": [{"class": "clock", "count": 2}],
        "exclude": [{"class": "clock", "count": 3}],
        "prompt": "a photo of two clocks",
    },
    {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "pink"}], "prompt": "a photo of a pink car"},
    {
        "tag": "position",
        "include": [{"class": "teddy bear", "count": 1}, {"class": "dog", "count": 1, "position": ["right of", 0]}],
        "prompt": "a photo of a dog right of a teddy bear",
    },
    {
        "tag": "color_attr",
        "include": [
            {"class": "giraffe", "count": 1, "color": "brown"},
            {"class": "stop sign", "count": 1, "color": "white"},
        ],
        "prompt": "a photo of a brown giraffe and a white stop sign",
    },
]


def _write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_geneval_formats(tmp_path):
    bench = tmp_path / "geneval" / "prompts"
    bench.mkdir(parents=True)
    _write_jsonl(bench / "evaluation_metadata.jsonl", GENEVAL_RECORDS)
    d = load_dataset("geneval_prompts", path=str(bench))
    assert d["prompt"] == [r["prompt"] for r in GENEVAL_RECORDS]
    assert d["meta"] == [{k: v for k, v in r.items() if k != "prompt"} for r in GENEVAL_RECORDS]
    assert d["meta"][2]["exclude"] == [{"class": "clock", "count": 3}]
    assert d["meta"][4]["include"][1]["position"] == ["right of", 0]
    assert load_dataset("geneval_prompts", path=str(bench / "evaluation_metadata.jsonl"), tags=["counting", "colors"])[
        "prompt"
    ] == ["a photo of two clocks", "a photo of a pink car"]
    # Flow-GRPO layout: {split}_metadata.jsonl
    flow = tmp_path / "flow_geneval"
    flow.mkdir()
    _write_jsonl(flow / "train_metadata.jsonl", GENEVAL_RECORDS[:2])
    _write_jsonl(flow / "test_metadata.jsonl", GENEVAL_RECORDS[2:])
    assert len(load_dataset("geneval_prompts", path=str(flow), split="train")["prompt"]) == 2
    assert len(load_dataset("geneval_prompts", path=str(flow))["prompt"]) == 4


def test_geneval_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="djghosh13/geneval/main/prompts/evaluation_metadata.jsonl"):
        load_dataset("geneval_prompts", path=str(tmp_path / "missing.jsonl"))
    with pytest.raises(FileNotFoundError, match="no test_metadata.jsonl"):
        load_dataset("geneval_prompts", path=str(tmp_path))
    bad = _write_jsonl(tmp_path / "bad.jsonl", GENEVAL_RECORDS[:1] + [{"tag": "counting", "prompt": "x"}])
    with pytest.raises(ValueError, match="line 2: GenEval record needs 'include'"):
        load_dataset("geneval_prompts", path=str(bad))
    no_prompt = _write_jsonl(tmp_path / "np.jsonl", [{"tag": "colors", "include": [{"class": "car", "count": 1}]}])
    with pytest.raises(ValueError, match="line 1: no 'prompt' key"):
        load_dataset("geneval_prompts", path=str(no_prompt))
    good = _write_jsonl(tmp_path / "good.jsonl", GENEVAL_RECORDS)
    with pytest.raises(ValueError, match="unknown GenEval tags"):
        load_dataset("geneval_prompts", path=str(good), tags=["count"])


def test_ocr_prompts(tmp_path):
    folder = tmp_path / "ocr"
    folder.mkdir()
    (folder / "train.txt").write_text(
        'A bakery window with a sign that says "Fresh Bread Daily"\n'
        "\n"
        'A t-shirt printed with "Hello  World" and a "second" quote\n'
        "A book cover titled \u201cThe Last Light\u201d\n"
    )
    (folder / "test.txt").write_text('A neon sign reading "OPEN"\n')
    d = load_dataset("ocr_prompts", path=str(folder))
    assert [m["text"] for m in d["meta"]] == ["Fresh Bread Daily", "Hello  World", "The Last Light"]
    assert d["prompt"][0] == 'A bakery window with a sign that says "Fresh Bread Daily"'
    assert load_dataset("ocr_prompts", path=str(folder), split="test")["meta"] == [{"text": "OPEN"}]
    (folder / "train.txt").write_text('a sign saying "ok"\na blank wall with no text\n')
    with pytest.raises(ValueError, match="line 2: no text in double quotes"):
        load_dataset("ocr_prompts", path=str(folder))
    assert load_dataset("ocr_prompts", path=str(folder), on_missing="skip")["prompt"] == ['a sign saying "ok"']
    rows = _write_jsonl(
        tmp_path / "ocr.jsonl", [{"prompt": 'a mug that says "hi"', "id": 3}, {"prompt": "a poster", "text": "SALE"}]
    )
    assert load_dataset("ocr_prompts", path=str(rows))["meta"] == [{"text": "hi", "id": 3}, {"text": "SALE"}]
    with pytest.raises(FileNotFoundError, match="flow_grpo/main/dataset/ocr"):
        load_dataset("ocr_prompts", path=str(tmp_path / "nowhere"))
