"""Issue 32 (data and simulators): what the command-line cases of cases_data.py cannot drive. A data
line is bounded in bytes before it is parsed and must be UTF-8, each said in one line naming the file
and line; a simulator's step is checked against its contract where it enters the trainer; a full
disk at any write of a run is one line naming the newest complete checkpoint."""

from __future__ import annotations

import errno
import shutil
from types import SimpleNamespace

import pytest
import torch
from safetensors import SafetensorError

from mmrl.data import load_dataset, text_lines
from mmrl.errors import DatasetError, UserError
from mmrl.experiment import build_trainer
from mmrl.simulator import Observation, StepResult, check_step_result
from mmrl.trainer import checkpoint
from tests.trainer.test_trainer import tiny_cfg


# ---- data lines ------------------------------------------------------------------------------
def test_a_line_is_bounded_in_bytes_before_it_is_parsed(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + b"a" * 10 + b"\r\n" + b"b" * 10 + b"\n" + b"c" * 11 + b"\n" + b"d" * 50)
    lines = text_lines(f, max_bytes=10)
    assert next(lines) == (1, "a" * 10)  # exactly the limit (its BOM and "\r\n" do not count)
    assert next(lines) == (2, "b" * 10)
    with pytest.raises(ValueError, match=r"d.jsonl, line 3: 11 bytes, over the limit of 10 bytes .*max_record_bytes"):
        next(lines)
    with pytest.raises(ValueError, match=r"line 4: 50 bytes, over the limit of 20 bytes"):  # measured to its end
        list(text_lines(f, max_bytes=20))


def test_vlm_records_raises_the_line_limit_with_max_record_bytes(tmp_path):
    f = tmp_path / "qa.jsonl"
    f.write_text('{"prompt": "q", "answer": "2", "note": "' + "x" * 300 + '"}\n')
    with pytest.raises(DatasetError, match=r"qa.jsonl, line 1: 342 bytes.*max_record_bytes: 1048576"):
        load_dataset("vlm_records", path=f, max_record_bytes=341)
    assert load_dataset("vlm_records", path=f, max_record_bytes=342)["meta"][0]["note"] == "x" * 300
    with pytest.raises(DatasetError, match="max_record_bytes must be a number of bytes >= 1"):
        load_dataset("vlm_records", path=f, max_record_bytes=0)


@pytest.mark.parametrize(
    "name,file,data",
    [
        ("vlm_records", "arr.json", b'[{"prompt": "q",\n  "answer": "caf\xe9"}]'),  # one JSON array, read whole
        ("prompt_list", "p.jsonl", b'{"prompt": "a cat"}\n{"prompt": "a caf\xe9"}\n'),
    ],
)
def test_a_line_that_is_not_utf8_is_named(tmp_path, name, file, data):
    (tmp_path / file).write_bytes(data)
    with pytest.raises(DatasetError, match=rf"{file}, line 2: not UTF-8 text \(byte 0xe9 at byte \d+ of the line\)"):
        load_dataset(name, path=tmp_path / file)


# ---- simulator steps -------------------------------------------------------------------------
def _step(n: int = 4, **change) -> StepResult:
    flags = {k: torch.zeros(n, dtype=torch.bool) for k in ("terminated", "truncated", "success")}
    obs = Observation(torch.zeros(n, 8, 8, 3, dtype=torch.uint8), ["go"] * n)
    return StepResult(**{"obs": obs, "reward": torch.zeros(n), **flags, **change})


@pytest.mark.parametrize(
    "change,words",
    [
        ({"reward": torch.zeros(4, 1)}, "reward shape (4, 1) != [N] (4,)"),
        ({"reward": torch.zeros(4, dtype=torch.long)}, "reward must be float, got torch.int64"),
        ({"reward": [0.0] * 4}, "reward must be a tensor, got list"),
        ({"terminated": torch.zeros(4)}, "terminated must be bool, got torch.float32"),
        ({"truncated": torch.zeros(2, dtype=torch.bool)}, "truncated shape (2,) != [N] (4,)"),
        ({"success": torch.zeros(4, 2, dtype=torch.bool)}, "success shape (4, 2) != [N] (4,)"),
    ],
)
def test_a_step_against_the_contract_is_one_line(change, words):
    sim = SimpleNamespace(num_envs=4, image_shape=(8, 8, 3))
    check_step_result(sim, _step())  # the contract itself passes
    with pytest.raises(UserError, match="returned a step against its contract") as info:
        check_step_result(sim, _step(**change))
    assert words in str(info.value) and "N = num_envs = 4" in str(info.value)


def test_a_simulator_whose_rewards_are_not_one_per_env_fails_at_the_boundary(tmp_path):
    trainer = build_trainer(tiny_cfg(tmp_path, "trainer.video_episodes=0"))
    real = trainer.eval_sim.step_chunk
    trainer.eval_sim.step_chunk = lambda actions, **kw: StepResult(
        **{**vars(real(actions, **kw)), "reward": torch.zeros(8, 1)}
    )
    with pytest.raises(UserError, match=r"simulator ReachSim returned a step .* reward shape \(8, 1\) != \[N\] \(8,\)"):
        trainer.run()
    assert trainer.state.iteration == 0  # at its first step (the start evaluation, after the warm start)


# ---- a full disk -----------------------------------------------------------------------------
def _torch_full(*a, **k):  # what torch.save raises on a full disk: the errno is lost
    try:
        raise RuntimeError("basic_ios::clear: iostream error")
    except RuntimeError:
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 298048 vs 298000") from None


def _safetensors_full(*a, **k):
    raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


def _config_full(*a, **k):
    raise OSError(errno.ENOSPC, "No space left on device", str(a[1]))


class _FullLog:
    """metrics.jsonl on a full disk: its writes fail (as a line-buffered file's do: no filename)."""

    def __init__(self, file):
        self.file = file

    def __getattr__(self, name):
        return getattr(self.file, name)

    def write(self, row):
        raise OSError(errno.ENOSPC, "No space left on device")


def _then_full_log(trainer):
    resume = trainer.resume

    def resume_then_fill():
        resume()
        trainer.logger.jsonl = _FullLog(trainer.logger.jsonl)

    return resume_then_fill


def test_a_full_disk_at_any_write_of_a_run_is_one_line_naming_the_newest_checkpoint(tmp_path, monkeypatch):
    """Each write fails in turn as it does on a full disk; every run resumes from iter_000000 (the
    warm start's), trains an iteration and stops in one line that names it, nothing else written."""
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10 << 30, 10 << 30, 1 << 20))
    build_trainer(tiny_cfg(tmp_path, "trainer.video_episodes=0", "trainer.iterations=0")).run()
    assert checkpoint.latest_path(tmp_path / "t").name == "iter_000000"
    cases = [
        ("save_weights", _safetensors_full, "checkpoint iter_000001"),  # model.safetensors
        ("torch.save", _torch_full, "checkpoint iter_000001"),  # state.pt (the optimizer state)
        ("save_config", _config_full, "checkpoint iter_000001"),  # config.yaml
        ("log", None, "the run's logs and results"),  # metrics.jsonl
    ]
    for what, fault, writing in cases:
        trainer = build_trainer(tiny_cfg(tmp_path, "trainer.video_episodes=0"))
        with monkeypatch.context() as m:
            if what == "log":  # after the resume, which reopens the log
                m.setattr(trainer, "resume", _then_full_log(trainer))
            elif what == "torch.save":
                m.setattr(checkpoint.torch, "save", fault)
            elif what == "save_config":
                m.setattr("mmrl.config.save_config", fault)
            else:
                m.setattr(checkpoint, what, fault)
            with pytest.raises(UserError) as info:
                trainer.run()
        assert str(info.value).startswith(f"no space left on the device of {tmp_path / 't'} while writing {writing}; ")
        assert "nothing is lost: the newest complete checkpoint, iter_000000, is whole" in str(info.value), what
        assert checkpoint.latest_path(tmp_path / "t").name == "iter_000000"
