"""Build the `libero_demos` dataset: LIBERO's official human demonstrations as per-timestep records.

Reads the HDF5 files LIBERO publishes (one ``<suite>/<task name>_demo.hdf5`` per task) and returns
flat records in the layout the simulator `simulators.libero.LiberoSim` produces (two cameras,
8-dim state, 7-dim actions in [-1, 1]), with action chunks for behaviour-cloning warm starts. Nothing
is downloaded. See CARD.md for the fields. Run as a script to save a ``.pt`` file::

    python datasets/libero_demos/builder.py --root /data/libero --suite libero_spatial \\
        --episodes 50 --out runs/libero_spatial_demos.pt
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

try:
    from mmrl.policies.processing import resize_images
    from mmrl.registry import adapter
except ImportError:  # run as a script from outside the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from mmrl.policies.processing import resize_images
    from mmrl.registry import adapter

_libero = adapter("simulators.libero")  # simulators/libero.py, wherever mmrl installed it (mmrl_simulators in a wheel)
DEMO_CAMERAS = _libero.DEMO_CAMERAS
IMAGE_FLIPS = _libero.IMAGE_FLIPS
SUITES = _libero.SUITES
TaskInfo = _libero.TaskInfo
ensure_libero_config = _libero.ensure_libero_config
list_tasks = _libero.list_tasks

ROOT_ENV = "MMRL_LIBERO_DATASETS"
CAMERAS = DEMO_CAMERAS  # (simulator camera name, key under data/demo_<i>/obs), in image order
ACTION_DIM = 7
STATE_DIM = 8
#: the download script's ``--datasets`` value for each suite (libero_10 and libero_90 come together)
DOWNLOAD_NAME = {
    "libero_spatial": "libero_spatial",
    "libero_object": "libero_object",
    "libero_goal": "libero_goal",
    "libero_10": "libero_100",
    "libero_90": "libero_100",
}
_FRAMES_PER_BATCH = 256  # frames flipped/resized at once: bounds the float32 working memory


# ---------------------------------------------------------------------------------- locating files
def default_root() -> tuple[Path, str]:
    """The folder holding the suite folders when ``root`` is not given, and where it came from:
    ``$MMRL_LIBERO_DATASETS``, else the ``datasets`` entry of LIBERO's config (the folder LIBERO's
    download script fills by default; see `simulators.libero.ensure_libero_config`)."""
    env = os.environ.get(ROOT_ENV)
    if env:
        return Path(env).expanduser(), f"${ROOT_ENV}"
    import yaml

    cfg = ensure_libero_config()
    data = yaml.safe_load(cfg.read_text()) or {}
    return Path(str(data.get("datasets", cfg.parent / "datasets"))).expanduser(), f"the 'datasets' entry of {cfg}"


def download_help(suite: str, root: Path) -> str:
    """The exact commands that put ``suite``'s demonstration files under ``root``."""
    name = DOWNLOAD_NAME[suite]
    return (
        "mmrl never downloads data. Get the official LIBERO demonstrations with either\n"
        f"  git clone https://github.com/Lifelong-Robot-Learning/LIBERO && cd LIBERO && "
        f"python benchmark_scripts/download_libero_datasets.py --datasets {name} --use-huggingface "
        f"--download-dir {root}\n"
        "or (Hugging Face CLI; older huggingface_hub: `huggingface-cli download`, same arguments)\n"
        f"  hf download yifengzhu-hf/LIBERO-datasets --repo-type dataset --include '{suite}/*' "
        f"--local-dir {root}\n"
        f"then pass root={str(root)!r} (CLI: --root) or set {ROOT_ENV}={root}."
    )


def task_files(suite: str, root: Path, tasks: Sequence[TaskInfo], origin: str = "the root argument") -> list[Path]:
    """``<root>/<suite>/<task.name>_demo.hdf5`` for each task; `FileNotFoundError` if any is missing."""
    folder = root / suite
    files = [folder / f"{t.name}_demo.hdf5" for t in tasks]
    missing = [f for f in files if not f.is_file()]
    if missing:
        what = (
            "that folder does not exist"
            if not folder.is_dir()
            else f"{len(missing)} of the {len(files)} task files asked for are missing from it, e.g. {missing[0].name}"
        )
        raise FileNotFoundError(
            f"LIBERO demonstrations for suite {suite!r} not found: looked in {folder} (root {root} from "
            f"{origin}); {what}.\n" + download_help(suite, root)
        )
    return files


# ---------------------------------------------------------------------------------- per-file reading
def _h5py():
    try:
        import h5py
    except ImportError as exc:
        raise ImportError("libero_demos reads HDF5 files. Fix: pip install h5py", name="h5py") from exc
    return h5py


def demo_keys(data_group) -> list[str]:
    """``demo_<i>`` keys of the file's ``data`` group, sorted by ``i``."""
    keys = [k for k in data_group.keys() if k.startswith("demo_") and k[5:].isdigit()]
    return sorted(keys, key=lambda k: int(k[5:]))


def choose_demos(n_available: int, num_episodes: int | None, seed: int, task_id: int) -> np.ndarray:
    """Sorted positions (into `demo_keys`) of the demos used for one task.

    ``numpy.random.RandomState([seed, task_id]).permutation(n_available)[:num_episodes]``, sorted:
    stable across numpy versions, and a task's choice does not depend on which other tasks are
    loaded. ``num_episodes=None`` (or >= n_available) takes every demo.
    """
    if num_episodes is None or num_episodes >= n_available:
        return np.arange(n_available)
    perm = np.random.RandomState([int(seed), int(task_id)]).permutation(n_available)
    return np.sort(perm[:num_episodes])


def _to_raw_opengl(frames: torch.Tensor, convention: str) -> torch.Tensor:
    """Frames [..., H, W, 3] as the raw OpenGL render (upside down) the simulator starts from."""
    if convention == "opencv":  # robosuite flipped the frames vertically before saving
        return torch.flip(frames, dims=(-3,))
    if convention != "opengl":
        raise ValueError(f"unknown macros_image_convention {convention!r} (expected 'opengl' or 'opencv')")
    return frames


def apply_flip(frames: torch.Tensor, mode: str) -> torch.Tensor:
    """`simulators.libero.flip_image` on the last three axes ([..., H, W, 3]) of a batch."""
    if mode == "rot180":
        return torch.flip(frames, dims=(-3, -2))
    if mode == "vertical":
        return torch.flip(frames, dims=(-3,))
    return frames


def action_chunks(actions: np.ndarray, starts: np.ndarray, chunk_size: int) -> np.ndarray:
    """``actions[t:t + C]`` for each t in ``starts``, past the end padded with the last action."""
    idx = np.minimum(starts[:, None] + np.arange(chunk_size)[None], len(actions) - 1)
    return actions[idx]


# ---------------------------------------------------------------------------------- build
def build(
    num_episodes: int | None,
    seed: int = 0,
    chunk_size: int = 4,
    root: str | Path | None = None,
    suite: str = "libero_spatial",
    task_ids: int | Sequence[int] | None = None,
    image_size: int = 128,
    image_flip: str = "rot180",
    stride: int = 1,
) -> dict:
    """LIBERO demonstrations as flat per-timestep records (sorted by task, demo, then step).

    ``num_episodes`` demos per task (a seeded choice, see `choose_demos`; ``None``: all) of the
    tasks ``task_ids`` (default: every task of ``suite``, LIBERO's task order 0) from
    ``<root>/<suite>/<task name>_demo.hdf5``. One record every ``stride`` steps of each demo:
    ``image`` uint8 [M, 2, S, S, 3] (agentview, eye-in-hand; flipped like the simulator's
    ``image_flip``, resized to S = ``image_size``), ``state`` float32 [M, 8], ``actions`` float32
    [M, C, 7] (``actions[t:t+C]``, padded with the last action, clipped to [-1, 1]),
    ``instruction`` list of M str, ``episode`` / ``step`` / ``task_id`` / ``demo`` long [M] and
    ``meta``. Files are opened one at a time and the output is preallocated.
    """
    if num_episodes is not None and int(num_episodes) < 1:
        raise ValueError(f"num_episodes must be >= 1 (or None for all demos), got {num_episodes}")
    if chunk_size < 1 or stride < 1 or image_size < 8:
        raise ValueError(
            f"need chunk_size >= 1, stride >= 1 and image_size >= 8, got {chunk_size}, {stride}, {image_size}"
        )
    if image_flip not in IMAGE_FLIPS:
        raise ValueError(f"image_flip must be one of {IMAGE_FLIPS}, got {image_flip!r}")
    if suite not in SUITES:
        raise ValueError(f"unknown LIBERO suite {suite!r}; valid suites: {', '.join(SUITES)}")
    if root is None:
        root, origin = default_root()
    else:
        origin = "the root argument"
    root = Path(root).expanduser().resolve()

    all_tasks = list_tasks(suite)
    if task_ids is None:
        ids = list(range(len(all_tasks)))
    else:
        ids = [int(task_ids)] if isinstance(task_ids, (int, np.integer)) else [int(i) for i in task_ids]
        bad = [i for i in ids if not 0 <= i < len(all_tasks)]
        if bad or not ids or len(set(ids)) != len(ids):
            raise ValueError(f"task_ids must be distinct ids in 0..{len(all_tasks) - 1} of suite {suite!r}, got {ids}")
    tasks = [all_tasks[i] for i in ids]
    files = task_files(suite, root, tasks, origin)
    h5py = _h5py()

    # pass 1 (metadata only): which demos, how long, so the output can be preallocated
    plan = []  # (task, file, [(demo key, demo index, length)])
    for task, path in zip(tasks, files):
        with h5py.File(path, "r") as f:
            keys = demo_keys(f["data"])
            if not keys:
                raise ValueError(f"{path} holds no data/demo_<i> groups")
            if num_episodes is not None and int(num_episodes) > len(keys):
                warnings.warn(
                    f"{path.name}: asked for {num_episodes} demos, the file has {len(keys)}; using all", stacklevel=2
                )
            chosen = [keys[j] for j in choose_demos(len(keys), num_episodes, seed, task.task_id)]
            plan.append((task, path, [(k, int(k[5:]), int(f["data"][k]["actions"].shape[0])) for k in chosen]))
    m = sum(len(range(0, n, stride)) for _, _, demos in plan for _, _, n in demos)
    out = {
        "image": torch.empty((m, len(CAMERAS), image_size, image_size, 3), dtype=torch.uint8),
        "state": torch.empty((m, STATE_DIM), dtype=torch.float32),
        "actions": torch.empty((m, chunk_size, ACTION_DIM), dtype=torch.float32),
        "episode": torch.empty(m, dtype=torch.long),
        "step": torch.empty(m, dtype=torch.long),
        "task_id": torch.empty(m, dtype=torch.long),
        "demo": torch.empty(m, dtype=torch.long),
    }
    instructions: list[str] = []
    episodes: list[dict] = []
    file_info: dict[int, dict] = {}

    # pass 2: one file open at a time, one demo in memory at a time
    row, episode = 0, 0
    for task, path, demos in plan:
        with h5py.File(path, "r") as f:
            data = f["data"]
            convention = _attr_str(data.attrs.get("macros_image_convention", "opengl"))
            problem = json.loads(_attr_str(data.attrs.get("problem_info", "{}")) or "{}")
            file_info[task.task_id] = {
                "file": str(path),
                "image_convention": convention,
                "file_language": problem.get("language_instruction"),
            }
            for key, demo_idx, n in demos:
                g = data[key]
                t = np.arange(0, n, stride)
                k = len(t)
                acts = np.asarray(g["actions"][()], dtype=np.float32)
                if acts.shape != (n, ACTION_DIM):
                    raise ValueError(f"{path.name}/{key}/actions has shape {acts.shape}, expected ({n}, {ACTION_DIM})")
                sl = slice(row, row + k)
                out["actions"][sl] = torch.from_numpy(np.clip(action_chunks(acts, t, chunk_size), -1.0, 1.0))
                obs = g["obs"]
                ee = np.asarray(obs["ee_states"][()], dtype=np.float64)[t]
                grip = np.asarray(obs["gripper_states"][()], dtype=np.float64)[t]
                out["state"][sl] = torch.from_numpy(np.concatenate([ee, grip], axis=1).astype(np.float32))
                for v, (_, obs_key) in enumerate(CAMERAS):
                    frames = obs[obs_key]
                    for b in range(0, k, _FRAMES_PER_BATCH):
                        tb = t[b : b + _FRAMES_PER_BATCH]
                        raw = frames[int(tb[0]) : int(tb[-1]) + 1 : stride]  # h5py reads only these frames
                        x = apply_flip(
                            _to_raw_opengl(torch.from_numpy(np.asarray(raw, dtype=np.uint8)), convention), image_flip
                        )
                        out["image"][row + b : row + b + len(tb), v] = resize_images(x, image_size)
                out["episode"][sl] = episode
                out["step"][sl] = torch.from_numpy(t)
                out["task_id"][sl] = task.task_id
                out["demo"][sl] = demo_idx
                instructions.extend([task.language] * k)
                episodes.append({"task_id": task.task_id, "demo": key, "length": n, "records": k})
                row += k
                episode += 1
    assert row == m
    out["instruction"] = instructions
    out["meta"] = {
        "num_episodes": num_episodes,
        "seed": seed,
        "chunk_size": chunk_size,
        "root": str(root),
        "suite": suite,
        "task_ids": ids,
        "image_size": image_size,
        "image_flip": image_flip,
        "stride": stride,
        "cameras": [c for c, _ in CAMERAS],
        "instruction_vocab": [t.language for t in tasks],
        "episodes": episodes,
        "files": file_info,
        "bytes_per_record": bytes_per_record(image_size, chunk_size),
    }
    return out


def bytes_per_record(image_size: int = 128, chunk_size: int = 4) -> int:
    """Tensor bytes of one record: images 2*S*S*3, state 8*4, actions C*7*4, four longs 4*8."""
    return len(CAMERAS) * image_size * image_size * 3 + STATE_DIM * 4 + chunk_size * ACTION_DIM * 4 + 4 * 8


def _attr_str(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, default=None, help=f"folder holding the suite folders (default ${ROOT_ENV})")
    p.add_argument("--suite", default="libero_spatial", choices=SUITES)
    p.add_argument("--task-ids", type=int, nargs="*", default=None)
    p.add_argument("--episodes", type=int, default=None, help="demos per task (default: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--chunk-size", type=int, default=4)
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--image-flip", default="rot180", choices=IMAGE_FLIPS)
    p.add_argument("--stride", type=int, default=1)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    data = build(
        args.episodes,
        args.seed,
        args.chunk_size,
        root=args.root,
        suite=args.suite,
        task_ids=args.task_ids,
        image_size=args.image_size,
        image_flip=args.image_flip,
        stride=args.stride,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(data, args.out)
    m = len(data["instruction"])
    print(
        f"{m} records from {len(data['meta']['episodes'])} demos of {len(data['meta']['task_ids'])} "
        f"{args.suite} tasks ({m * data['meta']['bytes_per_record'] / 2**30:.2f} GiB) -> {args.out}"
    )


if __name__ == "__main__":
    main()
