"""Action tokenizer (hand-computed bins) and the action-token VLA on a tiny random-weight SmolVLM:
rollout / evaluate agree (ratio 1) for both decodings, greedy eval, supervised fit, GRPO smoke run."""

from __future__ import annotations

import json

import pytest
import torch

from mmrl.policies.action_tokenizer import ActionTokenizer

# ---- ActionTokenizer: pure, hand-computed --------------------------------------------------------


def test_bins_edges_and_centres_hand_computed():
    tok = ActionTokenizer(num_bins=4)  # width 0.5: [-1,-.5) [-.5,0) [0,.5) [.5,1]
    a = torch.tensor([-1.0, -0.75, -0.5, -0.01, 0.0, 0.49, 0.5, 0.99, 1.0, -5.0, 7.0])
    assert tok.encode(a).tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 3, 0, 3]
    assert tok.decode(torch.arange(4)).tolist() == [-0.75, -0.25, 0.25, 0.75]
    tok256 = ActionTokenizer()  # OpenVLA's 256 bins, width 1/128
    assert tok256.encode(torch.tensor([-1.0, 0.0, 1.0])).tolist() == [0, 128, 255]
    assert tok256.decode(torch.tensor([0, 128, 255])).tolist() == [-1 + 1 / 256, 1 / 256, 1 - 1 / 256]
    odd = ActionTokenizer(num_bins=3, low=0.0, high=3.0)  # width 1, centre bin holds 1.5
    assert odd.encode(torch.tensor([[0.0, 1.5, 3.0]])).tolist() == [[0, 1, 2]]
    assert odd.decode(torch.tensor([1])).tolist() == [1.5]


def test_round_trip_error_at_most_half_a_bin():
    tok = ActionTokenizer(num_bins=256)
    a = torch.rand(1000, 4, 7, generator=torch.Generator().manual_seed(0)) * 2 - 1
    err = (tok.decode(tok.encode(a)) - a).abs()
    assert err.max() <= tok.width / 2 + 1e-6
    assert tok.encode(a).shape == a.shape and tok.encode(a).dtype == torch.long


def test_vocabulary_mappings():
    last = ActionTokenizer(num_bins=4, vocab_size=10)  # OpenVLA: token = vocab_size - 1 - bin
    assert last.token_ids.tolist() == [9, 8, 7, 6]
    assert last.bins_to_tokens(torch.tensor([[0, 3], [1, 2]])).tolist() == [[9, 6], [8, 7]]
    assert last.tokens_to_bins(torch.tensor([6, 9])).tolist() == [3, 0]
    assert last.actions_to_tokens(torch.tensor([-1.0, 1.0])).tolist() == [9, 6]
    assert last.tokens_to_actions(torch.tensor([7])).tolist() == [0.25]
    with pytest.raises(ValueError, match="not action tokens"):
        last.tokens_to_bins(torch.tensor([5]))
    added = ActionTokenizer(num_bins=3, token_ids=[100, 57, 101])  # e.g. added special tokens
    assert added.bins_to_tokens(torch.tensor([2, 0, 1])).tolist() == [101, 100, 57]
    assert added.tokens_to_bins(torch.tensor([57, 101, 100])).tolist() == [1, 2, 0]
    with pytest.raises(ValueError, match="not action tokens"):
        added.tokens_to_bins(torch.tensor([102]))
    with pytest.raises(ValueError):
        ActionTokenizer(num_bins=8, vocab_size=4)
    with pytest.raises(ValueError):
        ActionTokenizer(num_bins=2, token_ids=[1, 1])
    with pytest.raises(ValueError, match="no vocabulary mapping"):
        _ = ActionTokenizer(num_bins=4).token_ids


# ---- the policy on a tiny Idefics3 (SmolVLM) ------------------------------------------------------

transformers = pytest.importorskip("transformers")

from mmrl.batch import Batch  # noqa: E402
from mmrl.policies.base import encode_text  # noqa: E402
from mmrl.policies.token_vla import TokenVLAConfig, TokenVLAPolicy  # noqa: E402
from mmrl.simulator import Observation  # noqa: E402
from mmrl.tiny.tiny_models import tiny_image_text_model  # noqa: E402

COLORS = ["red", "green", "blue"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_smolvlm")
    tiny_image_text_model(path)
    return path


def make_obs(b=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    image = torch.randint(0, 256, (b, 32, 32, 3), generator=g, dtype=torch.uint8)
    instr = [f"reach the {COLORS[i % 3]} target" for i in range(b)]
    return Observation(image, instr, torch.randn(b, 2, generator=g))


def make_policy(model_dir=None, **kw):
    kw = {"num_bins": 32, "image_size": 32, "action_tokens": "new", "critic": True, **kw}
    torch.manual_seed(0)
    cfg = TokenVLAConfig(model=str(model_dir or "unused"), chunk_size=4, **kw)
    if model_dir is not None:  # the real loading path: AutoModelForImageTextToText.from_pretrained
        return TokenVLAPolicy(cfg, action_dim=2, state_dim=2)
    model, processor = tiny_image_text_model()
    return TokenVLAPolicy(cfg, action_dim=2, state_dim=2, model=model, processor=processor)


@pytest.mark.parametrize("decoding", ["autoregressive", "parallel"])
@pytest.mark.parametrize("temperature,top_k", [(1.0, None), (0.7, 5)])
def test_recomputed_logp_equals_rollout_logp(decoding, temperature, top_k):
    policy = make_policy(decoding=decoding, temperature=temperature, top_k=top_k)
    batch = policy.rollout(make_obs(), generator=torch.Generator().manual_seed(1)).batch
    n = 4 * 2
    assert batch["actions"].shape == (6, 4, 2) and batch["actions"].abs().max() <= 1
    assert batch["action_tokens"].shape == (6, n) and batch["action_tokens"].dtype == torch.long
    assert batch["old_logp"].shape == (6, *policy.logp_shape) == (6, n)
    assert batch["old_values"].shape == (6,) and batch["state"].shape == (6, 2)
    assert set(batch["action_tokens"].unique().tolist()) <= set(policy.bin_ids.tolist())
    if decoding == "parallel":  # a dedicated, trainable, non-zero query token
        assert policy.tokenizer.convert_ids_to_tokens(policy.placeholder_id) == "<action_query>"
        assert policy.model.get_input_embeddings().weight[policy.placeholder_id].abs().sum() > 0
    bins = policy.action_tokenizer.tokens_to_bins(batch["action_tokens"])  # actions are the bin centres
    torch.testing.assert_close(batch["actions"].reshape(6, n), policy.action_tokenizer.decode(bins))
    sub = batch.index(torch.tensor([4, 0, 5]))  # another batch composition -> other left padding
    policy.train()
    out = policy.evaluate(sub)
    ratio = torch.exp(out.logp - sub["old_logp"])
    torch.testing.assert_close(ratio, torch.ones_like(ratio), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.values, sub["old_values"], atol=1e-5, rtol=0)
    assert 0 < out.entropy <= torch.log(torch.tensor(float(top_k or 32))) + 1e-5
    (out.logp.sum() + out.values.sum()).backward()
    head = policy.model.get_output_embeddings().weight.grad
    assert head[policy.bin_ids].abs().sum() > 0  # the bin rows of the LM head learn
    assert any(
        p.grad is not None and p.grad.abs().sum() > 0
        for n_, p in policy.model.named_parameters()
        if "vision_model" in n_
    )


def test_openvla_last_tokens_vocabulary(model_dir):
    policy = make_policy(model_dir, action_tokens="last", decoding="autoregressive", critic=False)
    vocab = policy.tokenizer.vocab_size
    assert policy.bin_ids.tolist() == [vocab - 1 - b for b in range(32)]
    assert policy.model.get_output_embeddings().weight.shape[0] == vocab  # nothing added
    batch = policy.rollout(make_obs(4), generator=torch.Generator().manual_seed(3)).batch
    tokens = batch["action_tokens"]
    assert "old_values" not in batch and ((tokens >= vocab - 32) & (tokens < vocab)).all()
    out = policy.evaluate(batch)
    torch.testing.assert_close(out.logp, batch["old_logp"], atol=1e-5, rtol=0)
    assert out.values is None
    with pytest.raises(ValueError, match="special / added tokens"):  # the range would swallow <image> etc.
        make_policy(action_tokens="last", num_bins=420)


def test_new_tokens_are_added_once_and_distinct(model_dir):
    policy = make_policy(model_dir, action_tokens="new")
    tok = policy.tokenizer
    assert tok.convert_ids_to_tokens(policy.bin_ids[[0, -1]].tolist()) == ["<action_0>", "<action_31>"]
    assert len(tok) == tok.vocab_size + 32 == policy.model.get_output_embeddings().weight.shape[0]
    emb = policy.model.get_input_embeddings().weight[policy.bin_ids]
    assert torch.cdist(emb, emb).add(torch.eye(32) * 1e9).min() > 0  # no two action tokens alike
    from mmrl.policies.token_vla import setup_action_vocab

    assert setup_action_vocab(policy.model, tok, 32, "new") == policy.bin_ids.tolist()  # idempotent


def test_eval_mode_is_greedy_and_deterministic():
    for decoding in ["autoregressive", "parallel"]:
        policy = make_policy(decoding=decoding, temperature=0.7)
        obs = make_obs(3)
        a = policy.rollout(obs, generator=torch.Generator().manual_seed(5), mode="eval").batch
        b = policy.rollout(obs, generator=torch.Generator().manual_seed(6), mode="eval").batch
        torch.testing.assert_close(a["actions"], b["actions"])
        assert torch.equal(a["action_tokens"], b["action_tokens"])
        logits, _ = policy._teacher_forced(policy.encode_prompt(obs.image, obs.instruction), a["action_tokens"])
        taken = policy.action_tokenizer.tokens_to_bins(a["action_tokens"])
        assert torch.equal(logits.argmax(-1), taken)  # every token is the argmax given its inputs
        s1 = policy.rollout(obs, generator=torch.Generator().manual_seed(5)).batch
        s2 = policy.rollout(obs, generator=torch.Generator().manual_seed(5)).batch
        assert torch.equal(s1["action_tokens"], s2["action_tokens"])  # sampling follows the generator


@pytest.mark.parametrize("decoding", ["autoregressive", "parallel"])
def test_supervised_loss_fits_a_fixed_batch(decoding, supervised_steps):
    policy = make_policy(decoding=decoding, critic=False)
    obs = make_obs(b=3)
    target = torch.rand(3, 4, 2, generator=torch.Generator().manual_seed(9)) * 2 - 1  # one chunk per colour
    batch = Batch(image=obs.image, instruction=encode_text(obs.instruction), state=obs.state, actions=target)
    with torch.no_grad():
        first = policy.supervised_loss(batch)
    assert first.shape == (3,) and torch.allclose(first.mean(), torch.log(torch.tensor(32.0)), atol=0.3)
    opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=5e-3)
    policy.train()
    supervised_steps(policy, batch, opt, 20)
    with torch.no_grad():
        last = policy.supervised_loss(batch)
    assert last.mean() < 0.6 * first.mean()


def test_freeze_vision_and_config_validation():
    policy = make_policy(freeze_vision=True)
    frozen = [n for n, p in policy.named_parameters() if not p.requires_grad]
    assert frozen and all("vision_model" in n for n in frozen)
    assert any(p.requires_grad for n, p in policy.named_parameters() if "connector" in n)
    from mmrl.config import ConfigError
    from mmrl.experiment import load_experiment

    cfg = load_experiment("configs/quickstart_token_vla.yaml")
    assert isinstance(cfg.policy, TokenVLAConfig) and cfg.policy.decoding == "parallel"
    for bad in ["policy.top_k=0", "policy.temperature=0", "policy.decoding=beam", "policy.prompt=go"]:
        with pytest.raises(ConfigError):
            load_experiment("configs/quickstart_token_vla.yaml", [bad])


@pytest.mark.parametrize("decoding", ["parallel", "autoregressive"])
def test_grpo_smoke_run_through_the_trainer(tmp_path, model_dir, decoding):
    from mmrl.experiment import build_trainer, load_experiment

    cfg = load_experiment(
        "configs/quickstart_token_vla.yaml",
        [
            f"run.output_dir={tmp_path}",
            "run.name=t",
            f"policy.model={model_dir}",
            f"policy.decoding={decoding}",
            "sim.num_envs=4",
            "sim.eval_num_envs=4",
            "sim.kwargs={image_size: 32, max_episode_steps: 12}",
            "algorithm.group_size=2",
            "warm_start.num_episodes=2",
            "warm_start.steps=2",
            "warm_start.batch_size=8",
            "trainer.iterations=2",
            "trainer.eval_episodes=4",
            "trainer.video_episodes=0",
            "algorithm.minibatch_size=8",
            "algorithm.epochs=1",
        ],
    )
    trainer = build_trainer(cfg)
    assert isinstance(trainer.policy, TokenVLAPolicy)
    results = trainer.run()
    assert "final" in results and results["final"]["episodes"] == 4
    assert trainer.state.skipped_steps == 0 and trainer.state.iteration == 2
    rows = [json.loads(line) for line in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "train/policy_loss" in r]
    assert len(train_rows) == 2 and all(abs(r["train/ratio_max"] - 1) < 0.5 for r in train_rows)
    # resume rebuilds the policy from policy.model (the action tokens are added again) and loads it
    again = build_trainer(cfg)
    assert again.run()["final"] == results["final"] and again.state.iteration == 2


@pytest.mark.gpu
def test_cuda_rollout_and_recompute_agree():
    for decoding in ["autoregressive", "parallel"]:
        policy = make_policy(decoding=decoding).cuda()
        obs = make_obs()
        obs = Observation(obs.image.cuda(), obs.instruction, obs.state.cuda())
        batch = policy.rollout(obs, generator=torch.Generator(device="cuda").manual_seed(0)).batch
        assert batch["actions"].is_cuda and batch["action_tokens"].is_cuda
        out = policy.evaluate(batch)
        torch.testing.assert_close(out.logp, batch["old_logp"], atol=1e-4, rtol=0)
