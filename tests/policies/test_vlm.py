"""The VLM policy on a tiny random-weight SmolVLM (real Idefics3 classes): rollout log-probs equal
the teacher-forced recomputation (ratio 1), LoRA leaves the vision tower alone and its reference is
the adapter switched off, SFT learns, prompts that would be truncated fail at load, pixel tensors
of different sizes collate."""

import pytest
import torch

pytest.importorskip("transformers")

from mmrl.policies.vlm import VLMConfig, VLMPolicy, collate_pixels, lora_targets, stream_weights
from mmrl.simulator import Completions
from simulators.qa import QASim

KW = dict(dataset="shapes_vqa", dataset_kwargs={"num_samples": 16, "tasks": ["count"]})


@pytest.fixture(scope="module")
def sim():
    return QASim(num_envs=4, **KW)


def make(sim, **kw):
    torch.manual_seed(0)
    return VLMPolicy(VLMConfig(model="tiny", max_new_tokens=6, max_prompt_tokens=64, **kw), action_dim=sim.action_dim)


def test_rollout_logp_equals_recomputation_and_actions_carry_the_text(sim):
    pol = make(sim)
    obs = sim.reset([0, 0, 1, 1])
    batch, answers = pol.rollout(obs, torch.Generator().manual_seed(0))
    mask = batch["completion_mask"]
    assert mask.shape == (4, 6) and mask.any(1).all() and (mask[:, :-1] >= mask[:, 1:]).all()  # prefix masks
    out = pol.evaluate(batch)
    diff = ((out.logp - batch["old_logp"]).abs() * mask).max()
    assert diff < 1e-4, diff
    assert torch.isfinite(out.entropy) and out.entropy > 0
    assert isinstance(answers, Completions) and "actions" not in batch  # text, not floats
    lengths = answers.num_tokens
    ids = [batch["completion"][i, : lengths[i]].tolist() for i in range(4)]
    assert list(answers) == [pol.tokenizer.decode(t, skip_special_tokens=True) for t in ids]
    assert lengths == mask.sum(1).tolist()
    pol.sync_rollout()  # the per-iteration cache is released
    with pytest.raises(RuntimeError, match="cache"):
        pol.evaluate(batch)


def test_recompute_mode_logs_the_mismatch_and_tis_weights(sim):
    pol = make(sim, recompute_logp=True, tis_cap=2.0)
    batch = pol.rollout(sim.reset([0, 0, 1, 1]), torch.Generator().manual_seed(1)).batch
    stats = pol.rollout_stats()
    assert stats["logp_mismatch_max"] < 1e-4
    m = batch["completion_mask"]
    assert torch.allclose(batch["is_weight"][m], torch.ones(int(m.sum())), atol=1e-4)


def test_eval_rollouts_are_greedy_and_reproducible(sim):
    pol = make(sim)
    obs = sim.reset([3, 4, 5, 6])
    a = pol.rollout(obs, torch.Generator().manual_seed(0), mode="eval").batch["completion"]
    b = pol.rollout(obs, torch.Generator().manual_seed(9), mode="eval").batch["completion"]
    assert torch.equal(a, b)


def test_lora_skips_the_vision_tower_and_its_reference_is_the_base_model(sim):
    pol = make(sim, finetune="lora", reference="adapter", lora_rank=4)
    names = lora_targets(pol._lm())
    assert names and not any("vision_model" in n for n in names) and not any(n.endswith("lm_head") for n in names)
    trainable = [n for n, p in pol.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    batch = pol.rollout(sim.reset([0, 0, 1, 1]), torch.Generator().manual_seed(0)).batch
    m = batch["completion_mask"]
    # peft initialises B = 0: before training the adapter changes nothing, so ref == policy
    assert ((batch["ref_logp"] - batch["old_logp"]).abs() * m).max() < 1e-4
    opt = torch.optim.SGD([p for p in pol.parameters() if p.requires_grad], lr=1.0)
    (-pol.evaluate(batch).logp[m].sum()).backward()
    opt.step()
    entries = [pol._cache[u] for u in batch["uid"].tolist()]
    after = pol._forward_logp(entries, batch["completion"], m)[0]
    ref = pol.reference_logp(entries, batch["completion"], m)
    assert ((after - batch["old_logp"]).abs() * m).max() > 1e-3  # the adapter moved
    assert ((ref - batch["ref_logp"]).abs() * m).max() < 1e-4  # the reference did not


def test_sft_lowers_the_loss(sim, supervised_steps):
    pol = make(sim)
    data = {"prompt": sim.prompts[:8], "images": sim.images[:8], "solution": sim.solutions[:8]}
    batch = pol.warm_start_batch(data)
    losses = supervised_steps(pol, batch, torch.optim.Adam(pol.parameters(), lr=3e-3), 30)
    assert losses[-1] < 0.5 * losses[0], losses


def test_a_prompt_that_would_be_truncated_fails_at_load_naming_it(sim):
    pol = make(sim)
    pol.cfg.max_prompt_tokens = 20
    with pytest.raises(ValueError, match=r"question 0 of 'shapes_vqa' \(train\) needs \d+ prompt tokens"):
        pol.check_simulator(sim)


def test_collate_pads_pixel_tensors_of_different_sizes():
    a = {"prompt_ids": torch.ones(3), "pixel_values": torch.ones(1, 1, 3, 4, 4), "grid": torch.tensor([[1, 2, 2]])}
    b = {
        "prompt_ids": torch.ones(5),
        "pixel_values": torch.full((1, 2, 3, 2, 6), 2.0),
        "grid": torch.tensor([[1, 4, 4]]),
    }
    out = collate_pixels([a, b], "cpu", torch.float32)
    assert out["pixel_values"].shape == (2, 2, 3, 4, 6) and "prompt_ids" not in out
    assert out["pixel_values"][0, 1].abs().sum() == 0 and out["pixel_values"][1, :, :, 2:].abs().sum() == 0
    assert out["pixel_values"][0, 0, :, :4, :4].eq(1).all() and out["pixel_values"][0, 0, :, :, 4:].eq(0).all()
    assert out["grid"].tolist() == [[1, 2, 2], [1, 4, 4]] and out["grid"].dtype == torch.long


def test_streamed_weights_are_peft_merge_and_unload_exactly(sim):
    """The weights a sync streams tensor by tensor (`stream_weights`: base + peft's delta per LoRA
    layer, no copy of the model) are the state dict of peft's ``merge_and_unload`` on a copy."""
    import copy

    pol = make(sim, finetune="lora")
    with torch.no_grad():  # a trained adapter: lora_B starts at zero, which would hide a missed merge
        for name, p in pol.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    expected = copy.deepcopy(pol.model).merge_and_unload().state_dict()
    streamed = list(stream_weights(pol.model))
    assert [k for k, _ in streamed] == list(expected)
    assert all(torch.equal(v, expected[k]) for k, v in streamed)
    base = {k.replace(".base_layer.", "."): v for k, v in pol.model.get_base_model().state_dict().items()}
    changed = [k for k, v in streamed if not torch.equal(v, base[k])]  # the LoRA layers' weights, deltas added
    adapted = [n for n, _ in pol.model.get_base_model().named_modules() if n.endswith(".base_layer")]
    assert len(changed) == len(adapted) == 15 and all(k.endswith(".weight") for k in changed)
    # a rollout engine holding its own copy (disaggregated) takes the stream tensor by tensor
    from mmrl.engines.hf_engine import HFEngine

    engine = HFEngine(copy.deepcopy(pol.model).unload(), pol.processor, shares_trainer_weights=False)
    engine.load_weights(stream_weights(pol.model))
    assert all(torch.equal(v, expected[k]) for k, v in engine.model.state_dict().items())
