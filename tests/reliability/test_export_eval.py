"""Issue 32, export / eval / resume: nothing lost (an export never overwrites a checkpoint or a
user's folder), nothing silent (an older checkpoint used, a report written, log rows lost: each is
said), and resume no stricter than it must be (a renamed run folder, an edited or broken
``config.yaml`` beside intact weights)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from mmrl.cli import main
from mmrl.experiment import build_trainer
from tests.trainer.test_trainer import tiny_cfg


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2-iteration tiny run (checkpoints iter_000001 and iter_000002); tests copy it to change it."""
    out = tmp_path_factory.mktemp("trained")
    build_trainer(tiny_cfg(out, "trainer.video_episodes=0", "trainer.keep_checkpoints=3")).run()
    return out / "t"


def copy_run(trained: Path, dest: Path) -> Path:
    shutil.copytree(trained, dest)
    return dest


def tree_hash(folder: Path) -> dict:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(folder.rglob("*"))
    }


def test_a_refused_export_changes_nothing_on_disk(trained, tmp_path, capsys):
    run = copy_run(trained, tmp_path / "run")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    (tmp_path / "model.txt").write_text("a file")
    before = tree_hash(tmp_path)
    for to, force in (
        (run / "checkpoints" / "iter_000002", False),  # the case: it overwrote model.safetensors
        (run / "checkpoints" / "iter_000001", True),  # --force never reaches into checkpoints
        (run / "checkpoints", True),
        (tmp_path / "mine", False),
        (tmp_path / "model.txt", False),
    ):
        argv = ["export", str(run), "--to", str(to), *(["--force"] if force else [])]
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert len([ln for ln in err.splitlines() if ln.startswith("error:")]) == 1 and "Traceback" not in err
    assert tree_hash(tmp_path) == before
    # the checkpoints still verify and resume
    from mmrl.trainer import checkpoint

    assert checkpoint.latest_path(run).name == "iter_000002"


def test_export_with_force_writes_into_a_folder_and_keeps_other_files(trained, tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    assert main(["export", str(trained), "--to", str(tmp_path / "mine"), "--force"]) == 0
    assert (tmp_path / "mine" / "model.safetensors").exists() and (tmp_path / "mine" / "notes.txt").exists()
    assert main(["export", str(trained), "--to", str(tmp_path / "empty")]) == 0  # a new folder needs nothing


def test_eval_and_export_say_when_they_pass_over_a_corrupt_newest_checkpoint(trained, tmp_path, capsys):
    run = copy_run(trained, tmp_path / "run")
    weights = run / "checkpoints" / "iter_000002" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)  # same size, other bytes
    assert main(["eval", str(run)]) == 0
    err = capsys.readouterr().err
    assert "warning: using iter_000001, not the newer iter_000002:" in err and "checksum" in err
    assert json.loads((run / "eval_report.json").read_text())["checkpoint"].endswith("iter_000001")
    assert main(["export", str(run), "--to", str(tmp_path / "x")]) == 0
    assert "warning: using iter_000001, not the newer iter_000002" in capsys.readouterr().err


def test_eval_of_another_runs_checkpoint_writes_its_report_there(trained, tmp_path, capsys):
    other = copy_run(trained, tmp_path / "other")
    (other / "eval_report.json").unlink(missing_ok=True)
    config = trained / "checkpoints" / "iter_000002" / "config.yaml"
    mine = tmp_path / "mine"
    argv = ["eval", str(config), f"run.output_dir={mine}", "run.name=m", f"checkpoint={other}"]
    assert main(argv) == 0
    assert f"report: {other / 'eval_report.json'}" in capsys.readouterr().out
    assert (other / "eval_report.json").exists() and not (mine / "m").exists()


def test_the_model_card_of_an_older_checkpoint_shows_no_later_results(trained, tmp_path, capsys):
    run = copy_run(trained, tmp_path / "run")
    results = json.loads((run / "results.json").read_text())
    assert results["final"]["iteration"] == 2
    assert main(["export", str(run / "checkpoints" / "iter_000001"), "--to", str(tmp_path / "e1")]) == 0
    card = (tmp_path / "e1" / "README.md").read_text()
    assert "| final |" not in card and "| start |" in card
    assert "RL iteration 1) was not evaluated" in card
    assert main(["export", str(run), "--to", str(tmp_path / "e2")]) == 0  # the newest: its final results
    card = (tmp_path / "e2" / "README.md").read_text()
    assert "| final |" in card and "not evaluated" not in card


def test_a_run_folder_copied_under_a_new_name_resumes(trained, tmp_path, capsys):
    copy_run(trained, tmp_path / "renamed")
    trainer = build_trainer(tiny_cfg(tmp_path, "trainer.video_episodes=0", "run.name=renamed", "trainer.iterations=3"))
    results = trainer.run()
    assert results["final"]["iteration"] == 3
    assert "resumed" in capsys.readouterr().out.lower()


@pytest.mark.parametrize("damage", ["edited", "broken"])
def test_an_edited_or_broken_config_yaml_is_said_and_never_blocks_a_resume(trained, tmp_path, capsys, damage):
    run = copy_run(trained, tmp_path / "t")
    saved = run / "checkpoints" / "iter_000002" / "config.yaml"
    if damage == "edited":  # someone "changes the lr" there: not what the weights were trained with
        saved.write_text(saved.read_text().replace("lr: ", "lr: 9", 1))
    else:
        saved.write_text("trainer: [\n")
    trainer = build_trainer(tiny_cfg(tmp_path, "trainer.video_episodes=0", "trainer.iterations=3"))
    out = capsys.readouterr().out
    assert f"warning: {saved} was changed after the checkpoint was saved" in out
    assert trainer.run()["final"]["iteration"] == 3  # resumed from iter_000002, not refused
    assert main(["eval", str(run / "checkpoints" / "iter_000003")]) == 0


@pytest.mark.parametrize("damage", ["deleted", "cut short"])
def test_a_resume_says_when_the_log_lost_rows(trained, tmp_path, capsys, damage):
    run = copy_run(trained, tmp_path / "t")
    log = run / "metrics.jsonl"
    if damage == "deleted":
        log.unlink()
    else:
        log.write_bytes(log.read_bytes()[: log.stat().st_size // 2])
    build_trainer(tiny_cfg(tmp_path, "trainer.video_episodes=0", "trainer.iterations=3")).run()
    out = capsys.readouterr().out
    assert f"warning: {log} holds" in out and "deleted or cut short outside mmrl" in out
