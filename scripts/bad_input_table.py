"""Regenerate the command-line tables of docs/bad_inputs.md: every case of each module of
`CASE_MODULES` (its `CLI_CASES`, its files made by its `prepare(tmp, trained)`) run in-process, with
the one line a user sees; one table per module, under its `TABLE_TITLE`.

    .venv/bin/python scripts/bad_input_table.py > /tmp/table.md
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mmrl.cli import main
from mmrl.experiment import build_trainer
from tests.trainer.test_trainer import tiny_cfg

#: the test modules whose CLI_CASES make the tables, in the order of docs/bad_inputs.md
CASE_MODULES = (
    "tests.reliability.test_bad_inputs",
    "tests.reliability.test_round_three",
    "tests.reliability.test_settings",
)


def run_cases(module: str) -> list[tuple[str, str]]:
    mod = importlib.import_module(module)
    cli_cases, prepare = mod.CLI_CASES, mod.prepare
    rows = []
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            build_trainer(tiny_cfg(d / "trained", "trainer.video_episodes=0")).run()
        trained = d / "trained" / "t"
        for i, (case, argv, _) in enumerate(cli_cases):
            tmp = d / f"case{i}"
            tmp.mkdir()
            prepare(tmp, trained)
            argv = [a.replace("{out}", str(trained)).replace("{tmp}", str(tmp)) for a in argv]
            if argv[0] == "train" and not any("run.output_dir" in a for a in argv):
                argv.insert(2, f"run.output_dir={tmp}")
            err = io.StringIO()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                rc = main(argv)
            line = next((ln for ln in err.getvalue().splitlines() if ln.startswith("error:")), "(no error line)")
            rows.append((case, f"{line.replace(str(d), '/tmp/x')} (exit {rc})"))
    return rows


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for module in CASE_MODULES:
        print(f"### {importlib.import_module(module).TABLE_TITLE}\n")
        print("| case | what the user sees |")
        print("|---|---|")
        for case, line in run_cases(module):
            print(f"| {case} | `` {line.replace('|', '/')} `` |")
        print()
