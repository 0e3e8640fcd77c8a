"""LIBERO's evaluation protocol and multi-task training, driven through the real adapter with the
numpy stand-in env of ``test_libero.py`` (no scene assets needed): the published protocol values,
evaluation walking every shipped init state in order after the settle steps, tasks and init states
picked per env from the reset seed (GRPO groups share both), per-suite time limits, the scene
rebuilt when an env changes task, state snapshots across a task change, and success per task in the
trainer's logs and evaluation."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pytest
import torch

try:
    import libero  # noqa: F401
except ImportError:
    pytest.skip("libero is not installed (pip install 'mmrl[libero]')", allow_module_level=True)

from simulators import libero as L

FAKE_FILE = Path(__file__).with_name("test_libero.py")
FAKE = f"{FAKE_FILE}:FakeLiberoEnv"
STEP_TIME = 0.05  # FakeLiberoEnv advances its clock (flat state [0]) by this per step


def _marker(bddl) -> int:
    import zlib

    return zlib.crc32(Path(bddl).name.encode()) % 251 + 1  # what FakeLiberoEnv paints at raw pixel (0, 1)


@pytest.fixture
def libero_cfg(tmp_path, monkeypatch):
    monkeypatch.setenv("LIBERO_CONFIG_PATH", str(tmp_path / "cfg"))
    return tmp_path / "cfg"


def _flat_states(sim) -> list[np.ndarray]:
    return [s["sim"] for s in sim.get_state()["sim"]]


# ---------------------------------------------------------------------------------- the protocol
#: LIBERO's evaluation as the published LIBERO results run it (OpenVLA's run_libero_eval.py,
#: OpenVLA-OFT, openpi's examples/libero/main.py): if mmrl's constants drift from these, its
#: numbers stop being comparable with theirs
PUBLISHED = {
    "max_steps": {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300, "libero_10": 520, "libero_90": 400},
    "num_steps_wait": 10,
    "dummy_action": [0.0] * 6 + [-1.0],
    "num_trials_per_task": 50,
    "resolution": 256,
    "cameras": ("agentview", "robot0_eye_in_hand"),
    "flip": "rot180",  # img[::-1, ::-1] of both cameras
}


def test_protocol_constants_match_the_published_evaluation():
    p = L.PROTOCOL
    assert L.MAX_EPISODE_STEPS == PUBLISHED["max_steps"] and p["max_episode_steps"] == PUBLISHED["max_steps"]
    assert p["num_noop_steps"] == PUBLISHED["num_steps_wait"]
    assert list(p["noop_action"]) == PUBLISHED["dummy_action"] == list(L.NOOP_ACTION)
    assert p["trials_per_task"] == PUBLISHED["num_trials_per_task"] and p["split"] == "all"
    assert p["render_resolution"] == PUBLISHED["resolution"]
    assert tuple(p["camera_names"]) == PUBLISHED["cameras"] and p["image_flip"] == PUBLISHED["flip"]
    # the simulator's defaults are the protocol's (a config that sets nothing evaluates like the papers)
    d = {k: v.default for k, v in inspect.signature(L.LiberoSim).parameters.items()}
    assert d["num_noop_steps"] == p["num_noop_steps"] and tuple(d["camera_names"]) == p["camera_names"]
    assert d["image_flip"] == p["image_flip"] and d["max_episode_steps"] is None  # -> the suite's limit
    img = np.arange(2 * 3).reshape(2, 3, 1).repeat(3, -1).astype(np.uint8)
    assert np.array_equal(L.flip_image(img, p["image_flip"]), img[::-1, ::-1])
    with pytest.raises(ValueError, match="multiple of 50"):
        L.protocol_overrides(eval_seed=1_000_000_001)


def test_protocol_eval_walks_every_init_state_after_the_settle_steps(libero_cfg):
    """`protocol_overrides`: every task of the suite, 50 trials, trial e from init state e, 10 no-op
    steps before the first observation, the suite's step limit, truncation exactly there."""
    from mmrl.experiment import build_sim, eval_tasks, load_experiment

    over = ["sim.type=libero", f"sim.kwargs={{env_factory: '{FAKE}', image_size: 8}}", *L.protocol_overrides()]
    cfg = load_experiment(None, over)
    assert eval_tasks(cfg) == list(range(10)) and cfg.trainer.eval_episodes == 50
    sim = build_sim(cfg, 5, 0, evaluation=True, task=2)
    try:
        assert sim.split == "all" and sim.pool.indices.tolist() == list(range(50))
        assert sim.max_episode_steps == 220 and sim.num_noop_steps == 10
        shipped = L.load_init_states("libero_spatial", 2)
        seed = cfg.trainer.eval_seed
        for start in range(0, 50, 5):  # evaluate_policy's batches: episode e resets with seed + e
            sim.reset([seed + start + i for i in range(5)])
            for i, flat in enumerate(_flat_states(sim)):
                assert np.array_equal(flat[4:], shipped[start + i][4:])  # trial e = init state e
                assert flat[0] == pytest.approx(shipped[start + i][0] + 10 * STEP_TIME)  # 10 settle steps
        close = torch.zeros(5, 224, 7)
        close[..., 6] = 1.0  # (the stand-in drifts to success along +x while its gripper is open)
        res = sim.step_chunk(close[:, :219])
        assert not res.done.any()
        res = sim.step_chunk(close[:, 219:])
        assert res.truncated.all() and res.info["num_steps"].tolist() == [1] * 5  # step 220 ends it
    finally:
        sim.close()
    train = build_sim(cfg, 1, 0, task=2)  # training keeps its own pool
    try:
        assert train.split == "train" and len(train.pool) == 40
    finally:
        train.close()


def test_unknown_eval_kwarg_is_named(libero_cfg):
    from mmrl.config import ConfigError
    from mmrl.experiment import load_experiment

    with pytest.raises(ConfigError, match="'eval_kwargs.splt' is not an argument of simulator 'libero'"):
        load_experiment(None, ["sim.type=libero", "sim.eval_kwargs={splt: all}"])


# ---------------------------------------------------------------------------------- multi-task
def test_pick_task_and_state():
    assert L.pick_task_and_state(57, [50]) == (0, 7)  # one task: seed % K, as before
    assert [L.pick_task_and_state(s, [50] * 10) for s in (0, 3, 13, 99)] == [(0, 0), (3, 0), (3, 1), (9, 9)]
    picks = [L.pick_task_and_state(s, [40] * 10) for s in range(1000, 1400)]
    assert sorted(picks) == [(t, p) for t in range(10) for p in range(40)]  # 400 seeds: each pair once
    assert L.pick_task_and_state(5, [3, 7]) == (1, 2)


def test_resolve_tasks(libero_cfg):
    spatial = L.resolve_tasks("libero_spatial", "all")
    assert [t.task_id for t in spatial] == list(range(10)) and {t.suite for t in spatial} == {"libero_spatial"}
    two = L.resolve_tasks(["libero_spatial", "libero_object"], "all")
    assert len(two) == 20 and L.task_label(two[10]) == "libero_object/0"
    assert [t.task_id for t in L.resolve_tasks("libero_spatial", [5, 2])] == [5, 2]
    mixed = L.resolve_tasks(["libero_spatial", "libero_object"], ["libero_object/3", "libero_spatial/1"])
    assert [L.task_label(t) for t in mixed] == ["libero_object/3", "libero_spatial/1"]
    with pytest.raises(ValueError, match="ambiguous"):
        L.resolve_tasks(["libero_spatial", "libero_object"], [1])
    with pytest.raises(ValueError, match="distinct"):
        L.resolve_tasks("libero_spatial", [1, 1])
    with pytest.raises(ValueError, match="unknown LIBERO suite"):
        L.resolve_tasks("libero_spatail", "all")
    with pytest.raises(ValueError, match="out of range"):
        L.resolve_tasks("libero_spatial", [10])
    assert L.LiberoSim.suite_tasks(suite=["libero_spatial", "libero_goal"])[10] == "libero_goal/0"


def test_multi_task_resets_pick_task_and_state_per_env(libero_cfg):
    tasks = L.list_tasks("libero_spatial")
    sim = L.LiberoSim(
        num_envs=4,
        task_id="all",
        image_size=8,
        image_flip="none",
        max_episode_steps=6,
        num_noop_steps=0,
        env_factory=FAKE,
    )
    try:
        assert sim.task is None and sim.instruction is None and len(sim.pools) == 10
        assert sim.task_id == [f"libero_spatial/{i}" for i in range(10)]
        obs = sim.reset([0, 0, 3, 13])  # (task, position): (0, 0) twice, (3, 0), (3, 1)
        assert obs.instruction == [tasks[0].language] * 2 + [tasks[3].language] * 2
        assert [m["task"] for m in obs.meta] == ["libero_spatial/0"] * 2 + ["libero_spatial/3"] * 2
        want = [_marker(tasks[t].bddl_file) for t in (0, 0, 3, 3)]
        assert obs.image[:, 0, 0, 1, 0].tolist() == want  # each worker built its task's scene
        for flat, (t, p) in zip(_flat_states(sim), [(0, 0), (0, 0), (3, 0), (3, 1)]):
            assert np.array_equal(flat, sim.pools[t].states[p])
        for t, pool in enumerate(sim.pools):  # the train pools of every task, disjoint from evaluation's
            held_out = L.init_state_pool("libero_spatial", t, "eval").indices
            assert len(pool) == 40 and not set(pool.indices) & set(held_out)
        snap = sim.get_state()
        # episodes end at the 6-step limit: auto resets draw new tasks; labels, text and scenes agree
        seen = set()
        for _ in range(6):
            res = sim.step_chunk(torch.zeros(4, 6, 7))
            assert res.truncated.all()
            for i, m in enumerate(res.obs.meta):
                t = int(m["task"].split("/")[1])
                seen.add(t)
                assert res.obs.instruction[i] == tasks[t].language
                assert res.obs.image[i, 0, 0, 1, 0] == _marker(tasks[t].bddl_file)
        assert len(seen) >= 5  # auto resets sample tasks, not only the ones reset explicitly
        sim.set_state(snap)  # back across task changes: the snapshot's scenes are rebuilt
        back = sim._observation()
        assert back.instruction == obs.instruction and torch.equal(back.image, obs.image)
        assert torch.equal(back.state, obs.state)
    finally:
        sim.close()


def test_grpo_groups_share_task_and_init_state(libero_cfg):
    from mmrl.rollout import episode_seeds

    sim = L.LiberoSim(num_envs=8, task_id="all", image_size=8, num_noop_steps=0, env_factory=FAKE)
    try:
        seeds = episode_seeds(40, 8, group_size=4)  # two groups of four
        obs = sim.reset(seeds)
        labels = [m["task"] for m in obs.meta]
        assert len(set(labels[:4])) == 1 and len(set(labels[4:])) == 1 and labels[0] != labels[4]
        flat = _flat_states(sim)
        assert all(np.array_equal(flat[0], f) for f in flat[:4]) and all(np.array_equal(flat[4], f) for f in flat[4:])
    finally:
        sim.close()


def test_each_task_keeps_its_suite_step_limit(libero_cfg):
    sim = L.LiberoSim(
        num_envs=2,
        suite=["libero_spatial", "libero_object"],
        task_id=["libero_spatial/0", "libero_object/0"],
        image_size=8,
        num_noop_steps=0,
        env_factory=FAKE,
    )
    try:
        assert sim.max_episode_steps == 280  # the longest bounds a rollout
        sim.reset([0, 1])
        res = sim.step_chunk(torch.zeros(2, 150, 7))
        assert not res.done.any()
        res = sim.step_chunk(torch.zeros(2, 100, 7))
        assert res.truncated.tolist() == [True, False]  # libero_spatial's 220: 70 of the 100 steps ran
        assert res.info["num_steps"].tolist() == [70, 100]
        res = sim.step_chunk(torch.zeros(2, 50, 7))
        assert res.truncated.tolist()[1] and res.info["num_steps"].tolist()[1] == 30  # libero_object's 280
    finally:
        sim.close()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["collocated", "disaggregated"])
def test_trainer_logs_success_per_task(libero_cfg, tmp_path, mode):
    """A multi-task run (in this process, or through a sim worker): train metrics hold success per
    task and per suite, evaluation reports and logs success per task, and `mmrl eval` of a
    multi-suite config reports success per suite."""
    import yaml

    from mmrl.cli import main

    cfg = {
        "run": {"output_dir": str(tmp_path), "name": "mt"},
        "sim": {
            "type": "libero",
            "num_envs": 4,
            "eval_num_envs": 4,
            "kwargs": {
                "env_factory": FAKE,
                "image_size": 16,
                "max_episode_steps": 4,
                "num_noop_steps": 0,
                "suite": ["libero_spatial", "libero_object"],
                "task_id": ["libero_spatial/1", "libero_object/2"],
            },
        },
        "policy": {"type": "flow_vla", "dim": 16, "expert_dim": 16, "expert_layers": 1, "image_size": 16},
        "algorithm": {"advantage": "grpo", "group_size": 2},
        "trainer": {"iterations": 1, "eval_episodes": 4, "video_episodes": 0, "eval_every": 1},
        "warm_start": {"dataset": None},
        "placement": {"mode": mode},
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", str(tmp_path / "c.yaml")]) == 0
    rows = [json.loads(x) for x in (tmp_path / "mt" / "metrics.jsonl").read_text().splitlines()]
    keys = set().union(*rows)
    for prefix in ("train", "eval"):
        assert {
            f"{prefix}/success/libero_spatial/1",
            f"{prefix}/success/libero_object/2",
            f"{prefix}/success_suite/libero_spatial",
            f"{prefix}/success_suite/libero_object",
        } <= keys
    results = json.loads((tmp_path / "mt" / "results.json").read_text())
    final = results[sorted(results)[-1]]
    assert set(final["tasks"]) == {"libero_spatial/1", "libero_object/2"}
    assert sum(r["episodes"] for r in final["tasks"].values()) == final["episodes"] == 4
    ckpt = sorted((tmp_path / "mt" / "checkpoints").glob("iter_*"))[-1]
    assert (
        main(
            [
                "eval",
                str(tmp_path / "c.yaml"),
                f"checkpoint={ckpt}",
                "sim.eval_tasks=[libero_spatial/1, libero_object/2]",
                "trainer.eval_episodes=2",
            ]
        )
        == 0
    )
    report = json.loads((tmp_path / "mt" / "eval_report.json").read_text())
    assert [r["task"] for r in report["tasks"]] == ["libero_spatial/1", "libero_object/2"]
    assert set(report["suites"]) == {"libero_spatial", "libero_object"}
    assert all(v["episodes"] == 2 for v in report["suites"].values())
