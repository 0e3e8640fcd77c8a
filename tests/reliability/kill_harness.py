"""Kill ``mmrl train`` with SIGKILL at chosen instants, run the same command again, and check the
run ends as if it had never been interrupted (issue 18). Shared by tests/reliability and
benchmarks/kill_resume.py.

A *case* is a list of faults, one per run of the same command in one run folder, followed by one
clean run: ``["ckpt.after_rename:3"]`` kills the first run the 3rd time a checkpoint folder is renamed
into place (`mmrl.utils.faults`), ``["t=1.5"]`` kills it from outside 1.5 s after its start,
``["ckpt.after_latest:4", "log.mid_rewind:1"]`` kills it, then kills the run resuming it while that
one rewinds the log. After each kill and before the next run:

- the killed run died by SIGKILL (return code -9): the hook really fired, or the timer did;
- no checkpoint was lost: the newest complete checkpoint (checked here independently of
  `mmrl.trainer.checkpoint`: ``COMPLETE`` present and the sha256 / size of ``model.safetensors`` and
  ``state.pt`` matching it) is at least as new as before the run, as every checkpoint the run had
  renamed into place (from its fault trace) and as the one ``latest`` names;

the next run that gets past its resume says ``resumed from checkpoint <that newest one>`` (or
resumes nothing when there was none), and the clean run ends with, compared with an uninterrupted
reference run of the same command: the same checkpoint folders, bit-identical checkpoints (policy,
optimizer, RNG states, counters; wall-clock fields aside), the same ``results.json`` numbers (wall-clock
fields aside) and the same ``metrics.jsonl`` rows in the same order (timing keys aside), with no row
twice (two rows with the same step and the same keys).

Runs are forked from a forkserver that imported torch and mmrl once (a run then takes ~1.5 s on 2
cores instead of ~5 s), or started as real ``python -m mmrl.cli train`` subprocesses (``how="subprocess"``, the
fault passed in ``MMRL_FAULT``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import multiprocessing.connection
import os
import random
import re
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "quickstart.yaml"
ITERATIONS = 6
# the quickstart shrunk to ~1.5 s (forked): 6 iterations, a checkpoint every 2 (saves: iteration 0 after the warm
# start, 0 again after the first evaluation, 2, 4, 6, 6 again after the final evaluation), 2 kept
TINY = [
    "sim.num_envs=8",
    "sim.eval_num_envs=8",
    "sim.kwargs={max_episode_steps: 12}",
    "policy.dim=16",
    "policy.expert_dim=16",
    "policy.expert_layers=1",
    "policy.num_steps=3",
    "warm_start.num_episodes=4",
    "warm_start.steps=3",
    "warm_start.batch_size=8",
    "warm_start.candidates=1",  # the cases count log rows (kills among candidates: test_warm_start_candidates)
    "algorithm.minibatch_size=16",
    "algorithm.epochs=1",
    f"trainer.iterations={ITERATIONS}",
    "trainer.checkpoint_every=2",
    "trainer.keep_checkpoints=2",
    "trainer.eval_episodes=8",
    "trainer.video_episodes=0",
    "run.threads=1",
]
KILLED = -signal.SIGKILL
_CKPT = re.compile(r"^(iter_(\d{6})|\.iter_(\d{6})\.replaced)$")
_RESUMED = re.compile(r"resumed from checkpoint (\S+) \(iteration (\d+)\)")


def train_argv(out: Path) -> list[str]:
    """``mmrl train`` arguments for run folder ``out``."""
    return ["train", str(CONFIG), f"run.output_dir={out.parent}", f"run.name={out.name}", *TINY]


def timing_key(key: str) -> bool:
    """Wall-clock values, which differ between any two runs (``iter_s``, ``rl_seconds``, ...)."""
    return isinstance(key, str) and (key.endswith("_s") or key.endswith("rl_seconds"))


# ---- running one attempt ---------------------------------------------------------------------
@dataclass
class Attempt:
    fault: str  # "" (clean), "point:k" (a fault point) or "t=SECONDS" (killed from outside)
    returncode: int
    output: str
    trace: list[tuple[str, str]]  # fault points reached, in order: (name, path)
    seconds: float


def _child(argv: list[str], fault: str, trace: str, log: str) -> None:  # runs in the forked process
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # line-buffered: lines survive the SIGKILL
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    from tqdm import tqdm

    from mmrl.utils import faults

    tqdm.set_lock(threading.RLock())  # not tqdm's multiprocessing lock, which a SIGKILL would leak
    faults.configure(fault, trace)
    sys.argv = ["mmrl", *argv]
    runpy.run_module("mmrl.cli", run_name="__main__", alter_sys=True)  # as `python -m mmrl.cli` does


# what a run imports (torch's optimizer pulls in torch._dynamo: 3 s), imported once by the forkserver
_PRELOAD = [
    "mmrl",
    "tests.reliability.kill_harness",
    "mmrl.experiment",
    "mmrl.trainer.trainer",
    "torch.utils.tensorboard",
    "torch._dynamo",
    "simulators",
    "rewards",
]
_lock = threading.RLock()


def _forkserver():
    with _lock:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)  # used when this process starts its forkserver
        return ctx


def attempt(out: Path, fault: str = "", how: str = "fork", timeout: float = 300) -> Attempt:
    """One run of the command in ``out``: with a fault point armed, killed after ``t=`` seconds, or clean."""
    out.parent.mkdir(parents=True, exist_ok=True)
    n = len(list(out.parent.glob(f"{out.name}.attempt*.log")))
    log, trace = out.parent / f"{out.name}.attempt{n}.log", out.parent / f"{out.name}.attempt{n}.trace"
    kill_after = float(fault[2:]) if fault.startswith("t=") else None
    point = "" if kill_after is not None else fault
    t0 = time.time()
    if how == "fork":
        proc = _forkserver().Process(target=_child, args=(train_argv(out), point, str(trace), str(log)))
        # a forkserver child's exit code is read once from its sentinel, and Process.start() polls every
        # other child: from several threads, start and read under one lock, and wait without reading
        with _lock:
            proc.start()
        if not multiprocessing.connection.wait([proc.sentinel], kill_after if kill_after is not None else timeout):
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:  # it ended meanwhile
                pass
            multiprocessing.connection.wait([proc.sentinel])
        with _lock:
            proc.join()
            rc = proc.exitcode
    elif how == "subprocess":
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            "MMRL_FAULT": point,
            "MMRL_FAULT_TRACE": str(trace),
        }
        with open(log, "ab") as f:
            proc = subprocess.Popen(
                [sys.executable, "-m", "mmrl.cli", *train_argv(out)],
                cwd=ROOT,
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
            )
            try:
                proc.wait(kill_after if kill_after is not None else timeout)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
        rc = proc.returncode
    else:
        raise ValueError(f"how={how!r}: 'fork' or 'subprocess'")
    seconds = time.time() - t0
    lines = trace.read_text().splitlines() if trace.exists() else []
    return Attempt(
        fault, rc, log.read_text() if log.exists() else "", [tuple(x.split("\t", 1)) for x in lines], seconds
    )


# ---- what is on disk -------------------------------------------------------------------------
def complete_checkpoints(out: Path) -> list[tuple[int, str]]:
    """``(iteration, folder name)`` of every complete checkpoint, newest first (at equal iteration the
    folder in place before the one set aside): an independent reading of the on-disk format."""
    found = []
    root = out / "checkpoints"
    for p in root.iterdir() if root.exists() else []:
        m = _CKPT.match(p.name)
        if not m or not p.is_dir():
            continue
        try:
            files = json.loads((p / "COMPLETE").read_text())["files"]
            data = {name: (p / name).read_bytes() for name in ("model.safetensors", "state.pt")}
        except (OSError, ValueError, KeyError):
            continue
        if set(files) == set(data) and all(
            len(data[n]) == files[n]["bytes"] and hashlib.sha256(data[n]).hexdigest() == files[n]["sha256"]
            for n in data
        ):
            found.append((int(m.group(2) or m.group(3)), m.group(2) is not None, p.name))
    return [(it, name) for it, _, name in sorted(found, reverse=True)]


def newest(out: Path) -> tuple[int, str] | None:
    found = complete_checkpoints(out)
    return found[0] if found else None


def rows(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def duplicate_rows(out: Path) -> int:
    """Rows whose step and set of keys an earlier row already had (warm-start rows have steps < 0)."""
    seen, dup = set(), 0
    for r in rows(out):
        key = (r["step"], frozenset(r))
        dup += key in seen
        seen.add(key)
    return dup


def _no_timing(value):
    if isinstance(value, dict):
        return {k: _no_timing(v) for k, v in value.items() if not timing_key(k)}
    return value


def _read_checkpoint(folder: Path) -> dict:
    """A checkpoint's contents, read here without `mmrl.trainer.checkpoint` (an independent reading):
    ``state.pt``'s dict with the weights of ``model.safetensors`` (and its metadata) beside it."""
    import torch

    from mmrl.utils.weights import load_weights

    data = torch.load(folder / "state.pt", map_location="cpu", weights_only=False)
    data["policy"], data["weights_metadata"] = load_weights(folder / "model.safetensors")
    return data


def _comparable(ckpt: dict) -> dict:
    """A checkpoint's contents that two runs of one command must share: all but wall-clock fields,
    the length of metrics.jsonl at the save (its rows hold timings of varying length), and the Python
    and NumPy global RNG states, which mmrl never seeds nor draws from (each process starts them from
    fresh entropy; the torch RNG state is compared)."""
    out = {k: v for k, v in _no_timing(ckpt).items() if k != "log_bytes"}
    if isinstance(out.get("rng"), dict):
        out["rng"] = {k: v for k, v in out["rng"].items() if k not in ("python", "numpy")}
    return out


def _same(a, b, path: str, problems: list[str]) -> None:
    import numpy as np
    import torch

    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            problems.append(f"{path}: keys differ: {sorted(map(str, a.keys() ^ b.keys()))}")
        for k in a.keys() & b.keys():
            _same(a[k], b[k], f"{path}.{k}", problems)
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            problems.append(f"{path}: lengths differ ({len(a)} vs {len(b)})")
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]", problems)
    elif isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        ):
            problems.append(f"{path}: tensors differ")
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not np.array_equal(a, b):
            problems.append(f"{path}: arrays differ")
    elif a != b and not (a != a and b != b):  # NaN == NaN here
        problems.append(f"{path}: {a!r} != {b!r}")


def compare(ref: Path, out: Path) -> list[str]:
    """How run folder ``out`` differs from the uninterrupted ``ref`` (empty: it does not)."""
    problems = []
    top = {p: sorted(x.name for x in p.iterdir() if x.name != "tb") for p in (ref, out)}
    if top[ref] != top[out]:
        problems.append(f"run folder holds {top[out]}, uninterrupted {top[ref]}")
    listing = {
        p: sorted(x.name for x in (p / "checkpoints").iterdir()) if (p / "checkpoints").exists() else []
        for p in (ref, out)
    }
    if listing[ref] != listing[out]:
        problems.append(f"checkpoint folder holds {listing[out]}, uninterrupted {listing[ref]}")
    for name in listing[ref]:
        if not name.startswith("iter_") or name not in listing[out]:
            continue
        a, b = (_read_checkpoint(p / "checkpoints" / name) for p in (ref, out))
        _same(_comparable(a), _comparable(b), name, problems)
    try:
        a, b = (json.loads((p / "results.json").read_text()) for p in (ref, out))
        _same(_no_timing(a), _no_timing(b), "results.json", problems)
    except (OSError, ValueError) as exc:
        problems.append(f"results.json: {exc}")
    try:
        a, b = ([_no_timing(r) for r in rows(p)] for p in (ref, out))
    except ValueError as exc:
        problems.append(f"metrics.jsonl unreadable: {exc}")
    else:
        if a != b:
            sa = [(r["step"], sorted(r)[:2]) for r in a]
            sb = [(r["step"], sorted(r)[:2]) for r in b]
            problems.append(
                f"metrics.jsonl rows differ: {len(b)} rows (steps {[s for s, _ in sb]}), "
                f"uninterrupted {len(a)} (steps {[s for s, _ in sa]})"
                + ("" if sa != sb else "; same steps and keys, different values")
            )
    return problems if len(problems) <= 12 else [*problems[:12], f"... and {len(problems) - 12} more"]


# ---- a case: kills, then a clean run ---------------------------------------------------------
@dataclass
class Result:
    case: list[str]
    kills: int = 0  # runs that died by SIGKILL
    resumed: int = 0  # kills after which the next run resumed from the newest complete checkpoint
    identical: int = 0  # kills after which the case ended identical to the reference
    duplicate_log_rows: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. a run that ended before its timer killed it
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems


def _after_kill(out: Path, before, a: Attempt, problems: list[str]) -> None:
    """No checkpoint lost by the kill."""
    now = newest(out)
    floor = [before[0]] if before else []
    floor += [
        int(m.group(2) or m.group(3))
        for name, path in a.trace
        if name == "ckpt.after_rename"
        for m in [_CKPT.match(Path(path).name)]
        if m
    ]
    try:
        named = (out / "checkpoints" / "latest").read_text()
        floor += [int(named[5:])] if re.fullmatch(r"iter_\d{6}", named) else []
    except OSError:
        pass
    if floor and (now is None or now[0] < max(floor)):
        problems.append(
            f"after kill {a.fault!r}: newest complete checkpoint {now}, expected iteration "
            f">= {max(floor)} (a checkpoint was lost)"
        )


def _check_resume(out: Path, expected, a: Attempt, problems: list[str]) -> bool | None:
    """Whether run ``a`` resumed from ``expected`` (None if it died before its resume was done)."""
    said = _RESUMED.search(a.output)
    past_resume = said is not None or a.returncode == 0 or any(n == "ckpt.after_tmp_mkdir" for n, _ in a.trace)
    if not past_resume:
        return None
    want = None if expected is None else (expected[1], expected[0])
    got = None if said is None else (said.group(1), int(said.group(2)))
    if got != want:
        problems.append(f"run {a.fault or 'clean'!r} resumed from {got}, newest complete checkpoint was {want}")
        return False
    return True


def run_case(case: list[str], ref: Path, out: Path, how: str = "fork") -> Result:
    """Each fault of ``case`` in turn (each run must die by SIGKILL), then a clean run; compared with ``ref``."""
    t0 = time.time()
    res = Result(list(case))
    pending = 0  # kills whose resume is still to be seen
    for fault in [*case, ""]:
        before = newest(out)
        a = attempt(out, fault, how)
        verdict = _check_resume(out, before, a, res.problems)
        if verdict is not None:
            res.resumed += pending if verdict else 0
            pending = 0
        if fault:
            if fault.startswith("t=") and a.returncode == 0:  # the run was quicker than the timer: no kill
                res.notes.append(f"run {fault!r} ended before its kill")
                continue
            if a.returncode != KILLED:
                res.problems.append(
                    f"run {fault!r} ended with return code {a.returncode}, not SIGKILL"
                    + (f"; its output ends: {a.output[-1500:]}" if a.returncode else "")
                )
                continue
            if not fault.startswith("t=") and (not a.trace or a.trace[-1][0] != fault.split(":")[0]):
                res.problems.append(f"run {fault!r} was killed elsewhere: last point {a.trace[-1:]}")
            res.kills += 1
            pending += 1
            _after_kill(out, before, a, res.problems)
        elif a.returncode != 0:
            res.problems.append(f"the clean run failed ({a.returncode}): {a.output[-3000:]}")
    res.duplicate_log_rows = duplicate_rows(out)
    if res.duplicate_log_rows:
        res.problems.append(f"metrics.jsonl holds {res.duplicate_log_rows} duplicate row(s)")
    diff = compare(ref, out) if not res.problems or (out / "results.json").exists() else ["not compared"]
    res.problems += diff
    res.identical = res.kills if not diff else 0
    res.seconds = time.time() - t0
    return res


# ---- plans -----------------------------------------------------------------------------------
@dataclass
class Reference:
    out: Path
    trace: list[tuple[str, str]]
    seconds: float

    def occurrences(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for name, _ in self.trace:
            counts[name] = counts.get(name, 0) + 1
        return counts


def _noop() -> None:
    pass


def reference(workdir: Path, how: str = "fork") -> Reference:
    """The uninterrupted run every case must end at, with the fault points it reaches and its duration
    (a forked run is timed once the forkserver has imported everything)."""
    if how == "fork":
        warm = _forkserver().Process(target=_noop)
        warm.start()
        warm.join()
    out = workdir / f"reference_{how}"
    a = attempt(out, "", how)
    if a.returncode != 0:
        raise RuntimeError(f"the reference run failed ({a.returncode}): {a.output[-3000:]}")
    return Reference(out, a.trace, a.seconds)


def random_kills(n: int, seed: int, seconds: float) -> list[list[str]]:
    """``n`` cases killed once from outside, at times drawn uniformly over most of a run's duration
    (``seconds``; a run that ends before its timer is noted, not counted as a kill)."""
    rng = random.Random(seed)
    return [[f"t={rng.uniform(0.02, 0.8) * seconds:.3f}"] for _ in range(n)]


def every_point(ref: Reference, rng: random.Random | None = None, repeats: int = 2) -> list[list[str]]:
    """One case per fault point and occurrence the reference reached (each rename, delete, mid-file
    write and log row of a whole run), plus ``repeats`` cases for each point that only a resumed run
    reaches with something to do (cutting back and rewinding a log that holds rows): they kill a run
    after a random log row (rows 1-2 are the warm start's, before any checkpoint), then the run
    resuming it at that point."""
    seen = ref.occurrences()
    cases = [[f"{name}:{k}"] for name, n in seen.items() for k in range(1, n + 1)]
    rng = rng or random.Random(0)
    for second in ("log.after_cut:1", "log.mid_rewind:1", "log.after_rewind:1"):
        for _ in range(repeats):
            cases.append([f"log.after_row:{rng.randint(3, seen['log.after_row'])}", second])
    return cases


def run_cases(
    cases: list[tuple[list[str], str]], ref: Reference, workdir: Path, jobs: int = 2, progress=None
) -> list[Result]:
    """Run ``(case, how)`` pairs, ``jobs`` at a time, each in its own run folder under ``workdir``;
    ``progress(index, result)`` is called as each ends."""
    lock = threading.Lock()

    def one(i_case):
        i, (case, how) = i_case
        res = run_case(case, ref.out, workdir / f"case{i:03d}", how)
        if progress:
            with lock:
                progress(i, res)
        return res

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, enumerate(cases)))


def totals(results: list[Result]) -> dict:
    return {
        "kills": sum(r.kills for r in results),
        "resumed": sum(r.resumed for r in results),
        "identical": sum(r.identical for r in results),
        "duplicate_log_rows": sum(r.duplicate_log_rows for r in results),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="kill -9 `mmrl train` at every fault point and at random times, "
        "and check each resume (tests/reliability/kill_harness.py)"
    )
    p.add_argument("--random", type=int, default=20, help="cases killed at a random time (default 20)")
    p.add_argument(
        "--subprocess",
        type=int,
        default=4,
        help="of those, and of two fault-point cases, run as real `python -m mmrl.cli train` subprocesses (default 4)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="cases run at once")
    p.add_argument("--workdir", type=Path, default=None, help="keep the run folders here (default: a temp dir)")
    p.add_argument(
        "--points",
        type=int,
        default=None,
        help="run only N of the fault-point cases, drawn with --seed (default: every one)",
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="tiny settings: every kind of case once or twice, in seconds, and the same final JSON "
        "line (a check that the benchmark runs, not a figure)",
    )
    args = p.parse_args(argv)
    if args.smoke:
        p.set_defaults(random=1, subprocess=1, points=4)
        args = p.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        ref = reference(workdir)
        sub = reference(workdir, "subprocess") if args.subprocess else None
        if sub is not None and compare(ref.out, sub.out):
            raise RuntimeError(f"a forked run and a subprocess differ: {compare(ref.out, sub.out)}")
        rng = random.Random(args.seed)
        points = every_point(ref, rng)
        if args.points is not None:
            points = rng.sample(points, min(args.points, len(points)))
        cases = [(c, "fork") for c in points + random_kills(args.random, args.seed, ref.seconds)]
        if sub is not None:
            cases += [
                (c, "subprocess")
                for c in (
                    [["ckpt.after_set_aside:2"], ["log.after_row:3"]]
                    + random_kills(args.subprocess, args.seed + 1, sub.seconds)
                )[: args.subprocess + 2]
            ]
        print(
            f"reference run: {ref.seconds:.1f} s forked"
            + (f", {sub.seconds:.1f} s as a subprocess" if sub else "")
            + f", {len(ref.trace)} fault points reached; {len(cases)} cases",
            flush=True,
        )

        def progress(i, r):
            print(
                f"[{i + 1}/{len(cases)}] {cases[i][1]}: {' -> '.join(r.case)}: {r.kills} kill(s), "
                f"{'ok' if r.ok else 'FAILED: ' + '; '.join(r.problems)}{''.join('; ' + n for n in r.notes)} "
                f"({r.seconds:.1f} s)",
                flush=True,
            )

        results = run_cases(cases, ref, workdir, args.jobs, progress)
        failed = [r for r in results if not r.ok]
        print(f"{len(failed)} of {len(results)} cases failed", flush=True)
    points = {c.split(":")[0] for r in results for c in r.case if not c.startswith("t=")}
    missed = sum(n.endswith("ended before its kill") for r in results for n in r.notes)
    print(
        json.dumps(
            {
                **totals(results),
                "cases": len(results),
                "failed_cases": len(failed),
                "points": len(points),
                "random_times_missed": missed,
                "wall_s": round(time.time() - t0, 1),
            }
        )
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
