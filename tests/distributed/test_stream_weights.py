"""Weight sync from shards (issue 29): the tiny SmolVLM with LoRA sharded by FSDP2 over 2 ranks
streams its merged weights tensor by tensor, gathering each shard whole when its turn comes
(`mmrl.policies.vlm.stream_weights`, what the vLLM engine is fed), and they are peft's
``merge_and_unload`` of the unsharded model, bit for bit (`stream_worker.py`)."""

from __future__ import annotations

import json

import pytest

from tests.distributed.launch import ROOT, run, torchrun

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow


def test_sharded_lora_model_streams_peft_merged_weights():
    proc = run(torchrun("--standalone", "--nproc_per_node=2", str(ROOT / "tests" / "distributed" / "stream_worker.py")))
    out = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
    assert out["ranks"] == 2 and out["sharded_params"] > 0, out  # the weights really were sharded
    assert out["keys_match"] and out["equal"] == out["total"] > 0, out
