"""`libero_demos`: tiny HDF5 files in the exact layout of LIBERO's official demonstration files
(written by LIBERO's scripts/create_dataset.py), named after the real libero_spatial tasks, checked
record by record against the raw arrays."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("libero", reason="libero is not installed (pip install 'mmrl[libero]')")
h5py = pytest.importorskip("h5py", reason="h5py is not installed (pip install h5py)")

ROOT = Path(__file__).resolve().parents[2]
SUITE = "libero_spatial"
LENGTHS = {0: [7, 9, 6], 1: [8, 10]}  # task id -> demo lengths (T) of its file
PX = 16


def _load_builder():
    spec = importlib.util.spec_from_file_location("libero_demos_builder", ROOT / "datasets/libero_demos/builder.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _demo_arrays(task_id: int, demo: int, n: int) -> dict:
    rng = np.random.default_rng(1000 * task_id + demo)
    actions = rng.uniform(-0.5, 0.5, size=(n, 7))
    actions[:, 6] = np.where(np.arange(n) < n // 2, -1.0, 1.0)  # gripper opens, then closes
    actions[1, 0] = 1.5  # out of range: must be clipped
    return {
        "actions": actions,
        "ee_states": rng.normal(size=(n, 6)),
        "gripper_states": rng.normal(size=(n, 2)) * 0.04,
        "joint_states": rng.normal(size=(n, 7)),
        # random content differs between frames, cameras, demos and tasks, and has no symmetry
        "agentview_rgb": rng.integers(0, 256, size=(n, PX, PX, 3), dtype=np.uint8),
        "eye_in_hand_rgb": rng.integers(0, 256, size=(n, PX, PX, 3), dtype=np.uint8),
    }


def _write_file(path: Path, task, lengths: list[int], convention: str = "opengl") -> None:
    """One task file with the official layout (attributes and keys of LIBERO's create_dataset.py)."""
    with h5py.File(path, "w") as f:
        grp = f.create_group("data")
        grp.attrs["env_name"] = "Libero_Tabletop_Manipulation"
        grp.attrs["problem_info"] = json.dumps(
            {
                "problem_name": "libero_tabletop_manipulation",
                "domain_name": "robosuite",
                "language_instruction": task.language,
            }
        )
        grp.attrs["macros_image_convention"] = convention
        grp.attrs["bddl_file_name"] = str(task.bddl_file)
        grp.attrs["bddl_file_content"] = "(define (problem LIBERO_Tabletop_Manipulation))"
        grp.attrs["env_args"] = json.dumps({"type": 1, "env_name": "Libero_Tabletop_Manipulation"})
        for i, n in enumerate(lengths):
            a = _demo_arrays(task.task_id, i, n)
            ep = grp.create_group(f"demo_{i}")
            obs = ep.create_group("obs")
            obs.create_dataset("gripper_states", data=a["gripper_states"])
            obs.create_dataset("joint_states", data=a["joint_states"])
            obs.create_dataset("ee_states", data=a["ee_states"])
            obs.create_dataset("ee_pos", data=a["ee_states"][:, :3])
            obs.create_dataset("ee_ori", data=a["ee_states"][:, 3:])
            obs.create_dataset("agentview_rgb", data=a["agentview_rgb"])
            obs.create_dataset("eye_in_hand_rgb", data=a["eye_in_hand_rgb"])
            ep.create_dataset("actions", data=a["actions"])
            ep.create_dataset("states", data=np.zeros((n, 47)))
            ep.create_dataset("robot_states", data=np.zeros((n, 9)))
            rewards, dones = np.zeros(n, dtype=np.uint8), np.zeros(n, dtype=np.uint8)
            rewards[-1] = dones[-1] = 1
            ep.create_dataset("rewards", data=rewards)
            ep.create_dataset("dones", data=dones)
            ep.attrs["num_samples"] = n
            ep.attrs["model_file"] = "<mujoco/>"
            ep.attrs["init_state"] = np.zeros(47)
        grp.attrs["num_demos"] = len(lengths)
        grp.attrs["total"] = sum(lengths)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A private LIBERO config, the builder module, the suite's tasks and a root with 2 task files."""
    tmp = tmp_path_factory.mktemp("libero_demos")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LIBERO_CONFIG_PATH", str(tmp / "cfg"))
        mp.delenv("MMRL_LIBERO_DATASETS", raising=False)
        from simulators.libero import list_tasks

        tasks = list_tasks(SUITE)
        root = tmp / "data"
        (root / SUITE).mkdir(parents=True)
        for tid, lengths in LENGTHS.items():
            _write_file(root / SUITE / f"{tasks[tid].name}_demo.hdf5", tasks[tid], lengths)
        yield {"b": _load_builder(), "tasks": tasks, "root": root, "tmp": tmp, "mp": mp}


def test_records_match_the_files_by_hand(env):
    b, tasks = env["b"], env["tasks"]
    d = b.build(None, chunk_size=4, root=env["root"], task_ids=[0, 1], image_size=PX)
    m = sum(sum(v) for v in LENGTHS.values())
    assert d["image"].shape == (m, 2, PX, PX, 3) and d["image"].dtype == torch.uint8
    assert d["state"].shape == (m, 8) and d["state"].dtype == torch.float32
    assert d["actions"].shape == (m, 4, 7) and d["actions"].dtype == torch.float32
    assert len(d["instruction"]) == m
    row, episode = 0, 0
    for tid, lengths in LENGTHS.items():
        for demo, n in enumerate(lengths):
            a = _demo_arrays(tid, demo, n)
            clipped = np.clip(a["actions"], -1, 1)
            for t in range(n):
                assert d["instruction"][row] == tasks[tid].language
                assert (d["task_id"][row], d["demo"][row], d["episode"][row], d["step"][row]) == (tid, demo, episode, t)
                # both cameras, rotated 180 degrees like the simulator's default image_flip
                assert np.array_equal(d["image"][row, 0].numpy(), np.rot90(a["agentview_rgb"][t], 2))
                assert np.array_equal(d["image"][row, 1].numpy(), np.rot90(a["eye_in_hand_rgb"][t], 2))
                want_state = np.concatenate([a["ee_states"][t], a["gripper_states"][t]]).astype(np.float32)
                assert np.array_equal(d["state"][row].numpy(), want_state)
                want = np.stack([clipped[min(t + k, n - 1)] for k in range(4)]).astype(np.float32)
                assert np.array_equal(d["actions"][row].numpy(), want)
                row += 1
            episode += 1
    assert row == m
    assert d["actions"].abs().max() <= 1.0
    meta = d["meta"]
    assert meta["task_ids"] == [0, 1] and meta["bytes_per_record"] == 2 * PX * PX * 3 + 32 + 4 * 7 * 4 + 32
    assert meta["instruction_vocab"] == [tasks[0].language, tasks[1].language]
    assert meta["files"][0]["file_language"] == tasks[0].language
    assert [e["demo"] for e in meta["episodes"]] == ["demo_0", "demo_1", "demo_2", "demo_0", "demo_1"]


def test_end_of_demo_padding_repeats_the_last_action(env):
    d = env["b"].build(None, chunk_size=4, root=env["root"], task_ids=[0], image_size=PX)
    n = LENGTHS[0][0]
    acts = _demo_arrays(0, 0, n)["actions"].astype(np.float32)
    last = d["actions"][n - 1].numpy()
    assert np.array_equal(last, np.repeat(acts[-1:], 4, axis=0))
    assert np.all(last[:, 6] == 1.0)  # a closed gripper stays closed: no zero (half-open) padding
    assert np.array_equal(d["actions"][n - 2].numpy(), acts[[n - 2, n - 1, n - 1, n - 1]])
    assert d["actions"][1, 0, 0] == 1.0  # the 1.5 at step 1 is clipped


def test_flip_modes_and_resize(env):
    b = env["b"]
    a = _demo_arrays(0, 0, LENGTHS[0][0])["agentview_rgb"]
    none = b.build(1, root=env["root"], task_ids=[0], image_size=PX, image_flip="none", seed=3)
    vert = b.build(1, root=env["root"], task_ids=[0], image_size=PX, image_flip="vertical", seed=3)
    demo = int(none["demo"][0])
    raw = _demo_arrays(0, demo, LENGTHS[0][demo])["agentview_rgb"]
    assert np.array_equal(none["image"][0, 0].numpy(), raw[0])
    assert np.array_equal(vert["image"][0, 0].numpy(), raw[0][::-1])
    from mmrl.policies.processing import resize_images
    from simulators.libero import flip_image

    small = b.build(None, root=env["root"], task_ids=[0], image_size=8)
    want = resize_images(torch.from_numpy(flip_image(a[2], "rot180"))[None], 8)[0]
    assert small["image"].shape[2:] == (8, 8, 3)
    assert torch.equal(small["image"][2, 0], want)


def test_opencv_image_convention_is_undone(env, tmp_path):
    """A file saved with robosuite's "opencv" convention holds vertically flipped frames."""
    task = env["tasks"][0]
    (tmp_path / SUITE).mkdir()
    path = tmp_path / SUITE / f"{task.name}_demo.hdf5"
    _write_file(path, task, [5], convention="opencv")
    with h5py.File(path, "r+") as f:  # store the frames as an opencv-convention file would
        for key in ("agentview_rgb", "eye_in_hand_rgb"):
            ds = f["data/demo_0/obs"][key]
            ds[...] = ds[()][:, ::-1]
    d = env["b"].build(None, root=tmp_path, task_ids=[0], image_size=PX)
    raw = _demo_arrays(0, 0, 5)
    assert np.array_equal(d["image"][3, 1].numpy(), np.rot90(raw["eye_in_hand_rgb"][3], 2))
    assert d["meta"]["files"][0]["image_convention"] == "opencv"


def test_demo_choice_is_seeded_and_per_task(env):
    b, root = env["b"], env["root"]

    def chosen(seed, task_ids=(0, 1)):
        d = b.build(2, seed=seed, root=root, task_ids=list(task_ids), image_size=8)
        return [(e["task_id"], e["demo"]) for e in d["meta"]["episodes"]]

    first = chosen(0)
    assert first == chosen(0) and len(first) == 4  # 2 demos of each task, deterministic
    assert [t for t, _ in first] == [0, 0, 1, 1]
    want = [f"demo_{i}" for i in np.sort(np.random.RandomState([0, 0]).permutation(3)[:2])]
    assert [k for t, k in first if t == 0] == want
    assert len({tuple(chosen(s)) for s in range(6)}) > 1  # the seed changes the choice
    assert chosen(0, task_ids=[1]) == first[2:]  # a task's choice ignores the other tasks
    with pytest.warns(UserWarning, match="using all"):
        d = b.build(5, root=root, task_ids=[1], image_size=8)
    assert len(d["meta"]["episodes"]) == 2


def test_task_ids_and_stride(env):
    b = env["b"]
    d = b.build(None, root=env["root"], task_ids=[1], image_size=8, stride=3, chunk_size=2)
    assert set(d["task_id"].tolist()) == {1}
    assert set(d["instruction"]) == {env["tasks"][1].language}
    n0, n1 = LENGTHS[1]
    assert d["step"].tolist() == list(range(0, n0, 3)) + list(range(0, n1, 3))
    acts = np.clip(_demo_arrays(1, 0, n0)["actions"], -1, 1).astype(np.float32)
    assert np.array_equal(d["actions"][1].numpy(), acts[[3, 4]])  # chunks stay consecutive steps
    for bad in ([10], [0, 0], []):
        with pytest.raises(ValueError, match="task_ids"):
            b.build(None, root=env["root"], task_ids=bad)


def test_missing_files_error_names_the_folder_and_the_commands(env, tmp_path):
    b = env["b"]
    nowhere = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError) as e:
        b.build(1, root=nowhere)
    msg = str(e.value)
    assert str(nowhere / SUITE) in msg
    assert "python benchmark_scripts/download_libero_datasets.py --datasets libero_spatial --use-huggingface" in msg
    assert f"--download-dir {nowhere}" in msg
    assert (
        "hf download yifengzhu-hf/LIBERO-datasets --repo-type dataset --include 'libero_spatial/*' "
        f"--local-dir {nowhere}"
    ) in msg
    assert "MMRL_LIBERO_DATASETS" in msg
    with pytest.raises(FileNotFoundError, match="missing from it"):  # folder there, task 2's file is not
        b.build(1, root=env["root"], task_ids=[0, 2])
    with pytest.raises(FileNotFoundError, match="--datasets libero_100"):
        b.build(1, root=nowhere, suite="libero_10")
    # no root: $MMRL_LIBERO_DATASETS, else the 'datasets' entry of LIBERO's config
    with pytest.raises(FileNotFoundError, match="cfg.datasets.libero_spatial"):
        b.build(1)
    env["mp"].setenv("MMRL_LIBERO_DATASETS", str(env["root"]))
    try:
        assert b.build(1, task_ids=[0], image_size=8)["meta"]["root"] == str(env["root"].resolve())
    finally:
        env["mp"].delenv("MMRL_LIBERO_DATASETS")


def test_load_dataset_by_name_and_cli(env, tmp_path):
    from mmrl.data import load_dataset

    d = load_dataset(
        "libero_demos", num_episodes=1, seed=0, chunk_size=3, root=str(env["root"]), task_ids=[0, 1], image_size=8
    )
    assert d["actions"].shape[1:] == (3, 7) and d["image"].shape[1:] == (2, 8, 8, 3)
    assert d["episode"].max().item() == 1 and d["meta"]["task_ids"] == [0, 1]
    out = tmp_path / "demos.pt"
    env["b"].main(
        ["--root", str(env["root"]), "--task-ids", "0", "--episodes", "1", "--image-size", "8", "--out", str(out)]
    )
    saved = torch.load(out, weights_only=False)
    assert saved["image"].shape[1:] == (2, 8, 8, 3) and saved["meta"]["task_ids"] == [0]
