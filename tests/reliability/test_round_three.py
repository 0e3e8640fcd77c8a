"""Issue 32 (bad inputs round three: export, eval, user code and data files): every command-line
case is one `error:` line (exit 2) holding the words it names, no traceback, and a `train` case
trains and writes nothing. The cases live in cases_export.py, cases_user_code.py and cases_data.py;
`CLI_CASES` is also a table of docs/bad_inputs.md (`python scripts/bad_input_table.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability import cases_data, cases_export, cases_user_code
from tests.reliability.test_bad_inputs import (
    assert_one_clear_line,
    trained,  # noqa: F401  (the shared trained-run fixture)
)

TABLE_TITLE = "Issue 32: export, eval, user code and data files"
MODULES = (cases_export, cases_user_code, cases_data)
CLI_CASES = [case for module in MODULES for case in module.CASES]


def prepare(tmp: Path, out: Path) -> None:
    for module in MODULES:
        module.prepare(tmp, out)


@pytest.mark.parametrize("case,argv,words", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_bad_input_is_one_clear_line(case, argv, words, trained, tmp_path, capsys):  # noqa: F811
    prepare(tmp_path, trained)
    assert_one_clear_line(argv, words, trained, tmp_path, capsys)
