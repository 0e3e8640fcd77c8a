"""``kill -9`` of `mmrl train` at points chosen by hooks inside checkpoint writing and logging (each
rename, each delete, mid-file) and at random times; after each kill the same command must resume
from the newest complete checkpoint and end bit-identical to an uninterrupted run, with a
``metrics.jsonl`` free of duplicate rows (issue 18). The checks are `tests.reliability.kill_harness`'s;
the long variant (every point at every occurrence, more random times) is
``python benchmarks/kill_resume.py``, or this module's slow test with ``MMRL_KILL_RESUME_LONG=1``.

Runs are forked from a forkserver that imported torch and mmrl once (~1.5 s a run instead of ~5 s);
a few are real ``python -m mmrl.cli train`` subprocesses given the fault in ``MMRL_FAULT``."""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

import pytest

from mmrl.utils import faults
from tests.reliability import kill_harness as kh

# The tiny run saves 6 times: (1) iteration 0 after the warm start, (2) iteration 0 again after the
# first evaluation (the old folder set aside, then dropped), (3) 2, (4) 4 (rotation deletes
# iter_000000), (5) 6 (rotation deletes iter_000002), (6) 6 again after the final evaluation. It logs
# 10 rows: 2 warm-start rows, the first evaluation's (between saves 1 and 2), iterations 1-6, and the
# final evaluation's (between saves 5 and 6). `test_the_schedule_the_cases_assume` checks this.
CASES = [
    # the first save: nothing complete before it
    ["ckpt.after_tmp_mkdir:1"],
    ["ckpt.mid_state:1"],
    ["ckpt.after_rename:1"],
    # the second save of iteration 0
    ["ckpt.after_marker:2"],
    ["ckpt.after_set_aside:1"],
    ["ckpt.after_rename:2"],
    ["ckpt.after_drop_replaced:1"],
    # iterations 2 and 4
    ["ckpt.after_state:3"],
    ["ckpt.after_config:3"],
    ["ckpt.mid_latest:3"],
    ["ckpt.mid_weights:3"],
    ["ckpt.after_fsync:4"],
    ["ckpt.mid_marker:4"],
    ["ckpt.after_latest:4"],
    # rotation: before, midway through and after deleting iter_000000, then iter_000002
    ["ckpt.before_rotate:1"],
    ["ckpt.mid_rotate:1"],
    ["ckpt.mid_rotate:2"],
    ["ckpt.after_rotate:2"],
    # iteration 6: the periodic save, then the final one
    ["ckpt.after_rename:5"],
    ["ckpt.mid_state:6"],
    ["ckpt.after_set_aside:2"],
    ["ckpt.after_drop_replaced:2"],
    ["ckpt.after_latest:6"],
    # log rows: the first evaluation's, a torn one, the final evaluation's (logged after a save of its step)
    ["log.after_row:3"],
    ["log.mid_row:7"],
    ["log.after_row:10"],
    # a kill, then a kill of the run resuming it as it cuts back / rewinds a log holding rows to drop
    ["log.after_row:6", "log.after_cut:1"],
    ["ckpt.after_rename:3", "log.mid_rewind:1"],
    ["log.after_row:10", "log.after_rewind:1"],
]
RANDOM_KILLS = 4  # forked runs killed from outside at seeded random times
SUBPROCESS_CASES = [["ckpt.after_set_aside:2"], ["log.after_row:3"]]  # + 1 random-time kill


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kill")


@pytest.fixture(scope="module")
def ref(workdir) -> kh.Reference:
    return kh.reference(workdir)


def report(results: list[kh.Result]) -> str:
    return "\n".join(f"{' -> '.join(r.case)}: {'; '.join(r.problems)}" for r in results if r.problems)


def check(results: list[kh.Result], min_kills: int) -> dict:
    assert not report(results), "\n" + report(results)
    t = kh.totals(results)
    assert t["kills"] >= min_kills and t["resumed"] == t["kills"] and t["identical"] == t["kills"], t
    assert t["duplicate_log_rows"] == 0, t
    return t


# ---- the hooks themselves ----------------------------------------------------------------------
def test_every_fault_point_is_documented_placed_and_covered():
    files = ("trainer/checkpoint.py", "trainer/logging.py", "dyna.py")
    sources = "".join((kh.ROOT / "mmrl" / f).read_text() for f in files)
    placed = re.findall(r'fault_point\("([a-z_.]+)"', sources)
    assert sorted(placed) == sorted(faults.POINTS)  # each declared point is placed exactly once
    for name in faults.POINTS:
        assert f"  {name} " in faults.__doc__, f"{name} is not documented in mmrl.utils.faults"
    covered = {c.split(":")[0] for case in CASES for c in case}  # CI covers every point
    covered |= set(re.findall(r'"(dyna\.[a-z_]+):', (kh.ROOT / "tests" / "trainer" / "test_dyna.py").read_text()))
    assert covered == set(faults.POINTS) - set(faults.MULTI_RANK)  # those in tests/distributed


def test_fault_specs_are_checked():
    assert faults.parse("ckpt.after_rename:3, log.after_row") == {"ckpt.after_rename": 3, "log.after_row": 1}
    assert faults.parse("") == {} and faults.parse(None) == {}
    assert faults.parse("ckpt.mid_shard:2@1,log.after_row", rank=1) == {"ckpt.mid_shard": 2, "log.after_row": 1}
    assert faults.parse("ckpt.mid_shard:2@1,log.after_row", rank=0) == {"log.after_row": 1}
    with pytest.raises(ValueError, match="unknown fault point 'ckpt.after_renam'"):
        faults.parse("ckpt.after_renam:1")
    with pytest.raises(ValueError, match="integer >= 1"):
        faults.parse("ckpt.after_rename:0")


def test_mid_points_leave_half_a_file_or_folder(tmp_path):
    f = tmp_path / "state.pt"
    f.write_bytes(b"x" * 100)
    faults._half(f, None)
    assert f.stat().st_size == 50
    faults._half(f, 20)
    assert f.stat().st_size == 30
    d = tmp_path / "iter_000002"
    d.mkdir()
    for name in ("state.pt", "config.yaml", "COMPLETE"):
        (d / name).write_text(name)
    faults._half(d, None)
    assert sorted(p.name for p in d.iterdir()) == ["config.yaml", "state.pt"]  # the marker went first


def test_the_schedule_the_cases_assume(ref):
    seen = ref.occurrences()
    assert seen["ckpt.after_rename"] == 6 and seen["ckpt.after_set_aside"] == 2, seen
    assert seen["ckpt.before_rotate"] == 2 and seen["log.after_row"] == 10, seen
    renamed = [Path(p).name for name, p in ref.trace if name == "ckpt.after_rename"]
    assert renamed == ["iter_000000", "iter_000000", "iter_000002", "iter_000004", "iter_000006", "iter_000006"]
    assert [Path(p).name for name, p in ref.trace if name == "ckpt.before_rotate"] == ["iter_000000", "iter_000002"]


# ---- kill -9, resume, compare ------------------------------------------------------------------
def test_kill_9_anywhere_then_the_same_command_resumes_exactly(ref, workdir):
    """31 kills at hook points (every point at least once) + 4 at random times, forked runs."""
    cases = [(c, "fork") for c in CASES + kh.random_kills(RANDOM_KILLS, seed=1, seconds=ref.seconds)]
    check(kh.run_cases(cases, ref, workdir / "fork"), min_kills=30)


def test_kill_9_of_real_subprocesses(ref, workdir):
    """The real command: the fault arrives in MMRL_FAULT, or the kill comes from outside at a random time;
    a subprocess run uninterrupted ends exactly like a forked one."""
    sub = kh.reference(workdir / "subprocess", "subprocess")
    assert kh.compare(ref.out, sub.out) == []
    cases = [(c, "subprocess") for c in SUBPROCESS_CASES + kh.random_kills(1, seed=2, seconds=sub.seconds)]
    check(kh.run_cases(cases, ref, workdir / "subprocess"), min_kills=2)


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("MMRL_KILL_RESUME_LONG") != "1",
    reason="long kill -9 variant (~2 min, ~120 kills): set MMRL_KILL_RESUME_LONG=1, or run "
    "python benchmarks/kill_resume.py",
)
def test_kill_9_at_every_point_and_occurrence(ref, workdir):
    cases = kh.every_point(ref, random.Random(0)) + kh.random_kills(20, seed=3, seconds=ref.seconds)
    check(kh.run_cases([(c, "fork") for c in cases], ref, workdir / "long"), min_kills=60)
