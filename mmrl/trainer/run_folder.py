"""The run folder before any work: writable, used by one process at a time, and resumed only
under the config its checkpoint was trained with.

- `open_run_folder`: create ``OUT`` (a clear error when it cannot be written) and take its lock.
  The lock is an ``flock`` on ``OUT/.lock`` (released by the kernel when the process dies, kill -9
  included, so it is never stale); the file names the holder (pid, host, command) for the error
  another process gets.
- `config_changes`: the keys whose values differ between a checkpoint's config and the resumed
  one, ignoring the keys that do not change training (`RESUMABLE`): evaluation, logging,
  checkpoint cadence, the run's length (with a constant learning rate) and the sim workers'
  fault handling. A resume with other differences is refused (`check_resume_config`) unless
  ``trainer.accept_config_change`` is set, which records the change in ``OUT/config_history.jsonl``.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from mmrl.errors import ConfigChangedError, RunLockedError, UserError

LOCK = ".lock"
HISTORY = "config_history.jsonl"
#: keys (or prefixes ending in '.') that a resume may change: they do not change what is trained
RESUMABLE = (
    "run.output_dir",
    "run.name",  # a run folder copied or renamed resumes under its new name
    "run.wandb",
    "run.wandb_project",
    "run.threads",
    "trainer.eval_every",
    "trainer.eval_episodes",
    "trainer.eval_seed",
    "trainer.video_episodes",
    "trainer.checkpoint_every",
    "trainer.keep_checkpoints",
    "trainer.resume",
    "trainer.accept_config_change",
    "sim.eval_num_envs",
    "sim.eval_tasks",
    "sim.eval_kwargs.",
    "placement.step_timeout_s",
    "reward.timeout_s",
    "placement.max_restarts",
    "placement.torch_threads",
    "placement.ray_strategy",
)
#: the run's length may grow or shrink unless the learning rate decays over it
LENGTH_KEYS = ("trainer.iterations", "trainer.env_steps")


_OPEN: dict = {}  # run folders this process holds, by real path


class RunFolder:
    """An open run folder: holds the lock until `close` (or the process ends)."""

    def __init__(self, path: Path, fd: int):
        self.path = path
        self._fd: int | None = fd  # None once closed

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the flock
            self._fd = None


def open_run_folder(out_dir: Path) -> RunFolder:
    """Create ``out_dir`` if needed, check that it can be written, and lock it for this process.
    Raises `UserError` (unwritable) or `RunLockedError` (another process holds it)."""
    out_dir = Path(out_dir)
    key = os.path.realpath(out_dir)
    if key in _OPEN:  # this process had it (a trainer built again, e.g. in a notebook): the new one takes it
        _OPEN.pop(key).close()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(out_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise UserError(
            f"cannot write the run folder {out_dir} ({exc.strerror or exc}): set run.output_dir "
            "to a folder you can write, or fix its permissions"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            os.close(fd)
            raise
        holder = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        os.close(fd)
        who = _describe_holder(holder)
        raise RunLockedError(
            f"run folder {out_dir} is in use by another process ({who}): wait for it to end "
            "or stop it, or give this run another run.name"
        ) from None
    info = json.dumps(
        {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(sys.argv),
        }
    )
    os.ftruncate(fd, 0)
    os.pwrite(fd, info.encode(), 0)
    _OPEN[key] = RunFolder(out_dir, fd)
    return _OPEN[key]


def _describe_holder(text: str) -> str:
    try:
        h = json.loads(text)
        return f"pid {h['pid']} on {h['host']} since {h['since']}: {h['command']}"
    except (ValueError, KeyError, TypeError):
        return "pid unknown"


def flatten(tree, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists stay values)."""
    out = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def config_changes(saved: dict, current: dict) -> list[tuple[str, object, object]]:
    """``(key, saved value, current value)`` for every key of both configs (plain dicts, as
    `mmrl.config.to_dict` gives) whose value differs and that changes training. Keys only one side
    has (a newer mmrl's new keys) are not compared."""
    a, b = flatten(saved), flatten(current)
    linear = "linear" in (a.get("trainer.lr_schedule"), b.get("trainer.lr_schedule"))  # the rate decays over the length
    out = []
    for key in sorted(a.keys() & b.keys()):
        if a[key] == b[key] or _normalised(a[key]) == _normalised(b[key]):
            continue
        if key in RESUMABLE or any(key.startswith(p) for p in RESUMABLE if p.endswith(".")):
            continue
        if key in LENGTH_KEYS and not linear:
            continue
        out.append((key, a[key], b[key]))
    return out


def _normalised(v):
    if isinstance(v, (list, tuple)):
        return [_normalised(x) for x in v]
    if isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    return v


#: how a change of the number of ranks shows among a resume's config changes
GLOBAL_BATCH = "global batch (ranks x sim.num_envs)"


def global_batch_changes(saved: dict, saved_world: int, current: dict, world: int, changes: list) -> list:
    """``changes`` (`config_changes`) seen at the job's size: with N ranks each takes
    ``sim.num_envs`` envs, so the global batch is ``N x sim.num_envs``. A ``sim.num_envs`` change
    that keeps it (2 ranks x 4 -> 1 x 8) is no change; another number of ranks that changes it is
    one (`GLOBAL_BATCH`), which a resume refuses like any other unless asked."""
    n0, n1 = saved.get("sim", {}).get("num_envs"), current.get("sim", {}).get("num_envs")
    if not isinstance(n0, int) or not isinstance(n1, int):
        return changes
    g0, g1 = saved_world * n0, world * n1
    if g0 == g1:
        return [c for c in changes if c[0] != "sim.num_envs"]
    if saved_world == world:
        return changes
    kept = [c for c in changes if c[0] != "sim.num_envs"]
    return [*kept, (GLOBAL_BATCH, f"{saved_world} x {n0} = {g0}", f"{world} x {n1} = {g1}")]


def rank_config_differences(configs: list[dict]) -> list[tuple[int, str, object, object]]:
    """``(rank, key, rank 0's value, that rank's value)`` for every key whose value differs between
    rank 0's config and another rank's (configs as `mmrl.config.to_dict` gives, one per rank)."""
    base, out = flatten(configs[0]), []
    for rank, config in enumerate(configs[1:], 1):
        other = flatten(config)
        for key in sorted(base.keys() | other.keys()):
            a, b = base.get(key), other.get(key)
            if key not in base or key not in other or (a != b and _normalised(a) != _normalised(b)):
                out.append((rank, key, a, b))
    return out


def check_ranks_agree(cfg) -> None:
    """With N ranks (`mmrl.distributed`, every rank calling, before any work): every rank's config
    equals rank 0's, else a `UserError` on every rank naming the differing keys. Ranks started with
    other values trained silently (another ``run.seed``, ``sim.num_envs``), failed inside DDP
    (another ``policy.dim``) or paired their collectives wrongly (another ``trainer.iterations``)."""
    from mmrl import distributed
    from mmrl.config import to_dict

    if not distributed.current().distributed:
        return
    diffs = rank_config_differences(distributed.gather_objects(to_dict(cfg)))
    if diffs:
        shown = "; ".join(f"rank {r}: {k}={b!r} (rank 0: {a!r})" for r, k, a, b in diffs[:8])
        more = f" (and {len(diffs) - 8} more)" if len(diffs) > 8 else ""
        raise UserError(
            f"the ranks of this job were started with different configs: {shown}{more}; start every rank "
            "with the same config file and the same overrides"
        )


def check_resume_config(cfg, checkpoint: Path | None, world: int = 1) -> list[tuple[str, object, object]]:
    """Compare ``cfg`` on ``world`` ranks with the config and the number of ranks ``checkpoint`` (a
    checkpoint folder) was trained with (`global_batch_changes`). No difference that changes
    training: returns []. Differences with ``trainer.accept_config_change``: returns them (the caller
    records them). Otherwise raises `ConfigChangedError` naming the keys and the two ways out."""
    from mmrl.config import to_dict
    from mmrl.trainer.checkpoint import recorded_config, recorded_world_size

    if checkpoint is None:
        return []
    saved = recorded_config(Path(checkpoint))
    current = to_dict(cfg)
    changes = config_changes(saved, current)
    changes = global_batch_changes(saved, recorded_world_size(Path(checkpoint)), current, world, changes)
    if not changes or cfg.trainer.accept_config_change:
        return changes
    shown = ", ".join(f"{k} {v0!r} -> {v1!r}" for k, v0, v1 in changes[:8])
    more = f" (and {len(changes) - 8} more)" if len(changes) > 8 else ""
    raise ConfigChangedError(
        f"the config differs from the one checkpoint {Path(checkpoint).name} was trained with: {shown}{more}. "
        f"Start a new run (run.name=NEW_NAME), or resume under the new values with "
        f"trainer.accept_config_change=true (recorded in {Path(checkpoint).parent.parent / HISTORY})"
    )


def record_config_change(out_dir: Path, checkpoint: Path, changes) -> None:
    """Append an accepted change to ``OUT/config_history.jsonl`` (which checkpoint, what changed)."""
    from mmrl.utils.jsonio import dumps

    row = {
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "checkpoint": Path(checkpoint).name,
        "changes": {k: {"from": v0, "to": v1} for k, v0, v1 in changes},
    }
    with open(Path(out_dir) / HISTORY, "a") as f:
        f.write(dumps(row, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())
