"""VLM reasoning datasets: the `vlm_records` reader and pixel budgets, the public-set recipes
(geometry3k, clevr_counting, refcoco) on small local parquet files in the hub schemas, and the
synthetic `shapes_vqa` task. Nothing is downloaded.
"""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from mmrl.data import DATASETS_DIR, load_dataset
from mmrl.registry import DATASETS
from rewards.shapes import COLORS, SHAPES, color_features, palette_tensor

pytest.importorskip("PIL", reason="VLM datasets decode images with Pillow")
from PIL import Image

NEW = ("vlm_records", "geometry3k", "clevr_counting", "refcoco", "shapes_vqa")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"test_vlm_builder_{name}", DATASETS_DIR / name / "builder.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def vr():
    return _load("vlm_records")


@pytest.fixture(scope="module")
def svqa():
    return _load("shapes_vqa")


def _image(h: int, w: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (h, w, 3), generator=g, dtype=torch.uint8)


def _png(img: torch.Tensor) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img.numpy()).save(buf, format="PNG")  # lossless: decoding gives the same pixels back
    return buf.getvalue()


def _write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_registered_with_cards():
    for name in NEW:
        assert (DATASETS_DIR / name / "CARD.md").exists()
        assert name in DATASETS.names()
        assert not (DATASETS_DIR / name / "__init__.py").exists()
    assert not (DATASETS_DIR / "__init__.py").exists()


# ---------------------------------------------------------------------------------------------
# vlm_records: JSONL / parquet round trips
# ---------------------------------------------------------------------------------------------


def test_jsonl_round_trip_paths_base64_messages(tmp_path):
    a, b, c = _image(20, 30, 1), _image(16, 16, 2), _image(10, 12, 3)
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.png").write_bytes(_png(a))
    abs_c = tmp_path / "c.png"
    abs_c.write_bytes(_png(c))
    records = [
        {"prompt": "How many dots?", "images": ["imgs/a.png"], "answer": 3, "difficulty": "easy"},
        {
            "prompt": "<image>\nWhat is x?",
            "images": [{"bytes": base64.b64encode(_png(b)).decode()}],
            "answer": "12",
            "solution": "<think>2 * 6</think><answer>12</answer>",
        },
        {
            "messages": [
                {"role": "system", "content": "Think first."},
                {
                    "role": "user",
                    "content": [
                        {"type": "image"},
                        {"type": "text", "text": "Compare"},
                        {"type": "image"},
                        {"type": "text", "text": "the two."},
                    ],
                },
            ],
            "images": [{"path": "imgs/a.png"}, str(abs_c)],
            "answer": "left",
            "id": 7,
        },
        {
            "messages": [
                {"role": "user", "content": "<image> first"},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "and now?"},
            ],
            "images": ["imgs/a.png"],
            "answer": 1.5,
        },
    ]
    f = _write_jsonl(tmp_path / "data.jsonl", records)
    d = load_dataset("vlm_records", path=str(f))
    assert set(d) == {"prompt", "images", "meta", "solution"}
    assert d["prompt"] == ["How many dots?", "What is x?", "Compare\nthe two.", "and now?"]
    assert [len(x) for x in d["images"]] == [1, 1, 2, 1]
    assert torch.equal(d["images"][0][0], a) and d["images"][0][0].dtype == torch.uint8
    assert torch.equal(d["images"][1][0], b)
    assert torch.equal(d["images"][2][0], a) and torch.equal(d["images"][2][1], c)
    assert d["meta"][0] == {"answer": 3, "difficulty": "easy"}
    assert d["meta"][2]["answer"] == "left" and d["meta"][2]["id"] == 7
    assert d["meta"][2]["messages"] == records[2]["messages"]  # kept: the system prompt lives there
    assert d["solution"] == ["3", "<think>2 * 6</think><answer>12</answer>", "left", "1.5"]
    # selection: num_samples, shuffle, split filter
    assert load_dataset("vlm_records", path=f, num_samples=2)["prompt"] == d["prompt"][:2]
    s = load_dataset("vlm_records", path=f, shuffle=True, seed=3)
    assert (
        sorted(s["prompt"]) == sorted(d["prompt"])
        and s["prompt"] == load_dataset("vlm_records", path=f, shuffle=True, seed=3)["prompt"]
    )
    split_file = _write_jsonl(
        tmp_path / "split.jsonl", [dict(records[0], split="train"), dict(records[1], split="eval")]
    )
    assert load_dataset("vlm_records", path=split_file, split="eval")["prompt"] == ["What is x?"]
    with pytest.warns(UserWarning, match="no evaluation split, so evaluation .* uses its training rows"):
        assert load_dataset("vlm_records", path=f, split="eval")["prompt"] == d["prompt"]  # no split: all rows
    # a folder with <split>.jsonl
    (tmp_path / "folder").mkdir()
    _write_jsonl(tmp_path / "folder" / "eval.jsonl", [{"prompt": "q", "images": [str(abs_c)], "answer": "a"}])
    assert load_dataset("vlm_records", path=tmp_path / "folder", split="eval")["prompt"] == ["q"]


def test_parquet_round_trip(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="parquet needs pyarrow (not installed)")
    import pyarrow.parquet as pq

    a, b = _image(24, 18, 4), _image(8, 40, 5)
    (tmp_path / "b.png").write_bytes(_png(b))
    table = pa.table(
        {
            "prompt": ["<image> Which is bigger?", "Name it."],
            "images": [
                [{"bytes": _png(a), "path": None}, {"bytes": None, "path": "b.png"}],
                [{"bytes": _png(b), "path": "b.png"}],
            ],
            "answer": ["A", "B"],
            "source": ["s1", "s2"],
        }
    )
    f = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(table, f)
    with pytest.raises(ValueError, match=r"row 0: the prompt has 1 \"<image>\" placeholder\(s\) but the record has 2"):
        load_dataset("vlm_records", path=str(f))
    table = table.set_column(0, "prompt", pa.array(["Which is bigger?", "Name it."]))
    pq.write_table(table, f)
    d = load_dataset("vlm_records", path=str(f))
    assert d["prompt"] == ["Which is bigger?", "Name it."]
    assert torch.equal(d["images"][0][0], a) and torch.equal(d["images"][0][1], b)
    assert torch.equal(d["images"][1][0], b)
    assert d["meta"] == [{"answer": "A", "source": "s1"}, {"answer": "B", "source": "s2"}]
    assert d["solution"] == ["A", "B"]
    assert load_dataset("vlm_records", path=tmp_path, split="train")["prompt"] == d["prompt"]  # folder layout
    assert load_dataset("vlm_records", path=str(f), num_samples=1)["prompt"] == ["Which is bigger?"]


# ---------------------------------------------------------------------------------------------
# vlm_records: errors name the file, the line / row and the fix
# ---------------------------------------------------------------------------------------------


def test_record_errors(tmp_path):
    img = tmp_path / "ok.png"
    img.write_bytes(_png(_image(8, 8)))
    good = {"prompt": "q", "images": ["ok.png"], "answer": "a"}

    def fails(records, match, exc=ValueError):
        f = _write_jsonl(tmp_path / "bad.jsonl", records)
        with pytest.raises(exc, match=match) as info:
            load_dataset("vlm_records", path=str(f))
        assert str(f) in str(info.value)
        return str(info.value)

    msg = fails([good, {"prompt": "q", "images": ["ok.png"]}], r"line 2: no 'answer' column")
    assert "(its columns: images, prompt)" in msg and "set answer_key: <the ground-truth column>" in msg
    assert "answer_key: null" in msg and "\n" not in msg
    msg = fails(
        [good, good, {"prompt": "q", "images": ["missing/x.png"], "answer": 1}],
        r"line 3, image 0: image file not found: .*missing/x.png",
        FileNotFoundError,
    )
    assert f"resolved against {tmp_path}" in msg
    msg = fails(
        [
            {
                "messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "q"}]}],
                "images": ["ok.png", "ok.png"],
                "answer": 1,
            }
        ],
        r"line 1: the messages have 1 image placeholder\(s\) but the record has 2 image\(s\)",
    )
    assert '{"type": "image"}' in msg
    fails(
        [{"messages": [{"role": "user", "content": "<image><image> q"}], "images": ["ok.png"], "answer": 1}],
        r"line 1: the messages have 2 image placeholder",
    )
    (tmp_path / "junk.png").write_bytes(b"not an image at all")
    fails([{"prompt": "q", "images": ["junk.png"], "answer": 1}], r"line 1, image 0 .*not a decodable image")
    fails(
        [{"prompt": "q", "images": [{"bytes": "%%%not base64"}], "answer": 1}], r"line 1, image 0: .*not valid base64"
    )
    msg = fails([{"question": "q", "answer": 1}], r"line 1: no 'prompt' column \(or chat 'messages'\)")
    assert "(its columns: answer, question); set prompt_key: <the question column>, e.g. prompt_key: question" in msg
    fails(
        [{"prompt": "q", "messages": [{"role": "user", "content": "q"}], "answer": 1}], "both 'prompt' and 'messages'"
    )
    fails([{"messages": [{"role": "system", "content": "x"}], "answer": 1}], 'no message with role "user"')
    fails([good, "a string"], r"line 2: expected an object, got str")
    (tmp_path / "bad.jsonl").write_text(json.dumps(good) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad.jsonl, line 2: not valid JSON"):
        load_dataset("vlm_records", path=str(tmp_path / "bad.jsonl"))
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_dataset("vlm_records", path=str(tmp_path / "nope.jsonl"))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no records"):
        load_dataset("vlm_records", path=str(tmp_path / "empty.jsonl"))


# ---------------------------------------------------------------------------------------------
# Pixel budgets
# ---------------------------------------------------------------------------------------------


def test_fit_pixels_hand_computed(vr):
    fit = vr.fit_pixels
    # (100, 200), factor 28: round(100/28 = 3.57) = 4 -> 112, round(200/28 = 7.14) = 7 -> 196;
    # 112 * 196 = 21952 lies in [56*56 = 3136, 28*28*64 = 50176]: kept.
    assert fit(100, 200, 56 * 56, 28 * 28 * 64, 28) == (112, 196)
    # (1000, 2000): rounded 1008 x 1988 > 50176, beta = sqrt(2e6 / 50176) = 6.3135;
    # 1000 / beta = 158.39 -> floor(5.66) * 28 = 140, 2000 / beta = 316.78 -> floor(11.31) * 28 = 308.
    assert fit(1000, 2000, 56 * 56, 28 * 28 * 64, 28) == (140, 308)
    # (20, 30): rounded 28 x 28 = 784 < 3136, beta = sqrt(3136 / 600) = 2.2862;
    # 20 * beta = 45.72 -> ceil(1.63) * 28 = 56, 30 * beta = 68.59 -> ceil(2.45) * 28 = 84.
    assert fit(20, 30, 56 * 56, 28 * 28 * 64, 28) == (56, 84)
    # Python round halves to even: 70 / 28 = 2.5 -> 2 -> 56; 98 / 28 = 3.5 -> 4 -> 112.
    assert fit(70, 98, None, None, 28) == (56, 112)
    # no budget: only the grid; tiny images get at least one factor
    assert fit(5, 7, None, None, 28) == (28, 28)
    assert fit(224, 224, 56 * 56, 28 * 28 * 64, 28) == (224, 224)
    # factor 32 (Qwen3-VL): 100 -> 96, 200 -> 192 (6.25 -> 6); 96 * 192 = 18432 > 16384 -> beta = 1.118:
    # 100 / beta = 89.44 -> floor(2.8) * 32 = 64, 200 / beta = 178.9 -> floor(5.59) * 32 = 160.
    assert fit(100, 200, None, 16384, 32) == (64, 160)
    with pytest.raises(ValueError, match="aspect ratio"):
        fit(10, 2010, None, None, 28)  # 201 : 1
    # 200 : 1 is allowed: round(10 / 28) = 0 -> at least 28; round(2000 / 28 = 71.43) = 71 -> 1988
    assert fit(10, 2000, None, None, 28) == (28, 1988)
    with pytest.raises(ValueError, match="min_pixels"):
        fit(100, 100, 5000, 4000)


def test_resize_image_and_budget_in_build(vr, tmp_path):
    img = _image(100, 200, 7)
    out = vr.resize_image(img, 56 * 56, 28 * 28 * 64, 28)
    assert out.shape == (112, 196, 3) and out.dtype == torch.uint8
    assert vr.resize_image(img).shape == (112, 196, 3)  # no budget: only snapped to the 28 grid
    on_grid = _image(56, 84, 9)
    assert vr.resize_image(on_grid, 56 * 56, 28 * 28 * 64) is on_grid  # already fits: untouched
    (tmp_path / "big.png").write_bytes(_png(_image(1000, 2000, 8)))
    f = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "q", "images": ["big.png"], "answer": 1}])
    d = load_dataset("vlm_records", path=f, min_pixels=56 * 56, max_pixels=28 * 28 * 64)
    assert d["images"][0][0].shape == (140, 308, 3)
    assert load_dataset("vlm_records", path=f)["images"][0][0].shape == (1000, 2000, 3)


# ---------------------------------------------------------------------------------------------
# Public-set recipes on local parquet files in the hub schemas
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pq():
    pytest.importorskip("pyarrow", reason="the local hub-schema path reads parquet with pyarrow (not installed)")
    import pyarrow.parquet as pq

    return pq


def _img_cell(img: torch.Tensor, name: str = "x.png") -> dict:
    return {"bytes": _png(img), "path": name}  # Hugging Face Image() storage: struct<bytes, path>


def test_geometry3k_hub_schema(tmp_path, pq):
    import pyarrow as pa

    snap = tmp_path / "geometry3k" / "data"
    snap.mkdir(parents=True)
    imgs = [_image(30, 40, i) for i in range(3)]
    table = pa.table(
        {
            "images": [[_img_cell(im)] for im in imgs],
            "problem": ["<image>Find x.", "<image>Find the area of the triangle.", "<image>Find y. Round to tenths."],
            "answer": ["3", "12\\sqrt{3}", "4.5"],
        }
    )
    pq.write_table(table.slice(0, 2), snap / "train-00000-of-00001.parquet")
    pq.write_table(table.slice(2, 1), snap / "test-00000-of-00001.parquet")
    d = load_dataset("geometry3k", path=str(tmp_path / "geometry3k"))
    assert d["prompt"] == ["Find x.", "Find the area of the triangle."]
    assert torch.equal(d["images"][1][0], imgs[1])
    assert d["meta"][1] == {"answer": "12\\sqrt{3}", "source": "hiyouga/geometry3k", "split": "train", "row": 1}
    assert d["solution"] == ["3", "12\\sqrt{3}"]
    t = load_dataset("geometry3k", split="test", data_files=[str(snap / "test-*.parquet")], max_pixels=28 * 28)
    assert t["prompt"] == ["Find y. Round to tenths."] and t["images"][0][0].shape == (28, 28, 3)
    with pytest.raises(FileNotFoundError, match="no validation-\\*.parquet .*huggingface-cli download"):
        load_dataset("geometry3k", split="validation", path=str(tmp_path / "geometry3k"))
    pq.write_table(pa.table({"image": [_img_cell(imgs[0])], "question": ["q"]}), tmp_path / "wrong.parquet")
    with pytest.raises(ValueError, match=r"missing column\(s\) \['images', 'problem', 'answer'\]"):
        load_dataset("geometry3k", data_files=str(tmp_path / "wrong.parquet"))


def test_clevr_counting_hub_schema(tmp_path, pq, vr):
    import pyarrow as pa

    imgs = [_image(32, 48, 10 + i) for i in range(5)]
    table = pa.table(
        {
            "image": [_img_cell(im) for im in imgs],
            "problem": ["How many items are there in the image?"] * 5,
            "solution": [f"<answer> {n} </answer>" for n in (3, 7, 10, 4, 5)],
        }
    )
    f = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(table, f, row_group_size=2)
    d = load_dataset("clevr_counting", data_files=str(f), eval_size=2)
    assert [m["answer"] for m in d["meta"]] == ["3", "7", "10"]
    assert d["solution"][0] == "<answer> 3 </answer>" and d["prompt"][0] == "How many items are there in the image?"
    assert torch.equal(d["images"][2][0], imgs[2])
    e = load_dataset("clevr_counting", data_files=str(f), eval_size=2, split="eval")
    assert [m["answer"] for m in e["meta"]] == ["4", "5"] and [m["row"] for m in e["meta"]] == [3, 4]
    s = load_dataset("clevr_counting", data_files=str(f), split="all", shuffle=True, seed=1, num_samples=3)
    assert len(s["prompt"]) == 3 and all(torch.equal(i[0], imgs[m["row"]]) for i, m in zip(s["images"], s["meta"]))
    bad = tmp_path / "bad.parquet"
    pq.write_table(table.set_column(2, "solution", pa.array(["<answer> many </answer>"] * 5)), bad)
    with pytest.raises(ValueError, match=r"bad.parquet, row 0: no number in solution"):
        load_dataset("clevr_counting", data_files=str(bad), eval_size=0)
    with pytest.raises(ValueError, match=r"no rows for split='train' \(5 rows, eval_size=500\)"):
        load_dataset("clevr_counting", data_files=str(f))


def test_refcoco_lmms_schema_xywh_to_xyxy(tmp_path, pq):
    import pyarrow as pa

    img = _image(60, 80, 20)  # H 60, W 80
    table = pa.table(
        {
            "question_id": ["q1", "q2"],
            "image": [_img_cell(img), _img_cell(img)],
            "question": ["Please carefully observe the area circled in the image ..."] * 2,
            "answer": [["man on the left", "guy in red"], ["dog"]],
            "segmentation": [[1.0, 2.0], [3.0, 4.0]],
            "bbox": [[10.0, 5.0, 30.0, 20.0], [0.0, 0.0, 80.0, 60.0]],  # COCO x, y, w, h
            "iscrowd": [0, 0],
            "file_name": ["COCO_train2014_000000000001.jpg"] * 2,
        }
    )
    snap = tmp_path / "RefCOCO" / "data"
    snap.mkdir(parents=True)
    pq.write_table(table, snap / "val-00000-of-00001.parquet")
    d = load_dataset("refcoco", path=str(tmp_path / "RefCOCO"))
    assert d["prompt"] == ["Output the bounding box of: man on the left", "Output the bounding box of: dog"]
    m = d["meta"][0]
    # xywh (10, 5, 30, 20) -> xyxy (10, 5, 10 + 30, 5 + 20)
    assert m["answer"] == m["box"] == [10.0, 5.0, 40.0, 25.0] and m["image_size"] == [80, 60]
    assert m["box_format"] == "xyxy" and m["question_id"] == "q1" and m["expression"] == "man on the left"
    assert m["box_1000"] == [125, 83, 500, 417]
    assert d["solution"][0] == "[10, 5, 40, 25]" and d["meta"][1]["box"] == [0.0, 0.0, 80.0, 60.0]
    assert torch.equal(d["images"][0][0], img)
    allx = load_dataset("refcoco", path=str(tmp_path / "RefCOCO"), all_expressions=True)
    assert [x["expression"] for x in allx["meta"]] == ["man on the left", "guy in red", "dog"]
    # a pixel budget rescales the box into the resized image: 60 x 80 -> 56 x 84 (factor 28)
    r = load_dataset(
        "refcoco", path=str(tmp_path / "RefCOCO"), min_pixels=56 * 56, max_pixels=28 * 28 * 64, num_samples=1
    )
    m = r["meta"][0]
    assert r["images"][0][0].shape == (56, 84, 3) and m["image_size"] == [84, 56]
    assert m["box"] == [round(10 * 84 / 80, 2), round(5 * 56 / 60, 2), round(40 * 84 / 80, 2), round(25 * 56 / 60, 2)]
    assert m["orig_box"] == [10.0, 5.0, 40.0, 25.0] and m["orig_image_size"] == [80, 60]
    # reading xywh boxes as xyxy is caught when they cannot be xyxy (x + w read as x2 < x1)
    wide = tmp_path / "wide.parquet"
    pq.write_table(table.slice(0, 1).set_column(5, "bbox", pa.array([[40.0, 30.0, 20.0, 10.0]])), wide)
    assert load_dataset("refcoco", data_files=str(wide))["meta"][0]["box"] == [40.0, 30.0, 60.0, 40.0]
    with pytest.raises(ValueError, match="row 0: box .* not a box inside the 80x60 image; .*box_format='xywh'"):
        load_dataset("refcoco", data_files=str(wide), box_format="xyxy")


def test_refcoco_jxu124_schema_coco_images(tmp_path, pq):
    import pyarrow as pa

    img = _image(40, 50, 21)
    coco = tmp_path / "coco" / "train2014"
    coco.mkdir(parents=True)
    (coco / "COCO_train2014_000000000009.jpg").write_bytes(_png(img))  # PNG bytes; PIL reads by content
    table = pa.table(
        {
            "ref_id": [0],
            "ann_id": [11],
            "image_id": [9],
            "split": ["train"],
            "sentences": [[{"raw": "Left cat", "sent": "left cat"}]],
            "raw_anns": [json.dumps({"bbox": [2.0, 3.0, 10.0, 20.0]})],
            "image_path": ["coco/train2014/COCO_train2014_000000000009.jpg"],
            "bbox": [[2.0, 3.0, 12.0, 23.0]],  # already x1, y1, x2, y2
            "captions": [["left cat", "the cat on the left"]],
        }
    )
    f = tmp_path / "train.parquet"
    pq.write_table(table, f)
    with pytest.raises(ValueError, match="carries no pixels; pass image_root="):
        load_dataset("refcoco", hub_id="jxu124/refcoco", data_files=str(f))
    for root in (tmp_path, tmp_path / "coco", coco):
        d = load_dataset("refcoco", hub_id="jxu124/refcoco", data_files=str(f), image_root=str(root))
        assert d["meta"][0]["box"] == [2.0, 3.0, 12.0, 23.0] and d["meta"][0]["split"] == "train"
        assert d["prompt"] == ["Output the bounding box of: left cat"] and torch.equal(d["images"][0][0], img)
    with pytest.raises(FileNotFoundError, match="image file not found: .*fix image_root"):
        load_dataset("refcoco", hub_id="jxu124/refcoco", data_files=str(f), image_root=str(tmp_path / "nowhere"))


def test_hub_path_needs_hf_datasets(vr):
    spec = importlib.util.find_spec("datasets")  # without importing; the repo's datasets/ is a namespace
    if spec is not None and spec.origin not in (None, "namespace"):
        pytest.skip("Hugging Face datasets is installed; the hub path would download")
    with pytest.raises(ImportError, match="pip install datasets"):
        load_dataset("geometry3k")
    with pytest.raises(ImportError, match="pip install datasets"):
        vr.hub_source("leonardPKU/clevr_cogen_a_train", "train")
    mod = sys.modules.get("datasets")
    assert mod is None or hasattr(mod, "load_dataset")  # the namespace stand-in is not left behind


# ---------------------------------------------------------------------------------------------
# shapes_vqa
# ---------------------------------------------------------------------------------------------


def test_shapes_vqa_format_and_determinism(svqa):
    a = svqa.build(40, seed=5)
    assert set(a) == {"prompt", "images", "meta", "solution"} and len(a["prompt"]) == 40
    assert all(len(x) == 1 and x[0].shape == (32, 32, 3) and x[0].dtype == torch.uint8 for x in a["images"])
    assert a["solution"] == [m["answer"] for m in a["meta"]]
    b = svqa.build(40, seed=5)
    assert a["prompt"] == b["prompt"] and a["meta"] == b["meta"]
    assert all(torch.equal(x[0], y[0]) for x, y in zip(a["images"], b["images"]))
    c = svqa.build(40, seed=6)
    assert a["meta"] != c["meta"]
    # sample i depends only on (seed, split, i): a longer build starts with the shorter one
    long = svqa.build(1100, seed=5)
    assert long["meta"][:40] == a["meta"] and all(torch.equal(x[0], y[0]) for x, y in zip(a["images"], long["images"]))
    assert svqa.build(8, seed=5, image_size=16)["images"][0][0].shape == (16, 16, 3)
    only = svqa.build(30, tasks=["color"], suffix=" Answer with one word.")
    assert all(
        m["task"] == "color" and p.endswith(" Answer with one word.") for m, p in zip(only["meta"], only["prompt"])
    )
    assert {m["task"] for m in svqa.build(30, tasks={"count": 1, "compare": 0})["meta"]} == {"count"}
    big = svqa.build(2, max_pixels=28 * 28 * 4, min_pixels=56 * 56)
    assert big["images"][0][0].shape == (56, 56, 3)
    for bad in [dict(split="test"), dict(tasks=["nope"]), dict(image_size=15), dict(num_samples=0)]:
        with pytest.raises(ValueError):
            svqa.build(**{"num_samples": 4, **bad})


def test_shapes_vqa_train_val_eval_disjoint(svqa):
    train = svqa.build(1500, split="train", seed=0)
    val = svqa.build(500, split="val", seed=0)
    ev = svqa.build(500, split="eval", seed=0)
    ev2 = svqa.build(500, split="eval", seed=1)

    def keys(d):
        return {(p, x[0].numpy().tobytes()) for p, x in zip(d["prompt"], d["images"])}

    def images(d):
        return {x[0].numpy().tobytes() for x in d["images"]}

    tr = keys(train)
    assert not tr & keys(ev) and not tr & keys(ev2) and not tr & keys(val)  # no identical (image, question)
    # stronger: no image of one split appears in another at all (the split is a hash of the scene)
    assert not images(train) & images(ev) and not images(train) & images(val) and not images(val) & images(ev)
    for d, split in ((train, "train"), (val, "val"), (ev, "eval")):
        assert all(svqa.scene_split(m["objects"], 32) == split for m in d["meta"])
    # the validation share is carved out of train: the eval questions do not depend on it
    assert svqa.build(50, split="eval", val_fraction=0.0)["meta"] == ev["meta"][:50]
    assert svqa.build(50, split="train", val_fraction=0.0)["meta"] != train["meta"][:50]
    with pytest.raises(ValueError, match="split 'val' needs val_fraction > 0"):
        svqa.build(4, split="val", val_fraction=0.0)
    with pytest.raises(ValueError, match="eval_fraction \\+ val_fraction < 1"):
        svqa.build(4, eval_fraction=0.5, val_fraction=0.5)


def test_shapes_vqa_answers_match_pixels(svqa):
    d = svqa.build(300, seed=2)
    images = torch.stack([x[0] for x in d["images"]])
    feats = color_features(images, palette_tensor())
    names, color_idx = list(COLORS), {c: i for i, c in enumerate(COLORS)}
    counts = feats["count"]  # [B, 5] connected components per palette colour
    for i, m in enumerate(d["meta"]):
        objs, ans, q = m["objects"], m["answer"], d["prompt"][i]
        assert 1 <= len(objs) <= 4 and int(counts[i].sum()) == len(objs)
        for o in objs:  # every object is drawn in its box in its colour, boxes in distinct quadrants
            x0, y0, x1, y1 = o["box"]
            patch = images[i, y0:y1, x0:x1]
            assert (patch == torch.tensor(COLORS[o["color"]], dtype=torch.uint8)).all(-1).float().mean() > 0.4
        if m["task"] == "count":
            assert int(ans) == len(objs) == int(counts[i].sum())
        elif m["task"] == "count_color":
            color = q.split()[2]
            assert int(ans) == int(counts[i, color_idx[color]]) == sum(o["color"] == color for o in objs)
        elif m["task"] == "color":
            shape = q.rstrip("?").split()[-1]
            owners = [o for o in objs if o["shape"] == shape]
            assert len(owners) == 1 and ans == owners[0]["color"]
            sc = feats["shape_count"][i, :, SHAPES.index(shape)]  # shape read back from the pixels
            assert int(sc.sum()) == 1 and names[int(sc.argmax())] == ans
        else:
            ca, cb = q.split()[3], q.split()[6]
            assert ans == ("yes" if int(counts[i, color_idx[ca]]) > int(counts[i, color_idx[cb]]) else "no")


def test_shapes_vqa_answer_balance_and_speed(svqa):
    svqa.build(10)  # warm up (imports, first render)
    t = time.perf_counter()
    d = svqa.build(2000, seed=0)
    elapsed = time.perf_counter() - t
    print(f"\nshapes_vqa: 2000 samples in {elapsed:.2f} s")
    assert elapsed < 3.0
    by_task: dict[str, Counter] = {}
    for m in d["meta"]:
        by_task.setdefault(m["task"], Counter())[m["answer"]] += 1
    for task, c in sorted(by_task.items()):
        n = sum(c.values())
        print(f"  {task:12s} n={n:4d} majority {c.most_common(1)[0][1] / n:.0%}  {dict(sorted(c.items()))}")
    assert set(by_task) == set(svqa.TASKS)
    count = by_task["count"]
    assert set(count) == {"1", "2", "3", "4"} and count.most_common(1)[0][1] / sum(count.values()) < 0.40
    assert set(by_task["count_color"]) == {"0", "1", "2", "3", "4"}
    assert by_task["compare"].most_common(1)[0][1] / sum(by_task["compare"].values()) < 0.6
    assert set(by_task["color"]) == set(COLORS)


def test_shapes_vqa_by_name(svqa):
    d = load_dataset("shapes_vqa", num_samples=12, split="eval", seed=3)
    ref = svqa.build(12, split="eval", seed=3)
    assert d["prompt"] == ref["prompt"] and d["meta"] == ref["meta"]
    assert all(torch.equal(x[0], y[0]) for x, y in zip(d["images"], ref["images"]))
