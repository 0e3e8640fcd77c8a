"""`lerobot_dataset`: small datasets written here with LeRobot's own ``LeRobotDataset.create`` /
``add_frame`` / ``save_episode`` / ``finalize`` (offline, into tmp folders), read back by the builder
through LeRobot's ``LeRobotDataset`` and checked record by record against what was written: images
of both cameras in order, state, action chunks with the last action repeated past an episode's end,
the frame's task as the instruction, episode / step indices, the seeded episode choice, resizing,
video-backed cameras, the one-line errors, a warm start that trains a tiny SmolVLA from it, and the
world model's transitions (one example per frame, the next frame and state as targets).

Runs in the LeRobot venv (``bash scripts/setup_lerobot.sh``); skipped elsewhere.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("lerobot", reason="the LeRobot venv: bash scripts/setup_lerobot.sh")

from mmrl.config import ConfigError
from mmrl.data import builder_module, load_dataset
from mmrl.policies.processing import resize_images
from mmrl.registry import MissingDependencyError

ROOT = Path(__file__).resolve().parents[2]
CAMERAS = ["observation.images.front", "observation.images.wrist"]
H, W, STATE, ACTION = 6, 8, 3, 2  # non-square images: a transposed frame cannot pass
LENGTHS = [5, 3, 6]  # episode 1 is shorter than a chunk: padded from its second frame on
C = 4


def task_of(episode: int, frame: int) -> str:
    """Tasks per frame: episode 2 changes task half-way (LeRobot stores a task per frame)."""
    return ["pick up the red cube", "open the drawer", "push the button" if frame < 3 else "close the drawer"][episode]


def frames_of(episode: int, n: int, h: int = H, w: int = W) -> dict:
    rng = np.random.default_rng(100 + episode)
    return {
        CAMERAS[0]: rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8),
        CAMERAS[1]: rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8),
        "observation.state": rng.normal(size=(n, STATE)).astype(np.float32),
        "action": rng.uniform(-1, 1, size=(n, ACTION)).astype(np.float32),
    }


def write(root: Path, episodes: dict[int, dict], *, video: bool = False, sizes=None) -> Path:
    """A dataset in LeRobot's format, written by LeRobot itself, with these frames per episode."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    sizes = sizes or {cam: (H, W) for cam in CAMERAS}
    dtype = "video" if video else "image"
    features = {
        cam: {"dtype": dtype, "shape": (*sizes[cam], 3), "names": ["height", "width", "channels"]} for cam in CAMERAS
    }
    features["observation.state"] = {"dtype": "float32", "shape": (STATE,), "names": None}
    features["action"] = {"dtype": "float32", "shape": (ACTION,), "names": None}
    if "next.reward" in next(iter(episodes.values())):  # a per-frame reward column, as HIL-SERL records
        features["next.reward"] = {"dtype": "float32", "shape": (1,), "names": None}
    ds = LeRobotDataset.create("mmrl/test_demos", fps=10, features=features, root=root, use_videos=video)
    for e in sorted(episodes):
        arrays = episodes[e]
        for t in range(len(arrays["action"])):
            frame = {key: arrays[key][t] for key in features}
            ds.add_frame({**frame, "task": task_of(e, t)})
        ds.save_episode(parallel_encoding=False)  # no process pool forked from a threaded test
    ds.finalize()
    return root


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, dict]:
    episodes = {e: frames_of(e, n) for e, n in enumerate(LENGTHS)}
    return write(tmp_path_factory.mktemp("lerobot") / "demos", episodes), episodes


def build(**kw) -> dict:
    return builder_module("lerobot_dataset").build(**kw)


def expected_chunks(actions: np.ndarray) -> np.ndarray:
    """By hand: chunk t = actions t..t+C-1, the last action repeated past the end."""
    n = len(actions)
    return np.stack([np.stack([actions[min(t + k, n - 1)] for k in range(C)]) for t in range(n)])


def test_records_are_the_frames_written(written):
    root, episodes = written
    d = build(root=root, chunk_size=C)
    m = sum(LENGTHS)
    assert d["image"].shape == (m, 2, H, W, 3) and d["image"].dtype == torch.uint8
    assert d["state"].shape == (m, STATE) and d["state"].dtype == torch.float32
    assert d["actions"].shape == (m, C, ACTION) and d["actions"].dtype == torch.float32
    assert len(d["instruction"]) == m
    row = 0
    for e, n in enumerate(LENGTHS):
        a = episodes[e]
        for t in range(n):
            for v, cam in enumerate(CAMERAS):  # exact: PNG frames come back as written
                assert torch.equal(d["image"][row, v], torch.from_numpy(a[cam][t])), (e, t, cam)
            assert torch.equal(d["state"][row], torch.from_numpy(a["observation.state"][t]))
            assert torch.equal(d["actions"][row], torch.from_numpy(expected_chunks(a["action"])[t]))
            assert d["instruction"][row] == task_of(e, t)
            assert (d["episode"][row], d["step"][row], d["episode_index"][row]) == (e, t, e)
            row += 1
    # the padding itself, spelt out: the last frame's chunk is its action C times; episode 1 (3
    # frames) pads from its second frame on
    last = d["actions"][LENGTHS[0] - 1]
    assert torch.equal(last, torch.from_numpy(episodes[0]["action"][-1]).expand(C, ACTION))
    ep1 = torch.from_numpy(episodes[1]["action"])
    assert torch.equal(d["actions"][LENGTHS[0] + 1], torch.stack([ep1[1], ep1[2], ep1[2], ep1[2]]))
    tasks = ["pick up the red cube", "open the drawer", "push the button", "close the drawer"]
    pairs = set(zip(d["instruction"], d["task_index"].tolist()))  # LeRobot numbers the tasks: one index each
    assert len(pairs) == len(tasks) == len({i for _, i in pairs})
    assert d["meta"]["cameras"] == CAMERAS and d["meta"]["episodes"] == [0, 1, 2]
    assert d["meta"]["instruction_vocab"] == tasks and d["meta"]["fps"] == 10


def test_camera_choice_and_order(written):
    root, episodes = written
    swapped = build(root=root, image_keys=CAMERAS[::-1], episodes=[0])
    assert swapped["image"].shape == (LENGTHS[0], 2, H, W, 3)
    assert torch.equal(swapped["image"][:, 0], torch.from_numpy(episodes[0][CAMERAS[1]]))
    assert torch.equal(swapped["image"][:, 1], torch.from_numpy(episodes[0][CAMERAS[0]]))
    one = build(root=root, image_keys=CAMERAS[1], episodes=[0])  # one camera: the simulators' [M, H, W, 3]
    assert one["image"].shape == (LENGTHS[0], H, W, 3)
    assert torch.equal(one["image"], torch.from_numpy(episodes[0][CAMERAS[1]]))
    no_state = build(root=root, state_key=None, episodes=[0])
    assert "state" not in no_state and no_state["meta"]["state_key"] is None


def test_resize_is_the_policies_resize(written):
    root, episodes = written
    d = build(root=root, image_size=4, episodes=[2])
    assert d["image"].shape == (LENGTHS[2], 2, 4, 4, 3)
    for v, cam in enumerate(CAMERAS):
        assert torch.equal(d["image"][:, v], resize_images(torch.from_numpy(episodes[2][cam]), 4))


def test_episode_choice_is_seeded_and_deterministic(written):
    root, episodes = written
    builder = builder_module("lerobot_dataset")
    for seed in range(6):
        d = build(root=root, num_episodes=2, seed=seed)
        want = sorted(np.random.RandomState(seed).permutation(3)[:2].tolist())
        assert d["meta"]["episodes"] == want == builder.choose_episodes(range(3), 2, seed)
        assert d["episode_index"].unique().tolist() == want and d["episode"].unique().tolist() == [0, 1]
        assert torch.equal(d["actions"], build(root=root, num_episodes=2, seed=seed)["actions"])
        first = want[0]  # the records are those of the chosen episodes
        assert torch.equal(d["state"][: LENGTHS[first]], torch.from_numpy(episodes[first]["observation.state"]))
    assert len({tuple(build(root=root, num_episodes=1, seed=s)["meta"]["episodes"]) for s in range(6)}) > 1
    # `episodes` is the pool the seeded choice draws from; more than there are takes all of them
    pool = build(root=root, num_episodes=1, seed=3, episodes=[2, 0])
    assert pool["meta"]["episodes"] == [[0, 2][np.random.RandomState(3).permutation(2)[0]]]
    assert build(root=root, num_episodes=9, episodes=[2, 0])["meta"]["episodes"] == [0, 2]


def test_loaded_by_name_with_its_arguments_checked(written):
    root, _ = written
    d = load_dataset("lerobot_dataset", root=str(root), num_episodes=1, seed=0, chunk_size=2)
    assert d["actions"].shape[1:] == (2, ACTION)
    with pytest.raises(ConfigError, match="has no argument 'image_key'.*did you mean 'image_keys'"):
        load_dataset("lerobot_dataset", root=str(root), image_key="front")


def one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg, msg
    return msg


def test_missing_columns_are_one_line_errors_naming_columns_and_argument(written):
    root, _ = written
    columns = "observation.images.front, observation.images.wrist, observation.state, action"
    with pytest.raises(ConfigError) as exc:
        build(root=root, state_key="observation.joints")
    msg = one_line(exc)
    assert "no column 'observation.joints'" in msg and columns in msg and "Fix: state_key" in msg
    with pytest.raises(ConfigError) as exc:
        build(root=root, action_key="actions")
    msg = one_line(exc)
    assert "no column 'actions'" in msg and columns in msg and "Fix: action_key" in msg
    with pytest.raises(ConfigError) as exc:
        build(root=root, image_keys=["observation.images.front", "observation.images.top"])
    msg = one_line(exc)
    assert (
        "'observation.images.top'" in msg
        and "cameras found: observation.images.front, observation.images.wrist" in msg
        and "Fix: image_keys" in msg
    )
    with pytest.raises(ConfigError) as exc:
        build(root=root, image_keys="observation.state")  # a column, but no camera
    assert "Fix: image_keys" in one_line(exc)
    with pytest.raises(ConfigError) as exc:
        build(root=root, episodes=[1, 3])
    assert "[0, 3)" in one_line(exc) and "Fix: episodes" in str(exc.value)


def test_where_the_data_is_errors(written, tmp_path, monkeypatch):
    with pytest.raises(ConfigError) as exc:
        build()
    assert "repo_id" in one_line(exc) and "root" in str(exc.value)
    with pytest.raises(ConfigError) as exc:  # a folder without a dataset: refused, nothing downloaded into it
        build(repo_id="someone/demos", root=tmp_path / "empty")
    assert "no meta/info.json" in one_line(exc) and "Fix: root" in str(exc.value)
    assert not (tmp_path / "empty").exists()
    builder = builder_module("lerobot_dataset")
    real = builder.importlib.util.find_spec
    monkeypatch.setattr(
        builder.importlib.util, "find_spec", lambda name, *a: None if name == "lerobot" else real(name, *a)
    )
    with pytest.raises(MissingDependencyError) as exc:
        build(root=written[0])
    assert "bash scripts/setup_lerobot.sh" in one_line(exc) and ".venv-lerobot/bin/" in str(exc.value)
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "lerobot.datasets.lerobot_dataset", None)  # LeRobot without its dataset extra
    with pytest.raises(MissingDependencyError) as exc:
        build(root=written[0])
    assert "'lerobot[dataset]==0.6.1'" in one_line(exc) and ".venv-lerobot/bin/pip install" in str(exc.value)


def test_cameras_of_different_sizes_need_image_size(tmp_path):
    sizes = {CAMERAS[0]: (6, 8), CAMERAS[1]: (4, 4)}
    rng = np.random.default_rng(0)
    arrays = frames_of(0, 2)
    arrays[CAMERAS[1]] = rng.integers(0, 256, (2, 4, 4, 3), dtype=np.uint8)
    root = write(tmp_path / "mixed", {0: arrays}, sizes=sizes)
    with pytest.raises(ConfigError) as exc:
        build(root=root)
    msg = one_line(exc)
    assert "observation.images.front: 6x8, observation.images.wrist: 4x4" in msg and "Fix: image_size" in msg
    d = build(root=root, image_size=4)
    assert torch.equal(d["image"][:, 1], torch.from_numpy(arrays[CAMERAS[1]]))
    assert torch.equal(d["image"][:, 0], resize_images(torch.from_numpy(arrays[CAMERAS[0]]), 4))


def test_video_cameras(tmp_path):
    """Cameras stored as videos (LeRobot's default; encoded and decoded by PyAV here): lossy, so each
    frame is a flat colour, distinct per episode, frame and camera, found again within a few levels."""
    pytest.importorskip("av", reason="LeRobot's video backend (PyAV) is not installed")
    size = 64

    def colour(e, t, v):
        return np.array([40 + 60 * v, 30 + 40 * t, 50 + 100 * e], dtype=np.uint8)

    episodes = {}
    for e, n in enumerate([3, 2]):
        arrays = frames_of(e, n)
        for v, cam in enumerate(CAMERAS):
            arrays[cam] = np.stack([np.broadcast_to(colour(e, t, v), (size, size, 3)) for t in range(n)]).copy()
        episodes[e] = arrays
    root = write(tmp_path / "video", episodes, video=True, sizes={cam: (size, size) for cam in CAMERAS})
    d = build(root=root, chunk_size=C, image_size=16)
    assert d["image"].shape == (5, 2, 16, 16, 3)
    row = 0
    for e, n in enumerate([3, 2]):
        for t in range(n):
            for v in range(2):
                got = d["image"][row, v].float().mean((0, 1))
                assert (got - torch.from_numpy(colour(e, t, v)).float()).abs().max() < 6, (e, t, v, got)
            assert torch.equal(d["actions"][row], torch.from_numpy(expected_chunks(episodes[e]["action"])[t]))
            assert d["instruction"][row] == task_of(e, t)
            row += 1


@pytest.mark.slow
def test_warm_start_trains_a_tiny_smolvla_from_it(tmp_path):
    """The CPU SmolVLA recipe with ``warm_start.dataset=lerobot_dataset``: the trainer loads the
    LeRobot folder (one camera, as the reach simulator gives) by name and behaviour-clones on it."""
    from mmrl.experiment import build_trainer, load_experiment
    from mmrl.policies.lerobot.policy import demo_stats

    rng = np.random.default_rng(7)
    episodes = {}
    for e, n in enumerate([6, 4]):
        episodes[e] = {
            CAMERAS[0]: rng.integers(0, 256, (n, 40, 48, 3), dtype=np.uint8),
            "observation.state": rng.uniform(-1, 1, (n, 2)).astype(np.float32),
            "action": rng.uniform(-1, 1, (n, 2)).astype(np.float32),
        }
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = {
        CAMERAS[0]: {"dtype": "image", "shape": (40, 48, 3), "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": (2,), "names": None},
        "action": {"dtype": "float32", "shape": (2,), "names": None},
    }
    ds = LeRobotDataset.create("mmrl/reach_demos", fps=10, features=features, root=tmp_path / "reach", use_videos=False)
    for arrays in episodes.values():
        for t in range(len(arrays["action"])):
            ds.add_frame({**{k: arrays[k][t] for k in features}, "task": "reach the red target"})
        ds.save_episode()
    ds.finalize()

    kwargs = f"{{root: {tmp_path / 'reach'}, image_size: 32}}"
    cfg = load_experiment(
        ROOT / "configs/reach_smolvla_flow_noise.yaml",
        [
            f"run.output_dir={tmp_path / 'runs'}",
            "run.threads=1",
            "sim.num_envs=2",
            "sim.eval_num_envs=2",
            "warm_start.dataset=lerobot_dataset",
            f"warm_start.kwargs={kwargs}",
            "warm_start.num_episodes=2",
            "warm_start.steps=3",
            "warm_start.warmup_steps=1",
            "warm_start.batch_size=4",
            "trainer.iterations=0",
            "trainer.eval_episodes=2",
            "trainer.video_episodes=0",
        ],
    )
    trainer = build_trainer(cfg)
    trainer.run()
    metrics = (tmp_path / "runs" / cfg.run.name / "metrics.jsonl").read_text()
    losses = [
        float(line.split('"warm_start/loss": ')[1].split(",")[0].rstrip("}"))
        for line in metrics.splitlines()
        if '"warm_start/loss"' in line
    ]
    assert losses and all(np.isfinite(losses))
    # the statistics the policy normalises with are those of these demonstrations (stats: demos)
    demos = load_dataset(
        "lerobot_dataset", root=str(tmp_path / "reach"), image_size=32, chunk_size=trainer.policy.chunk_size
    )
    assert demos["image"].shape == (10, 32, 32, 3)
    want = demo_stats(demos["state"], demos["actions"])
    got = trainer.policy.stats()
    assert torch.allclose(got["action.mean"], want["action.mean"]) and torch.allclose(
        got["observation.state.std"], want["observation.state.std"]
    )


@pytest.fixture(scope="module")
def rewarded(tmp_path_factory) -> tuple[Path, dict]:
    episodes = {e: frames_of(e, n) for e, n in enumerate(LENGTHS)}
    for e, arrays in episodes.items():
        arrays["next.reward"] = np.arange(1, LENGTHS[e] + 1, dtype=np.float32)[:, None] * 10.0**e
    return write(tmp_path_factory.mktemp("lerobot") / "rewarded", episodes), episodes


def test_transitions_for_rlpd_one_row_per_decision(rewarded):
    """``transitions=True``: frames 0, C, 2C, ... of each episode, the chunk's rewards summed, the
    episode's last decision terminated (or truncated), its last frame as the final observation; and
    `record_transitions` replays them through a residual policy."""
    from mmrl.policies.flow_vla import FlowVLAConfig
    from mmrl.policies.residual import ResidualConfig, ResidualPolicy
    from mmrl.trainer.off_policy import record_transitions

    root, episodes = rewarded
    frames = build(root=root, chunk_size=C)
    d = build(root=root, chunk_size=C, transitions=True)
    starts = [(e, t) for e, n in enumerate(LENGTHS) for t in range(0, n, C)]  # (0,0) (0,4) (1,0) (2,0) (2,4)
    assert [(int(e), int(t)) for e, t in zip(d["episode"], d["step"])] == starts
    rows = [sum(LENGTHS[:e]) + t for e, t in starts]
    for key in ("image", "state", "actions"):
        assert torch.equal(d[key], frames[key][rows])
    assert d["instruction"] == [frames["instruction"][r] for r in rows]
    sums = [float(episodes[e]["next.reward"][t : t + C].sum()) for e, t in starts]
    assert d["rewards"].tolist() == sums  # e.g. episode 0: 1+2+3+4, then 5
    assert d["terminated"].tolist() == [False, True, True, False, True] and not d["truncated"].any()
    last = [sum(LENGTHS[: e + 1]) - 1 for e in range(len(LENGTHS))]
    assert torch.equal(d["final_image"], frames["image"][last]) and torch.equal(d["final_state"], frames["state"][last])

    success = build(root=root, chunk_size=C, transitions=True, reward_key=None, episode_end="truncated")
    assert success["rewards"].tolist() == [0.0, 1.0, 1.0, 0.0, 1.0]
    assert success["truncated"].tolist() == [False, True, True, False, True] and not success["terminated"].any()

    base = FlowVLAConfig(dim=32, expert_dim=32, expert_layers=1, critic=False, chunk_size=C)
    one = build(root=root, chunk_size=C, transitions=True, image_keys=CAMERAS[0], image_size=32)
    policy = ResidualPolicy(ResidualConfig(base=base, hidden=16), action_dim=ACTION, state_dim=STATE)
    policy.after_warm_start()
    out = record_transitions(one, policy)
    assert out["rewards"].tolist() == sums and out["actions"].shape == (5, C, ACTION)


def test_a_world_model_learns_from_its_transitions(rewarded):
    """The world model's data path (issue 72): a LeRobotDataset read with ``transitions=True`` at
    chunk 1 gives `WorldModelPolicy` one example per frame, whose context is that frame and whose
    targets are the next frame and state LeRobot holds (an episode's last frame: its own, the final
    observation); a few warm-start steps on them lower its loss."""
    from mmrl.policies.world_model import WorldModelConfig, WorldModelPolicy

    root, episodes = rewarded
    size = 8  # square frames: the world model predicts one square camera
    records = build(root=root, chunk_size=1, transitions=True, image_keys=CAMERAS[0], image_size=size)

    def column(key: str) -> torch.Tensor:  # every episode's frames of one column, in order
        return torch.from_numpy(np.concatenate([episodes[e][key] for e in range(len(LENGTHS))]))

    frames, states, actions = resize_images(column(CAMERAS[0]), size), column("observation.state"), column("action")
    last = {sum(LENGTHS[: e + 1]) - 1 for e in range(len(LENGTHS))}
    nxt = [r if r in last else r + 1 for r in range(sum(LENGTHS))]  # the following frame, or the last itself

    model = WorldModelPolicy(WorldModelConfig(image_size=size, ch=8, dim=16, mid_blocks=1), ACTION, STATE)
    batch = model.warm_start_batch(records)
    assert len(batch["next_image"]) == sum(LENGTHS)
    assert torch.equal(batch["context"][:, -1], frames)
    assert torch.equal(batch["next_image"], frames[nxt])
    assert torch.equal(batch["next_state"], states[nxt]) and torch.equal(batch["state"], states)
    assert torch.equal(batch["actions"][:, 0], actions)

    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = model.supervised_loss(batch).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) < sum(losses[:5]), losses


def test_transitions_need_a_reward_column_or_success_episodes(written):
    root, _ = written
    with pytest.raises(ConfigError, match=r"no reward column 'next.reward'.*reward_key: null"):
        build(root=root, transitions=True)
    with pytest.raises(ConfigError, match="episode_end"):
        build(root=root, transitions=True, episode_end="done")
