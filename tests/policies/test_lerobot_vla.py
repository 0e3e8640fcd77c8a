"""The pretrained LeRobot VLA family (``policy.type: lerobot``) against LeRobot itself, on tiny
random-weight SmolVLA / PI0 / PI05 checkpoints of the real classes written here in LeRobot's format:

- mmrl's ODE sampler reproduces LeRobot's ``sample_actions`` (same noise) bit for bit;
- Flow-SDE and CPS at noise level 0 reproduce the ODE;
- PPO ratio exactly 1 before an update, for every sampler, log-prob level and fine-tuning mode;
- log-probs count the executed steps and the real action dims only;
- actions are LeRobot's postprocessor applied to LeRobot's chunk (un-normalisation with the
  checkpoint's statistics); statistics fitted on demonstrations reach both processors;
- ``save_pretrained`` -> LeRobot's ``from_pretrained`` + ``make_pre_post_processors`` gives the same
  actions (LoRA merged), and mmrl loads the exported folder back;
- a checkpoint whose weights do not load fails instead of running with random weights;
- ``act_from_noise`` (DSRL's map) is LeRobot's ``sample_actions`` from that noise, and DSRL steers a
  LeRobot base with the base frozen.

Runs in the LeRobot venv (``bash scripts/setup_lerobot.sh``; CI does); skipped elsewhere.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import pytest
import torch

pytest.importorskip("lerobot", reason="the LeRobot venv: bash scripts/setup_lerobot.sh")

from lerobot.policies.factory import get_policy_class, make_pre_post_processors

from mmrl.batch import Batch
from mmrl.config import ConfigError
from mmrl.policies.lerobot.policy import LeRobotVLAConfig, LeRobotVLAPolicy
from mmrl.simulator import Observation
from mmrl.tiny import tiny_lerobot

FAMILIES = ("smolvla", "pi0", "pi05")
CAMERAS, IMAGE, STATE, ACTIONS, HORIZON, EXEC = 2, 32, 3, 2, 8, 4
# statistics far from the identity, so un-normalisation is visible in every action
STATS = {
    "observation.state": {
        "mean": torch.tensor([0.3, -0.2, 0.1]),
        "std": torch.tensor([0.5, 2.0, 0.7]),
        "min": -torch.ones(3),
        "max": torch.ones(3),
        "q01": -torch.ones(3),
        "q99": torch.ones(3),
    },
    "action": {
        "mean": torch.tensor([0.25, -0.5]),
        "std": torch.tensor([0.2, 3.0]),
        "min": torch.tensor([-1.0, -2.0]),
        "max": torch.tensor([1.5, 1.0]),
        "q01": torch.tensor([-0.9, -1.8]),
        "q99": torch.tensor([1.4, 0.9]),
    },
}
_DIRS: list = []


def tmp_folder(prefix: str) -> str:
    _DIRS.append(tempfile.TemporaryDirectory(prefix=prefix))
    return _DIRS[-1].name


@functools.cache
def tokenizer_folder() -> str:
    return tiny_lerobot.tiny_gemma_tokenizer_folder(tmp_folder("mmrl_tok_"))


def variants(family: str):
    """The tiny PI0 / PI05 sizes patched in (build and load); nothing for SmolVLA."""
    import contextlib

    return contextlib.nullcontext() if family == "smolvla" else tiny_lerobot.TinyPiVariants(tokenizer_folder())


@functools.cache
def checkpoint(family: str, num_steps: int = 4) -> str:
    """A tiny random-weight checkpoint folder of ``family`` in LeRobot's format, with STATS."""
    kw = dict(
        cameras=CAMERAS,
        image_size=IMAGE,
        state_dim=STATE,
        action_dim=ACTIONS,
        chunk_size=HORIZON,
        n_action_steps=EXEC,
        num_steps=num_steps,
    )
    if family == "smolvla":
        kw["vlm_folder"] = tiny_lerobot.tiny_smolvlm_folder(tmp_folder("mmrl_vlm_"), image_size=IMAGE)
    with variants(family):
        return tiny_lerobot.save_tiny_lerobot_policy(family, tmp_folder(f"mmrl_{family}_"), stats=STATS, seed=1, **kw)


def make_policy(family: str, num_steps: int = 4, **cfg) -> LeRobotVLAPolicy:
    tok = {} if family == "smolvla" else {"tokenizer": tokenizer_folder()}
    config = LeRobotVLAConfig(model=checkpoint(family, num_steps), **{**tok, **cfg})
    with variants(family):
        return LeRobotVLAPolicy(config, action_dim=ACTIONS, state_dim=STATE)


def observations(n: int = 3, seed: int = 0) -> Observation:
    g = torch.Generator().manual_seed(seed)
    image = torch.randint(0, 256, (n, CAMERAS, IMAGE, IMAGE, 3), generator=g, dtype=torch.uint8)
    words = ["reach the red target", "push the blue cube", "open the drawer"]
    return Observation(image, [words[i % 3] for i in range(n)], torch.randn(n, STATE, generator=g))


def upstream(family: str, obs: Observation, noise: torch.Tensor, num_steps: int = 4):
    """LeRobot alone: its policy and processors loaded from the folder, its ``sample_actions`` on
    ``noise``. Returns (normalised padded chunk, env actions of the executed steps)."""
    folder = checkpoint(family, num_steps)
    with variants(family):
        from lerobot.configs.policies import PreTrainedConfig

        cfg = PreTrainedConfig.from_pretrained(folder)
        pol = get_policy_class(family).from_pretrained(folder, config=cfg).eval()
        over = (
            {}
            if family == "smolvla"
            else {"tokenizer_processor": {"tokenizer": tiny_lerobot.tiny_tokenizer_with_image_tokens()}}
        )
        pre, post = make_pre_post_processors(cfg, pretrained_path=folder, preprocessor_overrides=over)
    return lerobot_sample(pol, pre, post, obs, noise)


def lerobot_sample(pol, pre, post, obs: Observation, noise: torch.Tensor):
    raw = {
        f"observation.images.camera{i + 1}": obs.image[:, i].permute(0, 3, 1, 2).float() / 255
        for i in range(obs.image.shape[1])
    }
    raw.update({"observation.state": obs.state, "task": list(obs.instruction)})
    batch = pre(raw)
    with torch.no_grad():
        if pol.name == "smolvla":
            images, masks = pol.prepare_images(batch)
            x0 = pol.model.sample_actions(
                images,
                masks,
                batch["observation.language.tokens"],
                batch["observation.language.attention_mask"],
                pol.prepare_state(batch),
                noise=noise,
            )
        else:
            images, masks = pol._preprocess_images(batch)
            lang = (batch["observation.language.tokens"], batch["observation.language.attention_mask"])
            state = (pol.prepare_state(batch),) if pol.name == "pi0" else ()
            x0 = pol.model.sample_actions(images, masks, *lang, *state, noise=noise)
    return x0, post(x0[:, :EXEC, :ACTIONS])


def rollout(policy: LeRobotVLAPolicy, obs: Observation, seed: int = 7, mode: str = "eval"):
    policy.eval()
    return policy.rollout(obs, torch.Generator().manual_seed(seed), mode=mode)


def noise_of(policy: LeRobotVLAPolicy, n: int, seed: int = 7) -> torch.Tensor:
    """The noise a rollout with generator seed ``seed`` starts from (its first draw)."""
    return torch.randn(n, policy.horizon, policy.max_action_dim, generator=torch.Generator().manual_seed(seed))


# ---- faithfulness to LeRobot ------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_ode_sampler_reproduces_lerobot_sample_actions_exactly(family):
    obs = observations()
    policy = make_policy(family)
    dec = rollout(policy, obs)
    x0, actions = upstream(family, obs, noise_of(policy, 3))
    assert dec.batch["flow_chain"].shape == (3, 5, HORIZON, 32)  # K=4 steps over the padded chunk
    assert torch.equal(dec.batch["flow_chain"][:, -1], x0)  # bit for bit
    assert torch.equal(dec.actions, actions)  # LeRobot's postprocessor: un-normalised, executed steps
    assert dec.actions.shape == (3, EXEC, ACTIONS)
    # and the statistics matter: the raw normalised chunk is not what the environment gets
    assert not torch.allclose(dec.actions, x0[:, :EXEC, :ACTIONS], atol=1e-2)


def test_ode_with_ten_steps_matches_lerobot_to_float_rounding():
    """With K = 10 LeRobot steps by dt = -0.1 (python float) and mmrl by grid differences
    t_{k+1} - t_k in float32: equal up to float32 rounding (K a power of 2 is exact, above)."""
    obs = observations()
    policy = make_policy("smolvla", num_steps=10)
    dec = rollout(policy, obs)
    x0, _ = upstream("smolvla", obs, noise_of(policy, 3), num_steps=10)
    assert len(policy.grid) == 11
    assert (dec.batch["flow_chain"][:, -1] - x0).abs().max() < 1e-5


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method", ["sde", "cps"])
def test_stochastic_samplers_at_noise_level_zero_are_the_ode(family, method):
    obs = observations()
    ode = rollout(make_policy(family), obs)
    noisy = rollout(make_policy(family, method=method, noise_level=0.0), obs, mode="train")
    assert torch.equal(noisy.actions, ode.actions)
    assert not noisy.batch["flow_stoch"].any()  # std 0 everywhere: no stochastic transition is counted
    moved = rollout(make_policy(family, method=method, noise_level=0.5), obs, mode="train")
    assert not torch.equal(moved.actions, ode.actions)


# ---- the latent-noise map DSRL steers --------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_act_from_noise_is_lerobot_sample_actions_from_that_noise(family):
    """A noise other than the one a rollout would draw: mmrl's map gives LeRobot's own actions for it."""
    obs = observations()
    policy = make_policy(family)
    assert policy.capabilities(policy.cfg).latent_noise and policy.noise_shape == (HORIZON, 32)
    noise = 1.5 * torch.randn(3, HORIZON, 32, generator=torch.Generator().manual_seed(11))
    _, actions = upstream(family, obs, noise)
    assert torch.equal(policy.act_from_noise(obs, noise), actions)  # bit for bit
    with pytest.raises(ValueError, match=r"starts from \[B, \*\(8, 32\)\]"):
        policy.act_from_noise(obs, noise[:, :EXEC])


@pytest.mark.parametrize("family", ["smolvla", "pi0"])
def test_dsrl_steers_a_lerobot_base(family):
    """DSRL over a LeRobot VLA: the prior actor acts as the base's ODE rollout; the learned actor's
    action is the base's map from its noise; the features read image, instruction and state; SAC's
    loss reaches the actor only."""
    from mmrl.policies.dsrl import DSRLConfig, DSRLPolicy
    from mmrl.trainer.objectives import sac_objective
    from mmrl.trainer.off_policy import SACAgent, SoftCritics

    tok = {} if family == "smolvla" else {"tokenizer": tokenizer_folder()}
    base = LeRobotVLAConfig(model=checkpoint(family), **tok)
    with variants(family):
        prior = DSRLPolicy(DSRLConfig(base=base, actor="prior"), action_dim=ACTIONS, state_dim=STATE)
        policy = DSRLPolicy(DSRLConfig(base=base, hidden=16), action_dim=ACTIONS, state_dim=STATE)
    obs = observations()
    mine = prior.rollout(obs, torch.Generator().manual_seed(3), mode="train").actions
    assert torch.equal(mine, rollout(prior.base, obs, seed=3).actions)

    out = policy.rollout(obs, torch.Generator().manual_seed(0), mode="eval")
    assert out.batch["actions"].shape == (3, HORIZON, 32) and out.actions.shape == (3, EXEC, ACTIONS)
    w = policy.cfg.noise_bound * out.batch["actions"]
    assert torch.equal(out.actions, policy.base.act_from_noise(obs, w))
    f = out.batch["state"]
    assert f.shape == (3, policy.replay_dim) and policy.replay_dim == policy.base.feature_dim
    other = Observation(obs.image, [obs.instruction[1]] * 3, obs.state)
    assert not torch.allclose(f[0], policy.replay_state(other)[0])  # the instruction reaches the features
    moved = Observation(obs.image, obs.instruction, obs.state + 1.0)
    assert not torch.allclose(f, policy.replay_state(moved))  # so does the state

    policy.after_warm_start()  # frozen, as a run without a warm start leaves it
    width, g = HORIZON * 32, torch.Generator().manual_seed(0)
    mb = Batch(
        state=torch.randn(4, policy.replay_dim, generator=g),
        actions=torch.rand(4, width, generator=g) * 2 - 1,
        rewards=torch.randn(4, generator=g),
        discount=torch.full((4,), 0.99),
        next_state=torch.randn(4, policy.replay_dim, generator=g),
    )
    from mmrl.experiment import AlgorithmConfig

    loss, _ = sac_objective(
        SACAgent(policy, SoftCritics(policy.replay_dim, width, 16), -6.0, g), mb, AlgorithmConfig(objective="sac")
    )
    loss.backward()
    assert all(p.grad is None and not p.requires_grad for p in policy.base.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.actor.parameters())


def test_residual_corrects_a_lerobot_base_chunk():
    """Residual RL over a LeRobot VLA: its correction has the executed chunk's shape (the first
    ``chunk_size`` steps, the real action dims, env units after the postprocessor); untrained, it acts
    as the base's ODE chunk from the zero noise; a recorded chunk maps back to the correction that acts it."""
    from mmrl.policies.residual import ResidualConfig, ResidualPolicy

    base = LeRobotVLAConfig(model=checkpoint("smolvla"))
    with variants("smolvla"):
        policy = ResidualPolicy(ResidualConfig(base=base, hidden=16, scale=0.3), action_dim=ACTIONS, state_dim=STATE)
    obs = observations()
    zero = policy.base.act_from_noise(obs, torch.zeros(3, HORIZON, 32))
    assert zero.shape == (3, EXEC, ACTIONS) and policy.actor_shape == (EXEC, ACTIONS)
    out = policy.rollout(obs, torch.Generator().manual_seed(0), mode="eval")
    assert torch.equal(out.actions, zero)  # zero-initialised actor: the base's chunk

    torch.nn.init.normal_(policy.actor[-1].weight, std=0.5)  # a trained actor's correction
    out = policy.rollout(obs, torch.Generator().manual_seed(0), mode="train")
    a = out.batch["actions"].reshape(3, EXEC, ACTIONS)
    assert a.abs().max() > 0.05 and a.abs().max() <= 1.0
    assert torch.allclose(out.actions, zero + 0.3 * a, atol=1e-6)
    assert torch.allclose(policy.replay_actions(obs, out.actions), a, atol=1e-5)


# ---- log-probs --------------------------------------------------------------------------------
RATIO_CASES = [
    ("smolvla", dict(method=m, stochastic=s, logp_level=lv))
    for m in ("sde", "cps", "noise")
    for s in ("all", "one")
    for lv in ("chunk", "dim")
] + [
    ("smolvla", dict(finetune="full")),
    ("smolvla", dict(finetune="lora")),
    ("pi0", dict(method="sde")),
    ("pi0", dict(method="noise", finetune="full")),
    ("pi05", dict(method="noise")),
    ("pi05", dict(method="sde", stochastic="one", finetune="lora")),
]


@pytest.mark.parametrize(
    "family, cfg", RATIO_CASES, ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}={x}" for k, x in v.items())
)
def test_ppo_ratio_is_exactly_one_before_an_update(family, cfg):
    policy = make_policy(family, **cfg)
    dec = rollout(policy, observations(4), mode="train")
    policy.train()
    out = policy.evaluate(dec.batch)
    assert out.logp.shape == dec.batch["old_logp"].shape == (4, *policy.logp_shape)
    assert torch.equal(out.logp, dec.batch["old_logp"])
    assert torch.equal(out.values, dec.batch["old_values"])
    assert torch.isfinite(out.logp).all() and (out.logp != 0).any()


def test_log_probs_count_executed_steps_and_real_dims_only():
    """Only the last transition is stochastic: its log-prob reads the final chunk x_0. Moving x_0's
    unexecuted tail or its padded dims leaves it unchanged; moving an executed real entry does not."""
    policy = make_policy("smolvla", method="sde", stochastic="window", window=[3, 4])
    batch = rollout(policy, observations(2), mode="train").batch
    policy.train()

    def logp(edit):
        b = Batch(batch)
        chain = batch["flow_chain"].clone()
        edit(chain[:, -1])
        b["flow_chain"] = chain
        with torch.no_grad():
            return policy.evaluate(b).logp

    base = logp(lambda x: None)
    assert torch.equal(base, batch["old_logp"])
    assert torch.equal(logp(lambda x: x[:, EXEC:].add_(1.0)), base)  # steps not executed
    assert torch.equal(logp(lambda x: x[:, :, ACTIONS:].add_(1.0)), base)  # padding to 32 dims
    assert not torch.equal(logp(lambda x: x[:, :EXEC, :ACTIONS].add_(0.1)), base)


def test_value_head_reads_the_prefix_not_the_noise():
    policy = make_policy("smolvla", method="noise")
    obs = observations()
    a, b = rollout(policy, obs, seed=1, mode="train"), rollout(policy, obs, seed=2, mode="train")
    assert not torch.equal(a.actions, b.actions)
    assert torch.equal(a.batch["old_values"], b.batch["old_values"])


@pytest.mark.parametrize("finetune, reference", [("expert", "copy"), ("lora", "adapter")])
def test_kl_reference_is_the_policy_before_training(finetune, reference):
    policy = make_policy("smolvla", method="sde", finetune=finetune, reference=reference)
    obs = observations()
    dec = rollout(policy, obs, mode="train")
    assert torch.allclose(dec.batch["ref_logp"], dec.batch["old_logp"], atol=1e-5)
    with torch.no_grad():
        for p in policy.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    after = rollout(policy, obs, mode="train")
    assert not torch.allclose(after.batch["ref_logp"], after.batch["old_logp"], atol=1e-3)
    with policy.reference():  # the reference is what the policy was: the first rollout again
        again = rollout(policy, obs, mode="train")
    assert torch.allclose(again.batch["old_logp"], dec.batch["old_logp"], atol=1e-5)


# ---- fine-tuning modes ------------------------------------------------------------------------
def test_finetune_modes_train_what_they_say():
    def trainable(policy):
        return {n for n, p in policy.net.named_parameters() if p.requires_grad}

    expert = trainable(make_policy("smolvla", finetune="expert"))
    full = trainable(make_policy("smolvla", finetune="full"))
    lora = trainable(make_policy("smolvla", finetune="lora"))
    assert expert and not any(".vlm." in n for n in expert)  # the VLM frozen
    assert any(".vlm." in n for n in full) and expert < full
    assert lora and all("lora_" in n for n in lora)


# ---- statistics, export and loading -----------------------------------------------------------
def test_statistics_fitted_on_demonstrations_reach_both_processors():
    policy = make_policy("smolvla", stats="demos")
    g = torch.Generator().manual_seed(0)
    n = 40
    demos = {
        "image": torch.randint(0, 256, (n, CAMERAS, IMAGE, IMAGE, 3), generator=g, dtype=torch.uint8),
        "instruction": ["reach the red target"] * n,
        "state": 2.0 + torch.randn(n, STATE, generator=g),
        "actions": torch.tensor([1.0, -3.0]) + 0.5 * torch.randn(n, EXEC, ACTIONS, generator=g),
    }
    policy.warm_start_batch(demos)
    stats = policy.stats()
    flat = demos["actions"].reshape(-1, ACTIONS)
    assert torch.allclose(stats["action.mean"], flat.mean(0), atol=1e-5)
    assert torch.allclose(stats["observation.state.std"], demos["state"].std(0), atol=1e-5)
    # the postprocessor un-normalises with them: a zero chunk becomes the demonstrations' mean action
    zero = torch.zeros(1, policy.horizon, policy.max_action_dim)
    assert torch.allclose(policy.to_env(zero)[0, 0], flat.mean(0), atol=1e-5)
    # and they are in the state dict: a fresh policy loading it un-normalises the same way
    fresh = make_policy("smolvla")
    fresh.load_state_dict(policy.state_dict())
    assert torch.allclose(fresh.to_env(zero), policy.to_env(zero))


@pytest.mark.parametrize("family, finetune", [("smolvla", "expert"), ("smolvla", "lora"), ("pi05", "full")])
def test_save_pretrained_loads_in_lerobot_with_the_same_actions(family, finetune, tmp_path):
    policy = make_policy(family, finetune=finetune)
    with torch.no_grad():  # a trained policy: every trainable weight moved (LoRA B no longer zero)
        for p in policy.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    policy.set_stats({k: v * 1.5 if k.endswith(".std") else v for k, v in policy.stats().items()})
    obs = observations()
    ours = rollout(policy, obs).actions
    with variants(family):
        folder = policy.save_pretrained(tmp_path / "export")
        from lerobot.configs.policies import PreTrainedConfig

        cfg = PreTrainedConfig.from_pretrained(folder)
        pol = get_policy_class(family).from_pretrained(folder, config=cfg).eval()
        over = (
            {}
            if family == "smolvla"
            else {"tokenizer_processor": {"tokenizer": tiny_lerobot.tiny_tokenizer_with_image_tokens()}}
        )
        pre, post = make_pre_post_processors(cfg, pretrained_path=folder, preprocessor_overrides=over)
    _, theirs = lerobot_sample(pol, pre, post, obs, noise_of(policy, 3))
    assert cfg.n_action_steps == EXEC
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()
    # mmrl loads its own export back
    tok = {} if family == "smolvla" else {"tokenizer": tokenizer_folder()}
    with variants(family):
        back = LeRobotVLAPolicy(LeRobotVLAConfig(model=folder, **tok), action_dim=ACTIONS, state_dim=STATE)
    assert torch.allclose(rollout(back, obs).actions, ours, atol=1e-5)


def test_a_checkpoint_whose_weights_do_not_load_fails(tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    folder = Path(shutil.copytree(checkpoint("pi0"), tmp_path / "broken"))
    weights = load_file(folder / "model.safetensors")
    weights.pop(next(k for k in weights if "action_out_proj" in k))
    save_file(weights, folder / "model.safetensors")
    with variants("pi0"), pytest.raises(ConfigError, match="did not load"):
        LeRobotVLAPolicy(LeRobotVLAConfig(model=str(folder), tokenizer=tokenizer_folder()), ACTIONS, STATE)


def test_wrong_action_size_and_cameras_fail_with_the_fix():
    with pytest.raises(ConfigError, match="acts in 2 dims, the simulator in 7"):
        LeRobotVLAPolicy(LeRobotVLAConfig(model=checkpoint("smolvla")), action_dim=7, state_dim=STATE)
    policy = make_policy("smolvla")

    class ThreeCameras:
        image_shape, state_dim = (3, IMAGE, IMAGE, 3), STATE

    with pytest.raises(ValueError, match="renders 3 cameras.*camera_keys"):
        policy.check_simulator(ThreeCameras())
    with pytest.raises(ConfigError, match="observation.images.wrist.*its image features: observation.images.camera1"):
        make_policy("smolvla", camera_keys=["observation.images.wrist"])


def test_other_lerobot_releases_are_refused(monkeypatch):
    import lerobot

    monkeypatch.setattr(lerobot, "__version__", "0.7.0")
    with pytest.raises(ConfigError, match="setup_lerobot.sh"):
        make_policy("smolvla")
