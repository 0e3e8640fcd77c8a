"""Multi-turn episodes through the VLM policy (tiny random-weight Qwen2.5-VL): each turn's prompt is
the conversation so far rendered by the chat template with the tools' schemas (tool results, images
included, are prompt); log-probs and ``logp_mask`` cover exactly the turn's own tokens; rollout
log-probs equal the update-time recomputation (ratio 1) on turns whose context holds tool images."""

import pytest
import torch

pytest.importorskip("transformers")

from mmrl.policies.vlm import VLMConfig, VLMPolicy
from mmrl.simulator import Completions
from simulators.tool_env import ToolEnvSim

ZOOM = '<tool_call>\n{"name": "zoom", "arguments": {"x": 5, "y": 7}}\n</tool_call>'


def make(**kw):
    torch.manual_seed(0)
    cfg = dict(model="tiny-qwen2.5-vl", max_new_tokens=6, max_prompt_tokens=1000)
    return VLMPolicy(VLMConfig(**{**cfg, **kw}), action_dim=0)


@pytest.fixture(scope="module")
def second_turn():
    """The observation of every env's second turn: question image, a zoom call, its image result."""
    sim = ToolEnvSim(num_envs=4, env="zoom", dataset="zoom_vqa", dataset_kwargs={"num_samples": 8})
    sim.reset([0, 0, 1, 1])
    res = sim.step_chunk(Completions([ZOOM] * 4, [20] * 4))
    assert not res.done.any()
    return sim, res.obs


def test_the_tool_schema_from_a_typed_function_reaches_the_chat_template(second_turn):
    sim, obs = second_turn
    pol = make()
    req = pol.requests(list(obs.instruction), [[]] * 4, None, obs.messages, obs.tools)[0]
    assert '"name": "zoom"' in req.text and "column in the small image" in req.text  # the docstring
    assert req.text.count("<|image_pad|>") == 2 and len(req.images) == 2  # question image, then the crop
    assert req.text.index("<tool_response>") < req.text.rindex("<|image_pad|>")
    assert req.text.endswith("<|im_start|>assistant\n")
    pol.check_simulator(sim)  # the load-time check sees the tools rendered


def test_a_template_that_drops_tools_fails_at_load(second_turn):
    sim, _ = second_turn
    pol = make()
    from mmrl.tiny.tiny_qwen_vl import CHAT_TEMPLATE

    pol.processor.chat_template = (
        "{% for message in messages %}" + CHAT_TEMPLATE.split("{% for message in messages %}")[1]
    )
    with pytest.raises(ValueError, match=r"ignores tools=: tool\(s\) \['zoom'\]"):
        pol.check_simulator(sim)


@pytest.mark.parametrize("recompute", [False, True])
def test_ratio_is_one_before_the_first_update_on_a_multi_turn_context(second_turn, recompute):
    _, obs = second_turn
    pol = make(recompute_logp=recompute)
    batch = pol.rollout(obs, torch.Generator().manual_seed(0)).batch
    entry = pol._cache[int(batch["uid"][0])]
    assert entry["image_grid_thw"].shape[0] == 2  # both images of the conversation are replayed
    out = pol.evaluate(batch)
    m = batch["completion_mask"]
    if recompute:  # the same forward pass over the same cached inputs: bit for bit
        assert torch.equal(out.logp.cpu() * m, batch["old_logp"])
    else:  # generate's incremental decoding vs one teacher-forced pass
        assert ((out.logp.cpu() - batch["old_logp"]).abs() * m).max() < 1e-4


def test_the_loss_mask_covers_exactly_the_turns_own_tokens(second_turn):
    _, obs = second_turn
    pol = make()
    d = pol.rollout(obs, torch.Generator().manual_seed(1))
    batch = d.batch
    out = pol.evaluate(batch)
    assert torch.equal(out.logp_mask.cpu(), batch["completion_mask"])
    tok = pol.tokenizer
    for i in range(4):
        m = batch["completion_mask"][i]
        own = batch["completion"][i][m].tolist()
        assert len(own) == d.actions.num_tokens[i] and tok.pad_token_id not in own  # no padding in the loss
        assert tok.decode(own, skip_special_tokens=True) == d.actions[i]  # the turn, and nothing else
        prompt = tok.decode(pol._cache[int(batch["uid"][i])]["prompt_ids"].tolist())
        assert "<tool_response>" in prompt and ZOOM in prompt  # tool result and earlier turn: prompt
        assert prompt.endswith("<|im_start|>assistant\n")


def sft_entries(pol, data: dict) -> tuple[list[dict], torch.Tensor]:
    """The processor entries `supervised_loss` feeds the model for ``data``'s rows, and the loss."""
    seen: list[dict] = []
    forward = pol._forward_logp
    pol._forward_logp = lambda entries, *a, **k: (seen.extend(entries), forward(entries, *a, **k))[1]
    try:
        loss = pol.supervised_loss(pol.warm_start_batch(data))
    finally:
        del pol._forward_logp
    return seen, loss


def test_the_sft_prompt_of_a_conversation_row_is_the_rollout_prompt_of_that_turn(second_turn):
    _, obs = second_turn
    pol = make(system_prompt="Think, then answer.")  # the policy's system prompt goes first in both
    batch = pol.rollout(obs, torch.Generator().manual_seed(0)).batch
    rolled = [pol._cache[int(u)] for u in batch["uid"]]
    data = {"messages": obs.messages, "tools": obs.tools, "solution": ["circle", "square", "triangle", "circle"]}
    seen, loss = sft_entries(pol, data)
    assert len(seen) == 4 and torch.isfinite(loss).all()
    for r, s in zip(rolled, seen):  # byte-identical prompt ids, both images' pixels, their grids
        assert r.keys() == s.keys()
        assert all(torch.equal(r[k], s[k]) for k in r)
    prompt = pol.tokenizer.decode(seen[0]["prompt_ids"].tolist())
    assert '"name": "zoom"' in prompt and "<tool_response>" in prompt and ZOOM in prompt
    assert prompt.startswith("<|im_start|>system\nThink, then answer.")


def test_single_turn_and_conversation_rows_mix_in_one_sft_batch(second_turn):
    sim, obs = second_turn
    pol = make()
    rec = sim.record(0)
    data = {
        "prompt": [rec["prompt"], ""],
        "images": [rec["images"], []],
        "messages": [None, obs.messages[0]],
        "tools": [None, obs.tools[0]],
        "solution": ["circle", "circle"],
    }
    seen, _ = sft_entries(pol, data)
    single = pol.encode_one(pol.requests([rec["prompt"]], [rec["images"]])[0])
    assert torch.equal(seen[0]["prompt_ids"], single["prompt_ids"])  # the single-turn path, unchanged
    assert seen[1]["image_grid_thw"].shape[0] == 2  # the conversation's two images


def test_a_few_sft_steps_teach_the_tool_call_turn(second_turn, supervised_steps):
    sim, _ = second_turn
    pol = make()
    first = [sim.record(i) for i in range(4)]  # the first turn: question, small image, tools
    data = {"messages": [r["messages"] for r in first], "tools": [r["tools"] for r in first], "solution": [ZOOM] * 4}
    batch = pol.warm_start_batch(data)
    losses = supervised_steps(pol, batch, torch.optim.Adam(pol.parameters(), lr=3e-3), 12)
    assert losses[-1] < 0.6 * losses[0], losses  # the log-prob of the call went up
