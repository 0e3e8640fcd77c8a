"""`vlm_records` reads a user's data as it is: JSONL / JSON / parquet / CSV files, folders and
`data_files` in the Hugging Face hub's layouts, `Image()` feature columns, any column names through
`prompt_key` / `answer_key` / `image_key`, every other column kept in `meta` for the reward, and a
file without an evaluation split still evaluates (documented fallback, never an error about a split
the user did not ask for). All files are written here, in the public formats; nothing is downloaded.
"""

from __future__ import annotations

import datetime
import io
import json
import warnings
from pathlib import Path

import pytest
import torch

from mmrl.config import ConfigError
from mmrl.data import builder_module, load_dataset

pytest.importorskip("PIL", reason="VLM datasets decode images with Pillow")
from PIL import Image

# the huggingface schema metadata `datasets.Dataset.to_parquet` writes for an Image() column
HF_IMAGE_SCHEMA = {
    "info": {
        "features": {
            "question": {"dtype": "string", "_type": "Value"},
            "image": {"_type": "Image"},
            "answer": {"dtype": "string", "_type": "Value"},
            "level": {"dtype": "int64", "_type": "Value"},
        }
    }
}


def _image(h: int, w: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (h, w, 3), generator=g, dtype=torch.uint8)


def _png(img: torch.Tensor) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img.numpy()).save(buf, format="PNG")  # lossless
    return buf.getvalue()


def _jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _question_rows(folder: Path, n: int = 4, prefix: str = "q") -> list[dict]:
    """Rows in the layout most public VLM RL sets use: question / image / answer + extra columns."""
    (folder / "img").mkdir(exist_ok=True)
    rows = []
    for i in range(n):
        (folder / "img" / f"{prefix}{i}.png").write_bytes(_png(_image(12, 16, i)))
        rows.append(
            {
                "id": f"{prefix}{i}",
                "question": f"How many? {prefix}{i}",
                "image": f"img/{prefix}{i}.png",
                "answer": str(i),
                "difficulty": i % 2,
                "choices": ["A", "B"],
            }
        )
    return rows


@pytest.fixture(scope="module")
def vr():
    return builder_module("vlm_records")


@pytest.fixture
def hf(monkeypatch, tmp_path, vr):
    """Hugging Face datasets (offline, caching under tmp_path), or a skip saying it is not installed."""
    try:
        mod = vr._hf_datasets()
    except ImportError:
        pytest.skip(
            "Hugging Face datasets is not installed (pip install datasets): the files it writes are "
            "covered by the pyarrow-written hub-schema tests"
        )
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(mod.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    monkeypatch.setattr(mod.config, "HF_HUB_OFFLINE", True, raising=False)
    return mod


# ---------------------------------------------------------------------------------------------
# Column mapping and meta
# ---------------------------------------------------------------------------------------------


def test_question_column_with_prompt_key_and_extra_columns_in_meta(tmp_path):
    rows = _question_rows(tmp_path)
    f = _jsonl(tmp_path / "data.jsonl", rows)
    d = load_dataset("vlm_records", path=str(f), prompt_key="question")
    assert d["prompt"] == [r["question"] for r in rows]
    assert [torch.equal(x[0], _image(12, 16, i)) for i, x in enumerate(d["images"])] == [True] * 4
    # every other column reaches meta under its own name; the prompt and image columns do not
    assert d["meta"][1] == {"id": "q1", "answer": "1", "difficulty": 1, "choices": ["A", "B"]}
    assert d["solution"] == ["0", "1", "2", "3"]
    json.dumps(d["meta"])  # plain JSON

    # the ground truth under another name: meta keeps it under its own name and as "answer"
    renamed = [{"problem": r["question"], "solution": r["answer"], "img": r["image"]} for r in rows]
    f2 = _jsonl(tmp_path / "renamed.jsonl", renamed)
    d = load_dataset("vlm_records", path=f2, prompt_key="problem", answer_key="solution", image_key="img")
    assert d["prompt"] == [r["question"] for r in rows] and len(d["images"][3]) == 1
    assert d["meta"][2] == {"solution": "2", "answer": "2"} and d["solution"][2] == "2"
    # reward-only data: no ground truth, no images
    d = load_dataset("vlm_records", path=f2, prompt_key="problem", answer_key=None, image_key=None)
    assert d["meta"][0] == {"solution": "0", "img": "img/q0.png"} and d["images"][0] == []


def test_a_missing_column_names_the_columns_found(tmp_path):
    f = _jsonl(tmp_path / "data.jsonl", _question_rows(tmp_path, 2))

    def error(**kw) -> str:
        with pytest.raises(ValueError) as exc:
            load_dataset("vlm_records", path=f, **kw)
        msg = str(exc.value)
        assert "\n" not in msg and f"{f}, line 1" in msg
        return msg

    cols = "(its columns: answer, choices, difficulty, id, image, question)"
    msg = error()  # the default prompt_key
    assert (
        f"no 'prompt' column (or chat 'messages') {cols}; set prompt_key: <the question column>, "
        "e.g. prompt_key: question" in msg
    )
    msg = error(prompt_key="question", answer_key="final")
    assert f"no 'final' column {cols}; set answer_key: <the ground-truth column>, e.g. answer_key: answer" in msg
    assert "answer_key: null" in msg
    msg = error(prompt_key="question", image_key="picture")
    assert f"no 'picture' column {cols}; set image_key: <the image column>, e.g. image_key: image" in msg
    with pytest.raises(ValueError, match="prompt_key must be a column name, got ''"):
        load_dataset("vlm_records", path=f, prompt_key="")


def test_chat_prompts_trl_conversational(tmp_path):
    img = _image(8, 8, 7)
    rows = [
        {
            "prompt": [
                {"role": "system", "content": "Answer with a number."},
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]},
            ],
            "images": [{"bytes": None, "path": str(tmp_path / "a.png")}],
            "solution": "3",
        }
    ]
    (tmp_path / "a.png").write_bytes(_png(img))
    d = load_dataset("vlm_records", path=_jsonl(tmp_path / "c.jsonl", rows), answer_key="solution")
    assert d["prompt"] == ["How many?"] and torch.equal(d["images"][0][0], img)
    assert d["meta"][0]["messages"][0] == {"role": "system", "content": "Answer with a number."}
    assert d["meta"][0]["answer"] == "3" and d["meta"][0]["solution"] == "3"


def test_extra_column_values_become_json(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="parquet needs pyarrow")
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "prompt": ["q"],
            "answer": [1.5],
            "when": pa.array([datetime.datetime(2024, 5, 1, 12, 30)]),
            "tags": [["a", "b"]],
            "box": [{"x": 1, "y": 2}],
            "mask": [{"bytes": _png(_image(4, 4, 0)), "path": None}],  # a second image column
        }
    )
    pq.write_table(table, tmp_path / "x.parquet")
    with pytest.warns(UserWarning, match=r"column\(s\) mask hold bytes or images, not JSON values"):
        d = load_dataset("vlm_records", path=tmp_path / "x.parquet")
    assert d["meta"] == [{"answer": 1.5, "when": "2024-05-01T12:30:00", "tags": ["a", "b"], "box": {"x": 1, "y": 2}}]
    assert json.loads(json.dumps(d["meta"])) == d["meta"]


# ---------------------------------------------------------------------------------------------
# Formats: Image() features in parquet (the hub schema), CSV, folders, data_files
# ---------------------------------------------------------------------------------------------


def _hf_image_parquet(path: Path, images: list) -> None:
    """A parquet file exactly as `datasets.Dataset.from_dict(...).cast_column("image", Image()).to_parquet`
    writes it: the image column is struct<bytes: binary, path: string> + the huggingface schema metadata."""
    pa = pytest.importorskip("pyarrow", reason="parquet needs pyarrow")
    import pyarrow.parquet as pq

    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table(
        {
            "question": [f"q{i}" for i in range(len(images))],
            "image": pa.array(images, type=image_type),
            "answer": [str(i) for i in range(len(images))],
            "level": list(range(len(images))),
        }
    )
    table = table.replace_schema_metadata({"huggingface": json.dumps(HF_IMAGE_SCHEMA)})
    pq.write_table(table, path)


def test_parquet_image_feature_bytes_and_paths(tmp_path):
    a, b = _image(10, 14, 1), _image(6, 9, 2)
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "b.png").write_bytes(_png(b))
    f = tmp_path / "train-00000-of-00001.parquet"
    _hf_image_parquet(f, [{"bytes": _png(a), "path": None}, {"bytes": None, "path": "pics/b.png"}])
    d = load_dataset("vlm_records", path=str(f), prompt_key="question")
    assert d["prompt"] == ["q0", "q1"]
    assert torch.equal(d["images"][0][0], a) and torch.equal(d["images"][1][0], b)  # relative to the file
    assert d["meta"] == [{"answer": "0", "level": 0}, {"answer": "1", "level": 1}]


def test_parquet_written_by_hf_datasets(tmp_path, hf):
    a, b = _image(10, 14, 1), _image(6, 9, 2)
    ds = hf.Dataset.from_dict(
        {
            "question": ["q0", "q1"],
            "image": [{"bytes": _png(a), "path": None}, {"bytes": _png(b), "path": None}],
            "answer": ["0", "1"],
            "level": [0, 1],
        }
    ).cast_column("image", hf.Image())
    ds.to_parquet(str(tmp_path / "data.parquet"))
    d = load_dataset("vlm_records", path=tmp_path / "data.parquet", prompt_key="question")
    assert torch.equal(d["images"][0][0], a) and torch.equal(d["images"][1][0], b)
    assert d["meta"] == [{"answer": "0", "level": 0}, {"answer": "1", "level": 1}]
    # Image() from file paths: HF stores the path only, in parquet and in JSON lines ({"bytes": null, "path"})
    (tmp_path / "a.png").write_bytes(_png(a))
    ds = hf.Dataset.from_dict({"question": ["q0"], "image": [str(tmp_path / "a.png")], "answer": ["0"]})
    ds = ds.cast_column("image", hf.Image())
    ds.to_parquet(str(tmp_path / "paths.parquet"))
    ds.to_json(str(tmp_path / "paths.jsonl"))
    for f in ("paths.parquet", "paths.jsonl"):
        d = load_dataset("vlm_records", path=tmp_path / f, prompt_key="question")
        assert torch.equal(d["images"][0][0], a) and d["meta"] == [{"answer": "0"}]


def test_datasets_load_dataset_path_offline(tmp_path, hf):
    """The hub code path (`datasets.load_dataset(path, subset, split=..., data_files=...)`) on a packaged
    loader with local files: the same call that reads a hub id, without a download."""
    rows = _question_rows(tmp_path, 3)
    for r in rows:
        r["image"] = str(tmp_path / r["image"])
    _jsonl(tmp_path / "tr.jsonl", rows)
    _jsonl(tmp_path / "te.jsonl", rows[:1])
    files = {"train": str(tmp_path / "tr.jsonl"), "test": str(tmp_path / "te.jsonl")}
    d = load_dataset("vlm_records", path="json", data_files=files, prompt_key="question")
    assert d["prompt"] == [r["question"] for r in rows] and d["images"][2][0].shape == (12, 16, 3)
    assert d["meta"][0] == {"id": "q0", "answer": "0", "difficulty": 0, "choices": ["A", "B"]}
    assert load_dataset("vlm_records", path="json", data_files=files, prompt_key="question", split="eval")[
        "prompt"
    ] == [rows[0]["question"]]  # eval -> the "test" split


def test_csv_and_tsv(tmp_path):
    rows = _question_rows(tmp_path, 3)
    header = "question,image,answer,difficulty\n"
    body = "".join(f'"{r["question"]}, please",{r["image"]},{r["answer"]},{r["difficulty"]}\n' for r in rows)
    (tmp_path / "data.csv").write_text(header + body)
    d = load_dataset("vlm_records", path=tmp_path / "data.csv", prompt_key="question")
    assert d["prompt"][1] == "How many? q1, please" and torch.equal(d["images"][2][0], _image(12, 16, 2))
    assert d["meta"][1] == {"answer": 1, "difficulty": 1}  # typed as pandas / HF datasets read CSV
    (tmp_path / "data.tsv").write_text("prompt\tanswer\nWhat?\tx\n")
    assert load_dataset("vlm_records", path=tmp_path / "data.tsv")["meta"] == [{"answer": "x"}]
    (tmp_path / "bad.csv").write_text("prompt,answer\nq,1,extra\n")
    with pytest.raises(ValueError, match=r"bad.csv: not a readable csv file with a header line"):
        load_dataset("vlm_records", path=tmp_path / "bad.csv")


def test_folder_splits_and_data_files(tmp_path):
    root = tmp_path / "set"
    root.mkdir()
    tr, te = _question_rows(root, 3, "tr"), _question_rows(root, 2, "te")
    (root / "data").mkdir()
    _jsonl(root / "data" / "train-00000-of-00001.jsonl", tr)
    _jsonl(root / "data" / "test-00000-of-00001.jsonl", te)
    for r in tr + te:  # paths relative to the data file's folder
        r["image"] = "../" + r["image"]
    _jsonl(root / "data" / "train-00000-of-00001.jsonl", tr)
    _jsonl(root / "data" / "test-00000-of-00001.jsonl", te)
    (root / "dataset_info.json").write_text("{}")  # metadata beside the data: not a split
    kw = dict(path=root, prompt_key="question")
    assert load_dataset("vlm_records", **kw)["prompt"] == [r["question"] for r in tr]
    assert load_dataset("vlm_records", **kw, split="train")["prompt"] == [r["question"] for r in tr]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the data has an evaluation split: no warning
        assert load_dataset("vlm_records", **kw, split="eval")["prompt"] == [r["question"] for r in te]
    with pytest.raises(ValueError, match=r"set has no split 'validaton' \(its splits: test, train\)"):
        load_dataset("vlm_records", **kw, split="validaton")
    # data_files per split, relative to path=<folder>
    files = {"train": "data/train-*.jsonl", "eval": ["data/test-00000-of-00001.jsonl"]}
    d = load_dataset("vlm_records", path=root, data_files=files, prompt_key="question", split="eval")
    assert d["prompt"] == [r["question"] for r in te]
    d = load_dataset("vlm_records", data_files=str(root / "data" / "test-*.jsonl"), prompt_key="question")
    assert d["prompt"] == [r["question"] for r in te]  # a list of files is the "train" split
    with pytest.raises(FileNotFoundError, match="no file matches .*nothing-\\*.jsonl"):
        load_dataset("vlm_records", path=root, data_files={"train": "nothing-*.jsonl"})


def test_not_found_paths_are_not_sent_to_the_hub(tmp_path, vr):
    for missing in (tmp_path / "nope.jsonl", "./data/train", "~/no/such/folder", "data.parquet"):
        with pytest.raises(FileNotFoundError, match="VLM record file not found"):
            load_dataset("vlm_records", path=str(missing))
    try:
        vr._hf_datasets()
    except ImportError:  # without Hugging Face datasets a hub id says what it needs (with it, it would download)
        with pytest.raises(
            ImportError,
            match="'mydata' is not a local file or folder; read as a Hugging Face "
            "dataset id it needs pip install datasets",
        ):
            load_dataset("vlm_records", path="mydata")
    with pytest.raises(ValueError, match="vlm_records needs path="):
        load_dataset("vlm_records")
    f = _jsonl(tmp_path / "d.jsonl", [{"prompt": "q", "answer": 1}])
    with pytest.raises(ValueError, match="subset='x' names a configuration of a hub dataset"):
        load_dataset("vlm_records", path=f, subset="x")


# ---------------------------------------------------------------------------------------------
# A single file has no evaluation split
# ---------------------------------------------------------------------------------------------


def test_single_jsonl_without_eval_split_evaluates_on_its_rows_with_a_warning(tmp_path):
    f = _jsonl(tmp_path / "data.jsonl", _question_rows(tmp_path, 5))
    train = load_dataset("vlm_records", path=f, prompt_key="question", split="train")
    with pytest.warns(UserWarning) as rec:
        ev = load_dataset("vlm_records", path=f, prompt_key="question", split="eval")
    msg = str(rec[0].message)
    assert "has no evaluation split, so evaluation (split 'eval') uses its training rows" in msg
    assert "eval_fraction" in msg and "data_files: {train: ..., eval: ...}" in msg
    assert ev["prompt"] == train["prompt"] and len(ev["prompt"]) == 5


def test_eval_fraction_holds_out_a_fixed_complement(tmp_path):
    f = _jsonl(tmp_path / "data.jsonl", _question_rows(tmp_path, 10))
    kw = dict(path=f, prompt_key="question", eval_fraction=0.3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # held out on purpose: no warning
        ev = load_dataset("vlm_records", **kw, split="eval")["prompt"]
    train = load_dataset("vlm_records", **kw, split="train")["prompt"]
    assert len(ev) == 3 and len(train) == 7 and not set(ev) & set(train)
    assert load_dataset("vlm_records", **kw)["prompt"] == train  # split None (the warm start) = train
    shuffled = load_dataset("vlm_records", **kw, split="train", shuffle=True, seed=5)["prompt"]
    assert sorted(shuffled) == sorted(train)  # the seed shuffles; it does not move rows across the split
    assert load_dataset("vlm_records", **kw, split="eval", seed=9)["prompt"] == ev
    with pytest.raises(ValueError, match=r"eval_fraction must be in \[0, 1\)"):
        load_dataset("vlm_records", path=f, prompt_key="question", eval_fraction=1.0)
    both = tmp_path / "both"
    both.mkdir()
    _jsonl(both / "train.jsonl", [{"prompt": "a", "answer": 1}, {"prompt": "b", "answer": 2}])
    _jsonl(both / "test.jsonl", [{"prompt": "c", "answer": 3}])
    with pytest.raises(ValueError, match="has its own evaluation split 'test'; drop eval_fraction"):
        load_dataset("vlm_records", path=both, eval_fraction=0.5)


def test_split_column_of_a_single_file(tmp_path):
    rows = [{"prompt": f"q{i}", "answer": i, "split": s} for i, s in enumerate(["train", "test", "train", None])]
    f = _jsonl(tmp_path / "d.jsonl", rows)
    assert load_dataset("vlm_records", path=f)["prompt"] == ["q0", "q2", "q3"]  # no split value: train
    assert load_dataset("vlm_records", path=f, split="eval")["prompt"] == ["q1"]  # eval -> "test"
    assert load_dataset("vlm_records", path=f, split="test")["meta"] == [{"answer": 1, "split": "test"}]


# ---------------------------------------------------------------------------------------------
# Arguments, and the question simulator on user data
# ---------------------------------------------------------------------------------------------


def test_unknown_argument_fails_naming_the_valid_ones(tmp_path):
    f = _jsonl(tmp_path / "d.jsonl", [{"question": "q", "answer": 1}])
    with pytest.raises(ConfigError) as exc:
        load_dataset("vlm_records", path=f, question_key="question")
    msg = str(exc.value)
    assert msg.startswith("dataset 'vlm_records' has no argument 'question_key'. Valid: ")
    for name in ("prompt_key", "answer_key", "image_key", "data_files", "split", "eval_fraction"):
        assert name in msg
    assert "\n" not in msg


def test_qa_simulator_on_a_user_jsonl(tmp_path):
    from simulators.qa import QASim

    f = _jsonl(tmp_path / "data.jsonl", _question_rows(tmp_path, 4))
    kwargs = {"path": str(f), "prompt_key": "question"}
    sim = QASim(num_envs=4, dataset="vlm_records", dataset_kwargs=kwargs)
    obs = sim.reset(seed=[0, 1, 2, 3])
    assert sorted(obs.instruction) == [f"How many? q{i}" for i in range(4)]
    for text, meta in zip(obs.instruction, obs.meta):
        i = int(text[-1])
        assert meta == {"id": f"q{i}", "answer": str(i), "difficulty": i % 2, "choices": ["A", "B"]}
    assert obs.images[0][0].shape == (12, 16, 3)
    with pytest.warns(UserWarning, match="no evaluation split"):  # QASim's eval split: never an error
        ev = QASim(num_envs=2, dataset="vlm_records", dataset_kwargs=kwargs, **QASim.eval_kwargs)
    assert len(ev.prompts) == 4
    with pytest.raises(ConfigError, match="dataset 'vlm_records' has no argument 'promt_key'.*prompt_key"):
        QASim(num_envs=2, dataset="vlm_records", dataset_kwargs={"path": str(f), "promt_key": "question"})


@pytest.mark.slow
def test_vlm_quickstart_trains_on_a_user_jsonl_with_a_question_column(tmp_path):
    pytest.importorskip("transformers")
    from mmrl.experiment import build_trainer, load_experiment

    rows = []
    for i in range(16):
        (tmp_path / f"{i}.png").write_bytes(_png(_image(32, 32, i)))
        rows.append(
            {"question": "How many shapes are there?", "image": f"{i}.png", "answer": str(i % 4), "source": "mine"}
        )
    f = _jsonl(tmp_path / "mine.jsonl", rows)
    data = f"{{path: {f}, prompt_key: question}}"
    overrides = [
        f"run.output_dir={tmp_path}",
        "run.name=mine",
        "sim.num_envs=8",
        "sim.eval_num_envs=8",
        "algorithm.group_size=4",
        "algorithm.minibatch_size=8",
        "sim.kwargs.dataset=vlm_records",
        f"sim.kwargs.dataset_kwargs={data}",
        "warm_start.dataset=vlm_records",
        f"warm_start.kwargs={data}",
        "warm_start.num_episodes=8",
        "warm_start.steps=2",
        "warm_start.batch_size=4",
        "trainer.eval_episodes=8",
        "trainer.checkpoint_every=1",
        "trainer.iterations=1",
    ]
    with pytest.raises(ConfigError, match="warm_start.*has no argument 'promt_key'"):  # before any work
        load_experiment(
            "configs/vlm_quickstart.yaml", [*overrides, f"warm_start.kwargs={{path: {f}, promt_key: question}}"]
        )
    with pytest.warns(UserWarning, match="no evaluation split"):
        results = build_trainer(load_experiment("configs/vlm_quickstart.yaml", overrides)).run()
    assert results["final"]["iteration"] == 1 and results["final"]["episodes"] == 8
    rows = [json.loads(x) for x in (tmp_path / "mine" / "metrics.jsonl").read_text().splitlines()]
    assert any("train/policy_loss" in r for r in rows)
