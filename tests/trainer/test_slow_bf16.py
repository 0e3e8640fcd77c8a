"""The line a CPU run gets when it multiplies bf16 matrices on cores without native bf16 products
(`mmrl.utils.threads.slow_bf16`): there torch runs a scalar loop (a one-layer Qwen2.5-VL update took
243 s in bf16 on 2 AVX2 cores, 11 s in float32), and a user would otherwise only see a slow run."""

from __future__ import annotations

import pytest
import torch

from mmrl.utils.threads import slow_bf16


@pytest.fixture
def no_native_bf16(monkeypatch):
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)


def test_bf16_weights_or_autocast_on_such_a_cpu_are_said(no_native_bf16):
    bf16 = torch.nn.Linear(1000, 1000).to(torch.bfloat16)
    line = slow_bf16("cpu", bf16)
    assert line is not None and "1.0M bf16 weights" in line and "policy.dtype=float32" in line
    assert "trainer.engine.precision: bf16" in slow_bf16("cpu", torch.nn.Linear(4, 4), "bf16")
    assert slow_bf16("cpu", torch.nn.Linear(4, 4), "fp32") is None  # float32: fast everywhere
    assert slow_bf16("cuda:0", bf16, "bf16") is None  # GPUs multiply bf16 natively


def test_nothing_is_said_where_bf16_is_native(monkeypatch):
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    assert slow_bf16("cpu", torch.nn.Linear(4, 4).to(torch.bfloat16), "bf16") is None


def test_a_training_run_says_it_before_any_work(no_native_bf16, tmp_path, capsys):
    from mmrl.experiment import build_trainer, load_experiment
    from tests.reliability.kill_harness import TINY

    over = [*TINY, f"run.output_dir={tmp_path}", "trainer.iterations=0", "trainer.engine.precision=bf16"]
    trainer = build_trainer(load_experiment("configs/quickstart.yaml", over))
    trainer.run()
    out = capsys.readouterr().out
    assert "warning: trainer.engine.precision: bf16 on a CPU without native bf16" in out
    assert out.index("without native bf16") < out.index("held-out success")
