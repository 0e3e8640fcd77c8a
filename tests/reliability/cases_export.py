"""Issue 32's command-line cases (export, eval and the run folder): (case, `mmrl` arguments, words
the one `error:` line must hold), run by tests/reliability/test_round_three.py and tabled in
docs/bad_inputs.md by scripts/bad_input_table.py. {out}: a 2-iteration tiny quickstart run folder;
{tmp}: a fresh folder that `prepare` fills."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.reliability.test_bad_inputs import QUICK

CASES: list[tuple[str, list[str], list[str]]] = [
    (
        "export into one of the run's checkpoints",
        ["export", "{out}", "--to", "{out}/checkpoints/iter_000002"],
        ["inside a run's checkpoints", "give a folder outside the run's checkpoints/"],
    ),
    (
        "export into a checkpoint's subfolder, with --force",
        ["export", "{out}", "--to", "{out}/checkpoints/iter_000002/hf", "--force"],
        ["inside a run's checkpoints"],
    ),
    (
        "export into a folder that is not empty",
        ["export", "{out}", "--to", "{tmp}/full"],
        ["is a folder that is not empty", "add --force"],
    ),
    ("export onto a file", ["export", "{out}", "--to", "{tmp}/model.txt"], ["is a file, not a folder"]),
    (
        "run.name that is a path (../x)",
        ["train", *QUICK, "run.name=../x"],
        ["'name' = '../x' is not a folder name", "run.output_dir=PATH"],
    ),
    (
        "eval of an older mmrl's checkpoint whose config.yaml is broken",
        ["eval", "{tmp}/old_format"],
        ["config.yaml cannot be read", "restore the file", "mmrl eval CONFIG checkpoint=PATH"],
    ),
]


def prepare(tmp: Path, out: Path) -> None:
    """``model.txt``: a file; ``full/``: a folder with a file in it; ``old_format/``: a checkpoint of
    the trained run as an older mmrl wrote it (no config recorded in COMPLETE), its config.yaml then
    broken."""
    (tmp / "model.txt").write_text("a file where the export's folder would go")
    (tmp / "full").mkdir(exist_ok=True)
    (tmp / "full" / "notes.txt").write_text("the user's own file")
    old = tmp / "old_format"
    shutil.copytree(out / "checkpoints" / "iter_000002", old)
    marker = json.loads((old / "COMPLETE").read_text())
    marker.pop("config", None), marker.pop("config_sha256", None)
    (old / "COMPLETE").write_text(json.dumps(marker))
    (old / "config.yaml").write_text("policy: {dim: 16\ntrainer: [")
