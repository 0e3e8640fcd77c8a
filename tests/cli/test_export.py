"""Issue 19: `mmrl export RUN --to DIR` writes a trained policy in the format its family's tools load
(the upstream `from_pretrained` gives the same outputs as the mmrl policy), with a model card; a
push to the hub is tested up to the upload call. No simulator is built."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from mmrl.cli import main
from mmrl.experiment import build_trainer, load_experiment
from tests.trainer.test_trainer import tiny_cfg
from tests.trainer.test_vlm_training import TINY as VLM_TINY


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("vlm")
    cfg = load_experiment(
        "configs/vlm_quickstart.yaml",
        [
            f"run.output_dir={out}",
            "run.name=v",
            *VLM_TINY,
            "trainer.iterations=1",
            "policy.finetune=lora",
            "policy.reference=adapter",
            "policy.lora_rank=4",
        ],
    )
    trainer = build_trainer(cfg)
    trainer.run()
    return out / "v", trainer.policy


def logits(model, tokenizer):
    ids = tokenizer("how many red squares are there?", return_tensors="pt").input_ids
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_a_lora_vlm_exports_merged_for_transformers_and_as_a_peft_adapter(lora_run, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from mmrl.policies.vlm import VLMConfig, load_vlm

    run, policy = lora_run
    policy.eval()
    want = logits(policy.model, policy.tokenizer)
    assert main(["export", str(run), "--to", str(tmp_path / "merged")]) == 0
    merged = AutoModelForImageTextToText.from_pretrained(tmp_path / "merged").eval()
    processor = AutoProcessor.from_pretrained(tmp_path / "merged")
    assert torch.allclose(logits(merged, processor.tokenizer), want, atol=1e-5)
    card = (tmp_path / "merged" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers\n") and "## Held-out evaluation" in card
    assert "| final |" in card and "finetune: lora" in card

    assert main(["export", str(run), "--to", str(tmp_path / "adapter"), "--adapter"]) == 0
    assert (tmp_path / "adapter" / "adapter_config.json").exists()
    assert not (tmp_path / "adapter" / "model.safetensors").exists()  # the adapter alone, not the base
    base, _ = load_vlm(VLMConfig(model="tiny"))
    assert not torch.allclose(logits(base, processor.tokenizer), want, atol=1e-3)  # training changed it
    adapted = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    assert torch.allclose(logits(adapted, processor.tokenizer), want, atol=1e-5)
    assert "library_name: peft" in (tmp_path / "adapter" / "README.md").read_text()


def test_other_families_export_safetensors_that_load_back(tmp_path, capsys):
    from safetensors.torch import load_file

    import mmrl

    trainer = build_trainer(tiny_cfg(tmp_path, "trainer.video_episodes=0"))
    trainer.run()
    capsys.readouterr()
    assert main(["export", str(tmp_path / "t"), "--to", str(tmp_path / "y"), "--adapter"]) == 0
    assert "note: --adapter wrote the whole model (mmrl (safetensors" in capsys.readouterr().out  # said, not ignored
    card = (tmp_path / "y" / "README.md").read_text()
    assert "RL-fine-tuned with mmrl " in card and "github.com/mmrl" not in card  # no placeholder link
    assert main(["export", str(tmp_path / "t"), "--to", str(tmp_path / "x")]) == 0
    weights = load_file(str(tmp_path / "x" / "model.safetensors"))
    mine = trainer.policy.state_dict()
    assert weights.keys() == mine.keys() and all(torch.equal(weights[k], mine[k]) for k in mine)
    assert json.loads((tmp_path / "x" / "mmrl_policy.json").read_text())["type"] == "flow_vla"
    assert mmrl.load_policy(tmp_path / "t").build_spec["type"] == "flow_vla"
    exported = mmrl.load_policy(tmp_path / "x").state_dict()  # the exported folder loads back as the policy
    assert exported.keys() == mine.keys() and all(torch.equal(exported[k], mine[k]) for k in mine)


def test_push_to_hub_uploads_the_folder(tmp_path, monkeypatch):
    import huggingface_hub

    calls = []
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", lambda self, repo, **k: calls.append(("create", repo, k)))
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", lambda self, **k: calls.append(("upload", k)))
    build_trainer(tiny_cfg(tmp_path, "trainer.video_episodes=0", "trainer.iterations=1")).run()
    assert main(["export", str(tmp_path / "t"), "--to", str(tmp_path / "x"), "--push-to-hub", "me/reach"]) == 0
    assert calls[0] == ("create", "me/reach", {"private": True, "exist_ok": True})
    assert calls[1][0] == "upload" and calls[1][1]["repo_id"] == "me/reach"
    assert calls[1][1]["folder_path"] == str(tmp_path / "x")
