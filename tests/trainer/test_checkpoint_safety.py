"""Checkpoints survive the faults that used to lose work (issue 18): a fresh start in a folder
holding a longer run, a kill between the two renames of a second save of one iteration, an empty
``latest`` pointer, a corrupted newest ``state.pt``, a kill during the warm start. After each, the
same command resumes from the newest complete checkpoint, ends at the parameters of an
uninterrupted run, and ``metrics.jsonl`` holds no row twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mmrl.experiment import build_trainer
from mmrl.trainer import checkpoint as ckpt
from tests.trainer.test_trainer import params, tiny_cfg


def run(tmp_path, *extra):
    trainer = build_trainer(tiny_cfg(tmp_path, "trainer.video_episodes=0", *extra))
    trainer.run()
    return trainer


def rows(tmp_path) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]


def assert_no_duplicate_rows(tmp_path):
    keys = [(r["step"], tuple(sorted(r))) for r in rows(tmp_path)]
    assert len(keys) == len(set(keys)), "a metrics row was logged twice"


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted 3-iteration run every faulted run must end at."""
    path = tmp_path_factory.mktemp("straight")
    return params(run(path, "trainer.iterations=3").policy)


def same(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_fresh_start_in_a_used_folder_moves_the_old_run_aside(tmp_path, straight):
    run(tmp_path, "trainer.iterations=5")  # a longer run: iter_000004, iter_000005
    trainer = run(tmp_path, "trainer.iterations=3", "trainer.resume=false")
    folders = sorted(p.name for p in (tmp_path / "t" / "checkpoints").iterdir() if p.is_dir())
    assert folders == ["iter_000002", "iter_000003"]  # the new run's, none deleted by the old ones
    assert (tmp_path / "t" / "checkpoints" / "latest").read_text() == "iter_000003"
    assert (tmp_path / "t" / "previous_0" / "checkpoints" / "iter_000005" / "state.pt").exists()
    assert same(params(trainer.policy), straight)
    assert max(r["step"] for r in rows(tmp_path)) == 3
    assert_no_duplicate_rows(tmp_path)


def test_kill_between_the_renames_of_a_second_save_keeps_the_iteration(tmp_path, monkeypatch, straight):
    run(tmp_path, "trainer.iterations=2")  # iter_000002 saved (periodic, then final)
    real = Path.rename

    def killed(self, target):  # the old folder moved aside, then the process dies
        real(self, target)
        if str(target).endswith(".replaced"):
            raise KeyboardInterrupt("killed between the renames")

    trainer = build_trainer(tiny_cfg(tmp_path, "trainer.video_episodes=0", "trainer.iterations=2"))
    trainer.resume()  # at iteration 2: the next save replaces iter_000002
    monkeypatch.setattr(Path, "rename", killed)
    with pytest.raises(KeyboardInterrupt):
        trainer.save()
    monkeypatch.setattr(Path, "rename", real)
    trainer.close()  # the killed process's lock on the run folder goes with it
    root = tmp_path / "t" / "checkpoints"
    assert not (root / "iter_000002").exists() and (root / ".iter_000002.replaced").exists()
    assert ckpt.latest_path(tmp_path / "t") == root / ".iter_000002.replaced"
    trainer = run(tmp_path, "trainer.iterations=3")
    assert trainer.state.iteration == 3 and same(params(trainer.policy), straight)
    assert_no_duplicate_rows(tmp_path)


def test_empty_latest_pointer_and_a_corrupt_newest_state_fall_back(tmp_path, capsys, straight):
    run(tmp_path, "trainer.iterations=2")
    root = tmp_path / "t" / "checkpoints"
    (root / "latest").write_text("")  # what a power loss can leave
    newest = root / "iter_000002" / "state.pt"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte
    newest.write_bytes(bytes(data))
    trainer = run(tmp_path, "trainer.iterations=3")
    out = capsys.readouterr().out
    assert "skipping checkpoint iter_000002" in out and "does not match its checksum" in out
    assert "resumed from checkpoint iter_000001" in out
    assert same(params(trainer.policy), straight)
    assert_no_duplicate_rows(tmp_path)


def test_every_checkpoint_unreadable_is_one_clear_error(tmp_path):
    run(tmp_path, "trainer.iterations=1")
    for state in (tmp_path / "t" / "checkpoints").glob("iter_*/state.pt"):
        state.write_bytes(b"garbage")
    with pytest.raises(ckpt.CheckpointError, match="could be loaded.*Fix: remove the folder"):
        run(tmp_path, "trainer.iterations=2")


def test_kill_during_the_warm_start_logs_it_once(tmp_path, monkeypatch):
    from mmrl.trainer.warm_start import WarmStart

    real = WarmStart.supervised

    def dies(self, data, ws):
        real(self, data, ws)
        raise KeyboardInterrupt("killed after the warm start's steps, before its checkpoint")

    monkeypatch.setattr(WarmStart, "supervised", dies)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, "trainer.iterations=1")
    monkeypatch.setattr(WarmStart, "supervised", real)
    assert any(r["step"] < 0 for r in rows(tmp_path))  # the warm start had logged
    run(tmp_path, "trainer.iterations=1")
    assert_no_duplicate_rows(tmp_path)


def test_a_checkpoint_is_complete_when_it_is_in_place(tmp_path):
    run(tmp_path, "trainer.iterations=1")
    folder = tmp_path / "t" / "checkpoints" / "iter_000001"
    marker = json.loads((folder / ckpt.MARKER).read_text())["files"]
    assert sorted(marker) == ["model.safetensors", "state.pt"]
    for name, want in marker.items():
        assert want["bytes"] == (folder / name).stat().st_size and len(want["sha256"]) == 64
    assert ckpt.verify(folder) is None
    for name in marker:  # either file truncated
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[:-10])
        assert "checksum" in ckpt.verify(folder) and name in ckpt.verify(folder)
        (folder / name).write_bytes(data)
    assert ckpt.verify(folder) is None
    (folder / "model.safetensors").unlink()
    assert "model.safetensors is missing" in ckpt.verify(folder)


def test_a_folder_without_its_completion_marker_is_not_a_checkpoint(tmp_path):
    """COMPLETE is written last, before the rename into place: a folder without it (or with a
    state.pt of another format) is named as unusable, never loaded."""
    run(tmp_path, "trainer.iterations=1")
    folder = tmp_path / "t" / "checkpoints" / "iter_000001"
    (folder / ckpt.MARKER).rename(tmp_path / "marker")
    assert "COMPLETE is missing" in ckpt.verify(folder)
    (tmp_path / "marker").rename(folder / ckpt.MARKER)
    assert ckpt.verify(folder) is None
    data = torch.load(folder / "state.pt", weights_only=False)
    torch.save({**data, "format": 1}, folder / "state.pt")
    with pytest.raises(ckpt.UnreadableFile, match="not a checkpoint of format 2"):
        ckpt.read(folder)


def test_resume_hashes_the_newest_checkpoint_once(tmp_path, monkeypatch):
    """build_trainer verifies the newest checkpoint (to compare configs) under the run's lock; the
    resume then loads it without hashing its files again (seconds for a VLA's weights)."""
    run(tmp_path, "trainer.iterations=1")
    hashed = []
    real = ckpt._sha256
    monkeypatch.setattr(ckpt, "_sha256", lambda f: hashed.append(Path(f).name) or real(f))
    trainer = build_trainer(tiny_cfg(tmp_path, "trainer.video_episodes=0", "trainer.iterations=1"))
    trainer.resume()
    assert trainer.state.iteration == 1
    # each file once (config.yaml, a few KB: against the config COMPLETE records, `recorded_config`)
    assert sorted(hashed) == ["config.yaml", "model.safetensors", "state.pt"]
    trainer.close()


def tensorboard_scalars(out: Path, run: str = "") -> dict[tuple[str, int], list[float]]:
    """Every scalar point TensorBoard shows for the run (purges applied, as its reader does); ``run``:
    a phase's own TensorBoard run (``tb/warm_start``)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tb" / run), size_guidance={"scalars": 0}).Reload()
    points: dict[tuple[str, int], list[float]] = {}
    for tag in events.Tags()["scalars"]:
        for e in events.Scalars(tag):
            points.setdefault((tag, e.step), []).append(e.value)
    return points


def test_tensorboard_shows_each_point_once_after_a_kill_between_two_saves(tmp_path, monkeypatch):
    """The last iteration is trained (logged at step 2), saved, evaluated (logged at step 2), saved
    again; a kill between the two saves makes the resumed run evaluate again. TensorBoard then holds
    exactly metrics.jsonl's scalars: each (tag, step) once, with the row's value (the training row of
    step 2, logged before the checkpoint, and the redone evaluation included)."""
    real, replaced = Path.rename, []

    def killed(self, target):  # iteration 2's second save sets the first aside, then the process dies
        real(self, target)
        if str(target).endswith(".replaced"):
            replaced.append(target)
            if len(replaced) == 2:  # (the first: iteration 0's second save, after the first evaluation)
                raise KeyboardInterrupt("killed between the two saves of iteration 2")

    monkeypatch.setattr(Path, "rename", killed)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, "trainer.iterations=2", "trainer.checkpoint_every=1")
    monkeypatch.setattr(Path, "rename", real)
    at_2 = [r for r in rows(tmp_path) if r["step"] == 2]
    assert any(k.startswith("eval/") for r in at_2 for k in r) and any(k.startswith("train/") for r in at_2 for k in r)
    run(tmp_path, "trainer.iterations=2", "trainer.checkpoint_every=1")
    assert_no_duplicate_rows(tmp_path)
    logged = rows(tmp_path)
    for phase, step_key in (("", "step"), ("warm_start", "phase_step")):  # the RL run, the warm start's run
        want = {
            (k, r[step_key]): v
            for r in logged
            if r.get("phase", "") == phase
            for k, v in r.items()
            if k not in ("step", "phase", "phase_step") and isinstance(v, (int, float))
        }
        assert want and (phase or any(k.startswith("train/") and step == 2 for k, step in want))
        points = tensorboard_scalars(tmp_path / "t", phase)
        twice = {key: values for key, values in points.items() if len(values) > 1}
        assert not twice, f"TensorBoard shows these points more than once: {sorted(twice)[:5]}"
        assert points.keys() == want.keys(), sorted(set(points) ^ set(want))[:5]
        assert all(points[key][0] == pytest.approx(want[key], rel=1e-6) for key in want)
