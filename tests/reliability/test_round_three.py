"""Issue 32 (bad inputs round three: export, eval, user code and data files): every command-line
case is one `error:` line (exit 2) holding the words it names, no traceback, and a `train` case
trains and writes nothing. The cases live in cases_export.py, cases_user_code.py and cases_data.py;
`CLI_CASES` is also a table of docs/bad_inputs.md (`python scripts/bad_input_table.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmrl.cli import main
from tests.reliability import cases_data, cases_export, cases_user_code
from tests.reliability.test_bad_inputs import trained  # noqa: F401  (the shared trained-run fixture)

TABLE_TITLE = "Issue 32: export, eval, user code and data files"
MODULES = (cases_export, cases_user_code, cases_data)
CLI_CASES = [case for module in MODULES for case in module.CASES]


def prepare(tmp: Path, out: Path) -> None:
    for module in MODULES:
        module.prepare(tmp, out)


@pytest.mark.parametrize("case,argv,words", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_bad_input_is_one_clear_line(case, argv, words, trained, tmp_path, capsys):  # noqa: F811
    prepare(tmp_path, trained)
    argv = [a.replace("{out}", str(trained)).replace("{tmp}", str(tmp_path)) for a in argv]
    if argv[0] == "train" and not any("run.output_dir" in a for a in argv):
        argv.insert(2, f"run.output_dir={tmp_path}")
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert rc == 2 and len(lines) == 1, err
    assert "Traceback" not in err
    for w in words:
        assert w in lines[0], lines[0]
    if argv[0] == "train":  # known before any work: nothing was trained or written
        assert not list(tmp_path.glob("*/checkpoints"))
