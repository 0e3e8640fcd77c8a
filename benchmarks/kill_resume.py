"""kill -9 `mmrl train` at every fault point at every occurrence, and at random times; after each
kill the same command must resume from the newest complete checkpoint and end bit-identical to an
uninterrupted run with no duplicate ``metrics.jsonl`` row (issue 18; tests/reliability runs a subset).

    python benchmarks/kill_resume.py                   # ~100 point kills + 20 random (~2 min on 2 cores)
    python benchmarks/kill_resume.py --random 60 --seed 3 --jobs 4 --workdir /tmp/kills
    python benchmarks/kill_resume.py --smoke           # 4 point kills, 1 random, 3 subprocess cases

The run is the quickstart shrunk to ~1.5 s (6 iterations, a checkpoint every 2, 2 kept:
`tests.reliability.kill_harness.TINY`). Every case runs in its own folder: one or two runs killed (at a
hook point of `mmrl.utils.faults`, or from outside after a random time), then the same command
without a fault. Checked after each kill: the run died by SIGKILL; no complete checkpoint was lost;
the next run says it resumed from the newest complete checkpoint (read independently from the
``COMPLETE`` markers); the case ends with the same checkpoints (weights, optimizer, torch RNG,
counters), results and log rows (timings aside) as the uninterrupted run. Runs are forked from a
forkserver that imported torch once; ``--subprocess`` cases are real ``python -m mmrl.cli train``.

Progress lines, one per case, then one JSON line: ``kills`` (runs that died by SIGKILL), ``resumed``
(kills after which the next run resumed from the newest complete checkpoint), ``identical`` (kills in
cases that ended identical to the uninterrupted run), ``duplicate_log_rows`` (in the final logs),
plus ``cases``, ``failed_cases``, ``points`` (distinct fault points hit) and ``wall_s``. Exit status 1
if any case failed.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.reliability.kill_harness import main  # test machinery: not in the wheel

if __name__ == "__main__":  # the guard matters: forked runs re-import this file as __mp_main__
    sys.exit(main())
