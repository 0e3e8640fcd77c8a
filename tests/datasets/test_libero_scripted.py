"""Scripted LIBERO demos (`datasets/libero_demos/scripted.py`): BDDL goal parsing on the real
libero_spatial files, the controller's phase math, the HDF5 writer read back by `builder.py`, and
(slow, real scenes, skipped with a reason without the assets) generation verified through the
adapter, a corrupted demo rejected, and the written records equal to what `LiberoSim` observes."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("libero", reason="libero is not installed (pip install 'mmrl[libero]')")
h5py = pytest.importorskip("h5py", reason="h5py is not installed (pip install h5py)")

from simulators import libero as L  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[2]
SUITE = "libero_spatial"
PX = 32  # rendering cost does not depend on the size; small files
ASSETS_REASON = "LIBERO scene assets not present (bash scripts/setup_libero_assets.sh, or set MMRL_LIBERO_ASSETS)"


def _load(name: str, rel: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / rel)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


S = _load("libero_demos_scripted", "datasets/libero_demos/scripted.py")
B = _load("libero_demos_builder", "datasets/libero_demos/builder.py")


# ---------------------------------------------------------------------------------- goals
def test_goal_of_every_libero_spatial_task():
    tasks = L.list_tasks(SUITE)
    assert len(tasks) == 10
    for t in tasks:  # every spatial task: the described black bowl (akita_black_bowl_1) onto the plate
        assert S.task_goal(t) == S.PickPlace("akita_black_bowl_1", "plate_1"), t.name
        assert "black bowl" in t.language and "plate" in t.language


BDDL = """(define (problem P) ; a comment (On x y)
  (:objects bowl_1 bowl_2 - bowl
    plate_1 - plate)
  (:fixtures table_1 - table)
  (:goal {goal}))"""


@pytest.mark.parametrize(
    "goal, expected",
    [
        ("(And (On bowl_2 plate_1))", ("bowl_2", "plate_1")),
        ("(on bowl_1 plate_1)", ("bowl_1", "plate_1")),  # no And, lower case
    ],
)
def test_goal_parsing_by_hand(goal, expected):
    assert S.pick_place_goal(BDDL.format(goal=goal)) == S.PickPlace(*expected)


@pytest.mark.parametrize(
    "goal",
    [
        "(And (On bowl_1 plate_1) (On bowl_2 plate_1))",  # two predicates
        "(And (In bowl_1 plate_1))",  # not On
        "(And (On bowl_1 table_1_plate_region))",  # a region target, not an object
        "(And (Open table_1))",
    ],
)
def test_unsupported_goals_name_the_task_and_what_is_supported(goal):
    with pytest.raises(S.UnsupportedTaskError) as e:
        S.pick_place_goal(BDDL.format(goal=goal), "suite task 7 (my_task)")
    msg = str(e.value)
    assert "my_task" in msg and "supported" in msg and "(On <object> <target>)" in msg and "\n" not in msg


def test_cli_unsupported_task_is_one_error_line(tmp_path, capsys):
    """libero_goal task 0 (open a drawer) is refused before any scene runs: one line on stderr."""
    code = S.main(
        ["--suite", "libero_goal", "--tasks", "0", "--episodes", "1", "--out", str(tmp_path), "--no-progress"]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("error: ")
    if L.assets_expected():
        assert "open_the_middle_drawer_of_the_cabinet" in err and "(Open wooden_cabinet_1_middle_region)" in err
    else:
        assert "LIBERO scene assets not found" in err
    assert not any(tmp_path.iterdir())


def test_cli_missing_assets_is_one_error_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(L.ASSETS_ENV, str(tmp_path / "empty"))
    code = S.main(["--tasks", "0", "--episodes", "1", "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "LIBERO scene assets not found" in err
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------- controller math
def test_phase_math_by_hand():
    p = S.ControllerParams(grasp_offset=(0.0, 0.05), grasp_height=0.015, hover=0.1, place_height=0.05, gain=30.0)
    obj, target, eef = np.array([0.1, -0.2, 0.9]), np.array([-0.1, 0.2, 0.9]), np.array([0.0, 0.0, 1.2])
    np.testing.assert_allclose(S.grasp_point(obj, p), [0.1, -0.15, 0.915])
    goal, grip = S.phase_goal("approach", eef, obj, target, {}, p)
    np.testing.assert_allclose(goal, [0.1, -0.15, 1.015])
    assert grip == S.GRIPPER_OPEN
    memo = {"grasp": np.array([0.1, -0.15, 0.915]), "carry_z": 1.1}
    goal, grip = S.phase_goal("lift", eef, obj, target, memo, p)
    np.testing.assert_allclose(goal, [0.1, -0.15, 1.1])
    assert grip == S.GRIPPER_CLOSE
    # carrying is closed loop on the object: the eef moves by the object's error to the target
    held = np.array([0.05, 0.0, 1.0])
    goal, _ = S.phase_goal("carry", eef, held, target, memo, p)
    np.testing.assert_allclose(goal, [0.0 - 0.15, 0.0 + 0.2, 1.1])
    goal, _ = S.phase_goal("lower", eef, held, target, memo, p)
    np.testing.assert_allclose(goal, [-0.15, 0.2, 1.2 + (0.9 + 0.05 - 1.0)])
    # clipped proportional deltas
    np.testing.assert_allclose(S.position_action([0, 0, 0], [0.01, -0.1, 0.0], 30.0), [0.3, -1.0, 0.0])
    # timed and reached phases
    assert S.next_phase("approach", 3, 0.004, p) == "descend"
    assert S.next_phase("approach", 3, 0.007, p) == "approach"  # tighter above the object ...
    assert S.next_phase("descend", 3, 0.007, p) == "grasp"  # ... than elsewhere
    assert S.next_phase("approach", dict(p.phase_steps)["approach"], 0.05, p) == "descend"  # gives up waiting
    assert S.next_phase("descend", 5, 0.05, p, stalled=True) == "grasp"  # blocked: stop pushing
    assert S.next_phase("grasp", p.close_steps - 1, 0.0, p) == "grasp"
    assert S.next_phase("grasp", p.close_steps, 1.0, p) == "lift"
    assert S.next_phase("retreat", 500, 0.0, p) == "retreat"
    # a lost grasp: the object is `slip` further from the eef than when the gripper closed
    assert not S.grasp_lost([0, 0, 1.0], [0, 0.03, 0.99], 0.035, p)
    assert S.grasp_lost([0, 0, 1.1], [0, 0.03, 0.99], 0.035, p)


def test_task_params():
    tasks = L.list_tasks(SUITE)
    assert S.task_params(tasks[4]).grasp_offset == (0.045, 0.0)  # the drawer task grasps the rim at +x
    assert S.task_params(tasks[0]) == S.ControllerParams()
    mine = S.ControllerParams(lift=0.1)
    assert S.task_params(tasks[4], mine) is mine


# ---------------------------------------------------------------------------------- writer
def _fake_demo(index: int, n: int, px: int = 8) -> S.Demo:
    rng = np.random.default_rng(index)
    return S.Demo(
        index,
        rng.uniform(-1, 1, (n, 7)),
        rng.integers(0, 256, (n, 2, px, px, 3), dtype=np.uint8),
        rng.normal(size=(n, 8)).astype(np.float32),
        rng.normal(size=(n, 92)),
        rng.normal(size=(n, 7)),
        rng.normal(size=92),
    )


def test_writer_layout_merge_and_builder(tmp_path):
    task = L.list_tasks(SUITE)[2]
    path = S.task_path(tmp_path, task)
    d3, d7 = _fake_demo(3, 5), _fake_demo(7, 4)
    S.write_task_file(path, task, [d7], {"type": 1})
    S.write_task_file(path, task, [d3], {"type": 1})  # merged with the demo already there
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary file left
    with h5py.File(path, "r") as f:
        data = f["data"]
        assert sorted(data.keys()) == ["demo_3", "demo_7"]
        assert data.attrs["macros_image_convention"] == "opengl"
        assert json.loads(data.attrs["problem_info"])["language_instruction"] == task.language
        assert data.attrs["num_demos"] == 2 and data.attrs["total"] == 9
        assert set(data["demo_3/obs"].keys()) >= {"agentview_rgb", "eye_in_hand_rgb", "ee_states", "gripper_states"}
        np.testing.assert_array_equal(data["demo_3/obs/eye_in_hand_rgb"][()], d3.images[:, 1])
    other = L.list_tasks(SUITE)[3]
    S.write_task_file(S.task_path(tmp_path, other), other, [_fake_demo(0, 2)], {"type": 1})
    out = B.build(None, chunk_size=2, root=tmp_path, task_ids=[2, 3], image_size=8, image_flip="none")
    assert out["task_id"].tolist() == [2] * 9 + [3] * 2  # tasks in the order asked, each its own file
    assert out["demo"].tolist() == [3] * 5 + [7] * 4 + [0] * 2
    assert out["step"].tolist() == [*range(5), *range(4), *range(2)]
    torch.testing.assert_close(out["state"][:5], torch.from_numpy(d3.states), rtol=0, atol=0)
    torch.testing.assert_close(out["actions"][:5, 0], torch.from_numpy(d3.actions).float(), rtol=0, atol=0)
    assert torch.equal(out["image"][5:9], torch.from_numpy(d7.images))


def test_writer_is_atomic(tmp_path):
    task = L.list_tasks(SUITE)[2]
    path = S.task_path(tmp_path, task)
    S.write_task_file(path, task, [_fake_demo(1, 3)], {})
    before = path.read_bytes()
    bad = _fake_demo(2, 3)
    bad.images = bad.images[:, :1]  # one camera only: fails mid-write
    with pytest.raises(IndexError):  # the second camera's images
        S.write_task_file(path, task, [bad], {})
    assert path.read_bytes() == before and sorted(p.name for p in path.parent.iterdir()) == [path.name]


# ---------------------------------------------------------------------------------- real scenes
@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """One scripted demo of libero_spatial task 0 (init state 0), through `generate` (one task: a task takes
    about 90 s here; several tasks in one build are tested on written files, `test_writer_layout_merge_and_builder`)."""
    root = tmp_path_factory.mktemp("scripted")
    stats = S.generate(SUITE, [0], 1, root, image_size=PX, progress=False)
    return root, stats


@pytest.mark.slow
@pytest.mark.skipif(not L.assets_expected(), reason=ASSETS_REASON)
def test_generated_demos_replay_in_the_adapter_and_build(generated):
    root, stats = generated
    s = stats[0]
    assert (s["attempted"], s["controller_success"], s["verified"]) == (1, 1, 1), s
    assert s["replay_step_mismatch"] == 0 and s["max_state_diff"] == 0.0, s  # deterministic replay
    out = B.build(None, chunk_size=1, root=root, task_ids=[0], image_size=PX, image_flip="none")
    assert out["task_id"].unique().tolist() == [0] and out["demo"].unique().tolist() == [0]
    rows = out["task_id"] == 0
    assert int(rows.sum()) == stats[0]["steps"][0]
    with h5py.File(S.task_path(root, L.list_tasks(SUITE)[0]), "r") as f:
        actions = f["data/demo_0/actions"][()]
        assert f["data"].attrs["macros_image_convention"] == "opengl"
    np.testing.assert_array_equal(out["actions"][rows, 0].numpy(), actions.astype(np.float32))
    # independent replay through the adapter: the records are what LiberoSim observes before each action
    sim = S.make_replay_sim(SUITE, 0, PX)
    try:
        obs = sim.reset(0)
        images, states = out["image"][rows], out["state"][rows]
        for t, a in enumerate(actions):
            assert torch.equal(states[t], obs.state[0]), t
            assert torch.equal(images[t], obs.image[0]), t  # raw OpenGL frames, both cameras
            res = sim.step(torch.from_numpy(a)[None])
            assert bool(res.success[0]) == (t == len(actions) - 1), t  # success exactly at the last step
            obs = res.obs
    finally:
        sim.close()


@pytest.mark.slow
@pytest.mark.skipif(not L.assets_expected(), reason=ASSETS_REASON)
def test_corrupted_demo_fails_verification_and_is_not_written(tmp_path, monkeypatch):
    real = S.run_controller

    def flipped_gripper(*args, **kwargs):
        ep = real(*args, **kwargs)
        assert ep.success  # the controller itself succeeds ...
        ep.actions = ep.actions.copy()
        ep.actions[:, 6] *= -1  # ... but the demo handed to verification never closes on the bowl
        return ep

    monkeypatch.setattr(S, "run_controller", flipped_gripper)
    stats = S.generate(SUITE, [0], 1, tmp_path, image_size=PX, progress=False)
    assert (stats[0]["controller_success"], stats[0]["verified"], stats[0]["file"]) == (1, 0, None)
    assert not (tmp_path / SUITE).exists()
