"""Fault injection for the kill-and-resume tests (issue 18): named points inside checkpoint writing
and run logging where a test has the process killed with SIGKILL, exactly as ``kill -9`` would.

Off unless ``MMRL_FAULT`` is set; the variable is read once, at import, and when it is unset
`fault_point` returns at its first line.

    MMRL_FAULT=ckpt.after_rename:3            SIGKILL this process the 3rd time it reaches that point
    MMRL_FAULT=ckpt.mid_state:1,log.after_row:5   several points: whichever fires first kills
    MMRL_FAULT=ckpt.mid_shard:2@1             only in the rank whose ``RANK`` is 1 (several ranks)
    MMRL_FAULT_TRACE=/tmp/trace.txt           append "name<TAB>path" for every point reached (written
                                              unbuffered, so it survives the kill); works alone too

Points named ``*.mid_*`` model a kill in the middle of writing or deleting something: before the
kill they cut the file they are given to half its bytes (or ``cut`` bytes off its end), or delete the
first half (at least one) of a folder's files in sorted order (``COMPLETE`` sorts first).

Points, in the order a run reaches them (`POINTS` holds the same list; `configure` rejects others):

mmrl/trainer/checkpoint.py `save` (every save of ``iter_N``):
  ckpt.after_tmp_mkdir      the temporary folder ``.iter_N.tmp`` was just made, empty
  ckpt.mid_shard            (N ranks: ZeRO, FSDP2) a rank's own optimizer file half written
  ckpt.mid_weights          ``model.safetensors`` half written
  ckpt.mid_state            ``state.pt`` half written
  ckpt.after_state          ``state.pt`` written (not yet fsynced)
  ckpt.after_config         ``config.yaml`` written
  ckpt.after_fsync          the three files fsynced
  ckpt.mid_marker           ``COMPLETE`` half written
  ckpt.after_marker         ``COMPLETE`` written and fsynced, the folder fsynced
  ckpt.after_set_aside      (a second save of one iteration) the old ``iter_N`` renamed ``.iter_N.replaced``
  ckpt.after_rename         ``.iter_N.tmp`` renamed ``iter_N`` (and the folder fsynced)
  ckpt.after_drop_replaced  (a second save) ``.iter_N.replaced`` deleted
  ckpt.mid_latest           ``latest.tmp`` half written
  ckpt.after_latest         ``latest`` replaced
  ckpt.before_rotate        an old checkpoint folder is about to be deleted (rotation)
  ckpt.mid_rotate           that folder half deleted
  ckpt.after_rotate         that folder deleted

mmrl/trainer/logging.py (`RunLogger`, and `cut_log`, which resume calls through `load_latest`):
  log.after_cut             ``metrics.jsonl`` cut back to its length when the resumed checkpoint was saved
  log.mid_row               a ``metrics.jsonl`` row half written (a torn last line)
  log.after_row             a ``metrics.jsonl`` row written
  log.mid_rewind            the rewound log's temporary file half written, ``metrics.jsonl`` untouched
  log.after_rewind          the rewound log replaced ``metrics.jsonl``

mmrl/dyna.py (`Dyna.save_round`, after each round of the Dyna loop, and after its start):
  dyna.before_save          the round's work done and its row logged, its state not yet saved
  dyna.after_save           the round's state folder renamed into place

`tests/reliability/kill_harness.py` drives these from tests/reliability and benchmarks/kill_resume.py.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

POINTS = (
    "ckpt.after_tmp_mkdir",
    "ckpt.mid_shard",
    "ckpt.mid_weights",
    "ckpt.mid_state",
    "ckpt.after_state",
    "ckpt.after_config",
    "ckpt.after_fsync",
    "ckpt.mid_marker",
    "ckpt.after_marker",
    "ckpt.after_set_aside",
    "ckpt.after_rename",
    "ckpt.after_drop_replaced",
    "ckpt.mid_latest",
    "ckpt.after_latest",
    "ckpt.before_rotate",
    "ckpt.mid_rotate",
    "ckpt.after_rotate",
    "log.after_cut",
    "log.mid_row",
    "log.after_row",
    "log.mid_rewind",
    "log.after_rewind",
    "dyna.before_save",
    "dyna.after_save",
)
#: points only a run of several ranks reaches (tests/distributed covers them, not tests/reliability)
MULTI_RANK = ("ckpt.mid_shard",)

_active = False
_plan: dict[str, int] = {}  # point -> the occurrence that kills (1-based)
_seen: dict[str, int] = {}
_trace: int | None = None  # file descriptor of MMRL_FAULT_TRACE


def parse(spec: str | None, rank: int | None = None) -> dict[str, int]:
    """``"name:3,other:1"`` -> ``{"name": 3, "other": 1}``; a bare name means its first occurrence;
    ``name:3@1`` is kept only for ``rank`` 1 (default: this process's ``RANK``, 0 without one)."""
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    plan = {}
    for item in filter(None, (s.strip() for s in (spec or "").split(","))):
        item, _, only = item.partition("@")
        if only and not only.isdigit():
            raise ValueError(f"MMRL_FAULT: {item}@{only}: the rank after '@' must be an integer >= 0")
        if only and int(only) != rank:
            continue
        name, _, count = item.partition(":")
        if name not in POINTS:
            raise ValueError(f"MMRL_FAULT: unknown fault point {name!r}; known: {', '.join(POINTS)}")
        if count and not (count.isdigit() and int(count) >= 1):
            raise ValueError(f"MMRL_FAULT: {item!r}: the occurrence after ':' must be an integer >= 1")
        plan[name] = int(count or 1)
    return plan


def configure(spec: str | None = None, trace: str | os.PathLike | None = None) -> None:
    """(Re)arm this process: what `MMRL_FAULT` / `MMRL_FAULT_TRACE` do at import, for a process that
    was forked after the import (the test harness). Occurrence counts restart at zero."""
    global _active, _plan, _trace
    _plan = parse(spec)
    _seen.clear()
    if _trace is not None:
        os.close(_trace)
    _trace = os.open(trace, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if trace else None
    _active = bool(_plan) or _trace is not None


def fault_point(name: str, path: str | os.PathLike | None = None, cut: int | None = None) -> None:
    """A named point (see the module docstring); kills the process here when ``MMRL_FAULT`` says so."""
    if not _active:
        return
    _reached(name, path, cut)


def _reached(name: str, path, cut: int | None) -> None:
    if name not in POINTS:
        raise ValueError(f"fault_point: {name!r} is not declared in mmrl.utils.faults.POINTS")
    _seen[name] = n = _seen.get(name, 0) + 1
    if _trace is not None:
        os.write(_trace, f"{name}\t{path or ''}\n".encode())
    if _plan.get(name) != n:
        return
    if ".mid_" in name and path is not None:
        _half(Path(path), cut)
    os.kill(os.getpid(), signal.SIGKILL)


def _half(path: Path, cut: int | None) -> None:
    """Leave ``path`` as a kill midway through writing (or deleting) it would."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file())
        for f in files[: max(1, len(files) // 2)]:
            f.unlink()
    elif path.exists():
        size = path.stat().st_size
        os.truncate(path, max(0, size - cut) if cut is not None else size // 2)


configure(os.environ.get("MMRL_FAULT"), os.environ.get("MMRL_FAULT_TRACE"))
