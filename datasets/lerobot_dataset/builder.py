"""Build the `lerobot_dataset` dataset: a dataset in LeRobot's format as per-frame warm-start records.

Reads a LeRobotDataset (a hub id, or a local folder) with LeRobot's own class
(``lerobot.datasets.lerobot_dataset.LeRobotDataset``) and returns flat records in mmrl's
demonstration layout (the layout of `libero_demos`): camera images, state, the frame's task as the
instruction and action chunks of consecutive frames, for behaviour-cloning warm starts. Needs the
LeRobot venv (``bash scripts/setup_lerobot.sh``). See CARD.md for the fields. Run as a script to
save a ``.pt`` file::

    .venv-lerobot/bin/python datasets/lerobot_dataset/builder.py --repo-id you/your_demos \\
        --episodes 50 --image-size 128 --out runs/lerobot_demos.pt
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

try:
    from mmrl.config import ConfigError
    from mmrl.data import record_order
    from mmrl.policies.processing import resize_images
    from mmrl.registry import MissingDependencyError
except ImportError:  # run as a script from outside the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from mmrl.config import ConfigError
    from mmrl.data import record_order
    from mmrl.policies.processing import resize_images
    from mmrl.registry import MissingDependencyError

SETUP = (
    "bash scripts/setup_lerobot.sh, then run mmrl from .venv-lerobot (.venv-lerobot/bin/mmrl, .venv-lerobot/bin/python)"
)
_DATASET_EXTRA = ".venv-lerobot/bin/pip install -c .ci/constraints-lerobot.txt 'lerobot[dataset]==0.6.1'"


def lerobot_dataset_class():
    """LeRobot's ``LeRobotDataset``; `MissingDependencyError` (one line) naming the fix without it."""
    if importlib.util.find_spec("lerobot") is None:
        raise MissingDependencyError(
            f"dataset 'lerobot_dataset' reads with LeRobot, which is not installed here: {SETUP}"
        )
    try:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset
    except ImportError as exc:  # lerobot without its `dataset` extra (Hugging Face datasets, pandas, av)
        raise MissingDependencyError(
            f"dataset 'lerobot_dataset' needs LeRobot's dataset extra ({exc}). Fix: {_DATASET_EXTRA}"
        ) from exc
    return LeRobotDataset


def video_backend() -> str | None:
    """None (LeRobot's default: torchcodec) where torchcodec loads, else ``"pyav"``: LeRobot falls
    back to PyAV then too, but only after logging torchcodec's whole load failure (no FFmpeg)."""
    try:
        import torchcodec  # noqa: F401
    except Exception:  # ImportError, or the RuntimeError of a torchcodec without FFmpeg's libraries
        return "pyav"
    return None


def choose_episodes(available: Sequence[int], num_episodes: int | None, seed: int) -> list[int]:
    """The episode indices used, ascending: the first ``num_episodes`` of
    ``numpy.random.RandomState(seed).permutation(len(available))`` (positions into ``available``),
    sorted. Stable across numpy versions; ``None`` (or >= len(available)) takes every episode."""
    available = sorted(int(e) for e in available)
    if num_episodes is None or num_episodes >= len(available):
        return available
    perm = np.random.RandomState(int(seed)).permutation(len(available))
    return [available[i] for i in sorted(perm[:num_episodes].tolist())]


def action_chunks(actions: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``actions[t:t + C]`` for every t of one episode ([T, A] -> [T, C, A]), past the end padded
    with the episode's last action (as LeRobot's own action windows clamp to the episode's end)."""
    t = actions.shape[0]
    idx = torch.clamp(torch.arange(t)[:, None] + torch.arange(chunk_size)[None], max=t - 1)
    return actions[idx]


def to_uint8_hwc(frame: torch.Tensor) -> torch.Tensor:
    """LeRobot's float CHW image in [0, 1] -> uint8 HWC (exact for frames stored as uint8 images)."""
    return (frame.float() * 255).round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0)


def _columns(meta) -> str:
    return ", ".join(meta.features)


def _check_keys(meta, image_keys, state_key: str | None, action_key: str) -> list[str]:
    """The camera keys read (checked), or `ConfigError` naming the columns found and the argument."""
    features = meta.features
    rgb = [k for k in meta.camera_keys if k not in meta.depth_keys]
    if image_keys is not None and not isinstance(image_keys, str) and len(image_keys) == 0:
        if state_key is None:
            raise ConfigError("image_keys: [] reads no camera, so the records need a state: set state_key")
        cameras: list[str] = []  # a state-only dataset (Meta-World from state): no camera read
    elif image_keys is None:
        cameras = rgb
        if not cameras:
            raise ConfigError(
                f"LeRobot dataset {meta.repo_id!r} has no camera (image or video) column; columns: "
                f"{_columns(meta)}. mmrl's warm start needs images"
            )
    else:
        cameras = [image_keys] if isinstance(image_keys, str) else list(image_keys)
        if not cameras or len(set(cameras)) != len(cameras):
            raise ConfigError(
                f"image_keys must name one or more distinct cameras, got {image_keys!r}; "
                f"cameras found: {', '.join(rgb)}"
            )
        for key in cameras:
            if key not in rgb:
                raise ConfigError(
                    f"image_keys names {key!r}, which LeRobot dataset {meta.repo_id!r} has not as an RGB "
                    f"camera; cameras found: {', '.join(rgb) or 'none'} (columns: {_columns(meta)}). "
                    "Fix: image_keys"
                )
    for arg, key in (("state_key", state_key), ("action_key", action_key)):
        if key is not None and key not in features:
            null = " or null for no state" if arg == "state_key" else ""
            raise ConfigError(
                f"LeRobot dataset {meta.repo_id!r} has no column {key!r}; columns: {_columns(meta)}. "
                f"Fix: {arg} (one of the columns{null})"
            )
    return cameras


def build(
    num_episodes: int | None = None,
    seed: int = 0,
    chunk_size: int = 4,
    repo_id: str | None = None,
    root: str | Path | None = None,
    episodes: Sequence[int] | None = None,
    image_keys: str | Sequence[str] | None = None,
    state_key: str | None = "observation.state",
    action_key: str = "action",
    image_size: int | None = None,
    transitions: bool = False,
    reward_key: str | None = "next.reward",
    episode_end: str = "terminated",
) -> dict:
    """A LeRobotDataset as flat per-frame records (sorted by episode, then frame).

    ``repo_id``: the hub id (LeRobot reads ``$HF_LEROBOT_HOME/<repo_id>`` when it is there, else
    downloads it); ``root``: a local dataset folder (the one holding ``meta/info.json``), read as
    it is, never downloaded into. ``num_episodes`` of the episodes ``episodes`` (default: all) are
    chosen from ``seed`` (see `choose_episodes`; ``None``: all). Every frame of a chosen episode is a
    record: ``image`` uint8 [M, V, H, W, 3] (the cameras ``image_keys``, default every RGB camera
    in the dataset's order; one camera: [M, H, W, 3]), resized to ``image_size`` square if given,
    ``state`` float32 [M, D] (``state_key``; null: none), ``actions`` float32 [M, C, A]
    (``action_key`` of frames t..t+C-1 of the episode, the last action repeated past its end),
    ``instruction`` list of M str (the frame's task), ``episode`` long [M] (in [0, E)), ``step``
    long [M] (LeRobot's ``frame_index``), ``episode_index`` / ``task_index`` long [M] (LeRobot's)
    and ``meta``.

    ``transitions=True`` gives recorded episodes for RLPD's demonstrations
    (``algorithm.sac.demo_dataset``; see `decision_rows`): one record per decision, frames 0, C, 2C,
    ... of each episode, with ``rewards`` [M] (the sum of ``reward_key`` over the chunk's frames; with
    ``reward_key`` null every episode counts as a success: 1 on its last decision, 0 elsewhere),
    ``terminated`` / ``truncated`` bool [M] (the episode's last decision, as ``episode_end`` says) and
    ``final_image`` / ``final_state`` [E, ...] (the episode's last frame: LeRobot keeps no
    observation after the last action, so a truncated episode bootstraps from its last frame).
    """
    if num_episodes is not None and int(num_episodes) < 1:
        raise ConfigError(f"num_episodes must be >= 1 (or null for all episodes), got {num_episodes}")
    if chunk_size < 1:
        raise ConfigError(f"chunk_size must be >= 1, got {chunk_size}")
    if image_size is not None and int(image_size) < 1:
        raise ConfigError(f"image_size must be >= 1 (or null for the dataset's own size), got {image_size}")
    if episode_end not in ("terminated", "truncated"):
        raise ConfigError(f"episode_end must be 'terminated' or 'truncated', got {episode_end!r}")
    if repo_id is None and root is None:
        raise ConfigError(
            "dataset 'lerobot_dataset' needs repo_id (a hub id, <user>/<dataset>) "
            "or root (a local LeRobotDataset folder)"
        )
    if root is not None:
        root = Path(root).expanduser().resolve()
        if not (root / "meta" / "info.json").is_file():
            raise ConfigError(
                f"root {str(root)!r} holds no LeRobot dataset (no meta/info.json there). Fix: root (the "
                "folder with meta/, data/), or leave it null to read repo_id from the hub"
            )
        repo_id = repo_id or f"local/{root.name}"
    LeRobotDataset = lerobot_dataset_class()
    from lerobot.datasets.dataset_metadata import LeRobotDatasetMetadata

    meta = LeRobotDatasetMetadata(repo_id, root=root)
    cameras = _check_keys(meta, image_keys, state_key, action_key)
    reward_key = reward_key if transitions else None
    if reward_key is not None and reward_key not in meta.features:
        raise ConfigError(
            f"LeRobot dataset {repo_id!r} has no reward column {reward_key!r}; columns: {_columns(meta)}. "
            "Fix: reward_key (a per-frame reward column), or reward_key: null when every episode is a "
            "success (reward 1 on its last decision)"
        )
    total = meta.total_episodes
    pool = list(range(total)) if episodes is None else sorted({int(e) for e in episodes})
    bad = [e for e in pool if not 0 <= e < total]
    if bad or not pool:
        raise ConfigError(
            f"episodes {list(episodes)!r} must be episode indices in [0, {total}) of LeRobot dataset "
            f"{repo_id!r}. Fix: episodes"
        )
    chosen = choose_episodes(pool, None if num_episodes is None else int(num_episodes), seed)
    ds = LeRobotDataset(repo_id, root=root, episodes=chosen, video_backend=video_backend())

    m = len(ds)
    rows: list[dict] = []  # per frame: everything but the images, which go straight into `image`
    image: torch.Tensor | None = None
    for i in range(m):
        item = ds[i]
        views = [to_uint8_hwc(item[key]) for key in cameras]
        if image_size is not None:
            views = [resize_images(v[None], int(image_size))[0] for v in views]
        if image is None and cameras:
            sizes = {key: tuple(v.shape[:2]) for key, v in zip(cameras, views)}
            if len(set(sizes.values())) > 1:
                raise ConfigError(
                    f"the cameras of LeRobot dataset {repo_id!r} differ in size "
                    f"({', '.join(f'{k}: {h}x{w}' for k, (h, w) in sizes.items())}). "
                    "Fix: image_size (one square size for all)"
                )
            image = torch.empty((m, len(cameras), *views[0].shape), dtype=torch.uint8)
        if image is not None:
            image[i] = torch.stack(views)
        rows.append(
            {
                "episode_index": int(item["episode_index"]),
                "frame_index": int(item["frame_index"]),
                "task_index": int(item["task_index"]),
                "task": item["task"],
                "action": item[action_key].float().reshape(-1),
                "state": None if state_key is None else item[state_key].float().reshape(-1),
                "reward": 0.0 if reward_key is None else float(item[reward_key].float().sum()),
            }
        )
    if not m:
        raise ConfigError(f"LeRobot dataset {repo_id!r} has no frames in episodes {chosen}. Fix: episodes")

    order = sorted(range(m), key=lambda r: (rows[r]["episode_index"], rows[r]["frame_index"]))
    rows = [rows[r] for r in order]
    if image is None:  # no camera read: one all-zero frame shared by every row (image_size square)
        side = int(image_size or 1)
        image = torch.zeros((1, 1, side, side, 3), dtype=torch.uint8).expand(m, 1, side, side, 3)
    elif order != list(range(m)):  # LeRobot's rows come sorted: no copy of the images then
        image = image[torch.tensor(order)]
    actions = torch.stack([r["action"] for r in rows])
    episode_index = torch.tensor([r["episode_index"] for r in rows], dtype=torch.long)
    chunks = torch.empty((m, chunk_size, actions.shape[1]), dtype=torch.float32)
    episode = torch.empty(m, dtype=torch.long)
    for pos, ep in enumerate(chosen):
        where = (episode_index == ep).nonzero().flatten()  # contiguous: rows are sorted by episode
        chunks[where] = action_chunks(actions[where], chunk_size)
        episode[where] = pos
    out = {
        "image": image[:, 0] if len(cameras) <= 1 else image,
        "actions": chunks,
        "instruction": [r["task"] for r in rows],
        "episode": episode,
        "step": torch.tensor([r["frame_index"] for r in rows], dtype=torch.long),
        "episode_index": episode_index,
        "task_index": torch.tensor([r["task_index"] for r in rows], dtype=torch.long),
    }
    if state_key is not None:
        out["state"] = torch.stack([r["state"] for r in rows])
    if transitions:
        rewards = torch.tensor([r["reward"] for r in rows], dtype=torch.float32)
        out = decision_rows(out, rewards, chunk_size, success=reward_key is None, episode_end=episode_end)
    out["meta"] = {
        "repo_id": repo_id,
        "root": str(ds.root),
        "num_episodes": num_episodes,
        "seed": seed,
        "chunk_size": chunk_size,
        "episodes": chosen,
        "cameras": cameras,
        "state_key": state_key,
        "action_key": action_key,
        "image_size": image_size,
        "transitions": transitions,
        "reward_key": reward_key,
        "episode_end": episode_end if transitions else None,
        "fps": meta.fps,
        "robot_type": meta.robot_type,
        "instruction_vocab": list(dict.fromkeys(out["instruction"])),
    }
    return out


def decision_rows(out: dict, rewards: torch.Tensor, chunk_size: int, success: bool, episode_end: str) -> dict:
    """Per-frame records (``out``, sorted by episode, then frame; ``rewards`` [M] per frame) ->
    recorded episodes, one row per decision as a policy executing ``chunk_size`` actions per decision
    sees them: frames 0, C, 2C, ... of each episode, ``rewards`` the sum over the decision's frames
    (``success``: 1 on each episode's last decision, 0 elsewhere), ``terminated`` / ``truncated`` on
    the last decision (``episode_end``), ``final_image`` / ``final_state`` the episode's last frame."""
    episode = out["episode"]
    keep, chunk_rewards, last = [], [], []
    finals = []
    for pos in range(int(episode.max()) + 1 if len(episode) else 0):
        where = (episode == pos).nonzero().flatten()
        starts = where[::chunk_size]
        keep.append(starts)
        chunk_rewards.append(
            torch.stack([rewards[where[i : i + chunk_size]].sum() for i in range(0, len(where), chunk_size)])
        )
        end = torch.zeros(len(starts), dtype=torch.bool)
        end[-1] = True
        last.append(end)
        finals.append(int(where[-1]))
    rows = torch.cat(keep)
    ends = torch.cat(last)
    picked = {k: ([v[i] for i in rows.tolist()] if isinstance(v, list) else v[rows]) for k, v in out.items()}
    picked["rewards"] = ends.float() if success else torch.cat(chunk_rewards)
    picked["terminated"] = ends & (episode_end == "terminated")
    picked["truncated"] = ends & (episode_end == "truncated")
    picked["final_image"] = out["image"][finals]
    if "state" in out:
        picked["final_state"] = out["state"][finals]
    return picked


def write(
    data: dict,
    root: str | Path,
    repo_id: str = "local/demos",
    fps: int = 30,
    camera: str | None = None,
    robot_type=None,
) -> Path:
    """mmrl demonstration records -> a LeRobotDataset at ``root``, written by LeRobot itself
    (``LeRobotDataset.create`` / ``add_frame`` / ``save_episode`` / ``finalize``).

    ``data``: the flat records of a demonstration builder recorded one sim step per decision
    (``actions`` [M, 1, A]; ``state`` [M, D], ``instruction``, ``episode``, ``step``, ``rewards`` [M];
    ``image`` [M, H, W, 3] only with ``camera``), in any order: the frames are written by episode,
    then step (`mmrl.data.record_order`). One LeRobot episode per demonstration episode; columns
    ``observation.state``, ``action``, ``next.reward`` and, with ``camera``,
    ``observation.images.<camera>`` (PNG frames); each frame's task is its instruction. `build` reads
    it back (``image_keys=[]`` without a camera)."""
    actions = data["actions"]
    if actions.dim() != 3 or actions.shape[1] != 1:
        raise ConfigError(
            f"LeRobot stores one action per frame, but these records hold chunks of {tuple(actions.shape[1:-1])} "
            "actions per decision: build the demonstrations with chunk_size 1 (--chunk-size 1)"
        )
    root = Path(root)
    if root.exists() and any(root.iterdir()):
        raise ConfigError(f"{root} already holds files: give a new (or empty) folder for the LeRobot dataset")
    if root.exists():
        root.rmdir()  # LeRobotDataset.create makes the folder itself and refuses an existing one
    state, rewards, episode = data["state"].float(), data["rewards"].float(), data["episode"]
    features: dict[str, dict] = {
        "observation.state": {"dtype": "float32", "shape": (state.shape[1],), "names": None},
        "action": {"dtype": "float32", "shape": (actions.shape[2],), "names": None},
        "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
    }
    cam = f"observation.images.{camera}" if camera else None
    if cam is not None:
        features[cam] = {
            "dtype": "image",
            "shape": tuple(data["image"].shape[1:]),
            "names": ["height", "width", "channels"],
        }
    ds = lerobot_dataset_class().create(
        repo_id, fps=int(fps), features=features, root=root, robot_type=robot_type, use_videos=False
    )
    rows, act = record_order(episode, data["step"]).tolist(), actions[:, 0].float()  # by episode, then step
    ids = episode[rows].tolist()
    for i, (r, e) in enumerate(zip(rows, ids, strict=True)):  # one pass over the sorted records
        frame = {
            "observation.state": state[r].numpy(),
            "action": act[r].numpy(),
            "next.reward": np.asarray([rewards[r]], dtype=np.float32),
            "task": data["instruction"][r],
        }
        if cam is not None:
            frame[cam] = data["image"][r].numpy()
        ds.add_frame(frame)
        if i + 1 == len(ids) or ids[i + 1] != e:  # the episode's last frame
            ds.save_episode(parallel_encoding=False)  # no process pool: callers may hold threads
    ds.finalize()
    return root


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo-id", default=None, help="hub id (LeRobot downloads it unless it is local already)")
    p.add_argument("--root", type=Path, default=None, help="a local LeRobotDataset folder (holding meta/info.json)")
    p.add_argument("--episodes", type=int, default=None, help="episodes to take (default: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--chunk-size", type=int, default=4)
    p.add_argument("--image-keys", nargs="*", default=None, help="camera columns, in order (default: all RGB cameras)")
    p.add_argument("--state-key", default="observation.state", help="state column ('': no state)")
    p.add_argument("--action-key", default="action")
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    data = build(
        args.episodes,
        args.seed,
        args.chunk_size,
        repo_id=args.repo_id,
        root=args.root,
        image_keys=args.image_keys,
        state_key=args.state_key or None,
        action_key=args.action_key,
        image_size=args.image_size,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(data, args.out)
    print(f"{len(data['instruction'])} frames of {len(data['meta']['episodes'])} episodes -> {args.out}")


if __name__ == "__main__":
    main()
