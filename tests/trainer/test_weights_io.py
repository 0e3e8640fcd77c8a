"""Weights in safetensors (`mmrl.utils.weights`, checkpoints' ``model.safetensors``): tied weights
written once and tied again on load, views of shared memory, non-tensor entries, nothing unpickled."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from mmrl.utils.weights import ALIASES, load_weights, read_metadata, save_weights, split_state_dict


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(7, 4)
        self.head = nn.Linear(4, 7, bias=False)
        self.head.weight = self.embed.weight  # tied, as a language model's lm_head
        self.register_buffer("table", torch.arange(12.0).reshape(3, 4))


def test_tied_weights_are_written_once_and_tied_again(tmp_path):
    model = Tied()
    sd = model.state_dict()
    assert sd["head.weight"].data_ptr() == sd["embed.weight"].data_ptr()
    assert save_weights(sd, tmp_path / "m.safetensors") == {}
    raw = load_file(str(tmp_path / "m.safetensors"))  # the plain upstream loader reads it
    assert sorted(raw) == ["embed.weight", "table"]
    assert json.loads(read_metadata(tmp_path / "m.safetensors")[ALIASES]) == {"head.weight": "embed.weight"}
    back, _ = load_weights(tmp_path / "m.safetensors")
    assert back.keys() == sd.keys() and all(torch.equal(back[k], sd[k]) for k in sd)
    assert back["head.weight"] is back["embed.weight"]
    fresh = Tied()
    fresh.load_state_dict(back)
    assert fresh.head.weight is fresh.embed.weight and torch.equal(fresh.head.weight, model.embed.weight)


def test_views_of_shared_memory_are_copied_and_non_tensors_returned(tmp_path):
    base = torch.arange(24.0).reshape(4, 6)
    sd = {
        "whole": base,
        "rows": base[1:3],
        "column": base[:, 2],
        "again": base,
        "note": "hello",
        "empty": torch.zeros(0),
        "other_empty": torch.zeros(0, 3),
    }
    tensors, aliases, others = split_state_dict(sd)
    assert aliases == {"again": "whole"} and others == {"note": "hello"}
    assert tensors["rows"].data_ptr() != base.data_ptr() and tensors["column"].is_contiguous()
    assert save_weights(sd, tmp_path / "v.safetensors") == {"note": "hello"}
    back, _ = load_weights(tmp_path / "v.safetensors")
    for k in ("whole", "rows", "column", "again", "empty", "other_empty"):
        assert torch.equal(back[k], sd[k]), k
    assert "note" not in back


def test_bf16_round_trips_exactly(tmp_path):
    sd = {"w": torch.randn(5, 3).to(torch.bfloat16)}
    save_weights(sd, tmp_path / "b.safetensors")
    back, _ = load_weights(tmp_path / "b.safetensors")
    assert back["w"].dtype == torch.bfloat16 and torch.equal(back["w"], sd["w"])


def test_a_checkpoint_holds_the_policy_in_safetensors_and_no_weights_in_its_pickle(tmp_path):
    """The checkpoint's model.safetensors alone (read by safetensors, no pickle) is the policy's state
    dict, the build spec in its metadata; state.pt holds the optimizer and RNG, not the weights."""
    from mmrl.experiment import build_trainer
    from mmrl.trainer import checkpoint
    from tests.trainer.test_trainer import tiny_cfg

    trainer = build_trainer(tiny_cfg(tmp_path, "trainer.video_episodes=0", "trainer.iterations=1"))
    trainer.run()
    folder = tmp_path / "t" / "checkpoints" / "iter_000001"
    raw = load_file(str(folder / "model.safetensors"))
    mine = trainer.policy.state_dict()
    assert raw.keys() == mine.keys() and all(torch.equal(raw[k], mine[k]) for k in mine)
    spec = json.loads(read_metadata(folder / "model.safetensors")["mmrl.policy_spec"])
    assert spec == json.loads(json.dumps(trainer.policy.build_spec))
    state = torch.load(folder / "state.pt", weights_only=False)
    assert "policy" not in state and state["format"] == 2 and state["optimizer"]["state"]
    assert checkpoint.read_weights(folder)[1] == spec


def test_a_damaged_weights_file_is_named(tmp_path):
    from mmrl.errors import UserError
    from mmrl.trainer.evaluation import load_checkpoint_policy

    (tmp_path / "state.pt").write_bytes(b"")
    torch.save({"format": 2, "extra": {}}, tmp_path / "state.pt")
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(UserError, match="model.safetensors cannot be read as an mmrl checkpoint"):
        load_checkpoint_policy(tmp_path, Tied(), cfg=None)


@pytest.mark.parametrize("extra", [[], ["policy.reference=copy", "algorithm.kl_coef=0.1"]], ids=["lora", "lora+copy"])
def test_a_lora_checkpoint_holds_the_adapter_and_resumes_exactly(tmp_path, extra):
    """A LoRA VLM run's checkpoints leave the frozen base weights to the base model (as TRL / peft
    checkpoints do): the file holds the adapter; resume and mmrl.load_policy rebuild the base and give
    the trained policy exactly; a base that changed since is refused, naming it. A frozen KL reference
    copied from the warm-started policy (reference=copy) is not the source's: it is written."""
    pytest.importorskip("transformers")
    import mmrl
    from mmrl.experiment import build_trainer, load_experiment
    from mmrl.trainer import checkpoint
    from tests.trainer.test_vlm_training import TINY

    def cfg(name, *more):
        return load_experiment(
            "configs/vlm_quickstart.yaml",
            [f"run.output_dir={tmp_path}", f"run.name={name}", *TINY, "policy.finetune=lora", *extra, *more],
        )

    straight = build_trainer(cfg("s", "trainer.iterations=2"))
    straight.run()
    first = build_trainer(cfg("r", "trainer.iterations=1"))
    first.run()
    folder = tmp_path / "r" / "checkpoints" / "iter_000001"
    saved = load_file(str(folder / "model.safetensors"))
    params = dict(first.policy.named_parameters())
    trained = {k for k, p in params.items() if p.requires_grad}
    assert trained and trained <= set(saved)  # every trained weight is written ...
    left = set(checkpoint.source_of(folder))
    reference = {k for k in params if k.startswith("ref_model.")}
    assert bool(reference) == bool(extra) and reference <= set(saved)  # refreshed after the warm start: written
    assert left and not left & set(saved)
    assert left == {k for k, p in params.items() if not p.requires_grad} - reference
    if not extra:  # the adapter, not the base: 35,840 of the tiny VLM's 190,464 weights
        assert sum(saved[k].numel() for k in saved) * 3 < sum(p.numel() for p in params.values())
    resumed = build_trainer(cfg("r", "trainer.iterations=2"))
    resumed.run()
    a, b = straight.policy.state_dict(), resumed.policy.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bit-identical to uninterrupted
    loaded = mmrl.load_policy(tmp_path / "r").state_dict()
    assert all(torch.equal(loaded[k], b[k]) for k in b)
    with pytest.raises(
        checkpoint.CheckpointError,
        match=r"trained on base weights that the policy built now "
        r"does not have: \d+ of the \d+ weights",
    ):
        build_trainer(cfg("r", "trainer.iterations=3", "policy.tiny_seed=1", "trainer.accept_config_change=true")).run()
