"""The flow VLA's exploration that can shrink: the annealed noise level (``policy.noise_level_final``:
the Flow-SDE level follows the trainer's progress linearly, rollout and update of one iteration
share it, a background rollout copy, which would miss the progress, is refused) and the learned
initial noise (``policy.init_noise: learned``: x_1's density joins the chain's log-prob, so the RL
objective trains its std as a Gaussian policy's log std), and the learned Gaussian on the final
action (``policy.action_noise: learned``: the ODE's action plus learned-std noise, its density
recomputed through the ODE under the current weights), with the expert predicting the clean chunk
(``policy.prediction: sample``) so the untrained ODE does not pass the initial noise's spread on."""

import json
import math

import pytest
import torch
import yaml

from mmrl.config import ConfigError
from mmrl.policies.flow_vla import FlowVLAConfig, FlowVLAPolicy
from mmrl.simulator import Observation

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def policy(seed=0, **kw) -> FlowVLAPolicy:
    torch.manual_seed(seed)
    base = {"backbone": "state", "chunk_size": 1, "num_steps": 4, "method": "sde", "stochastic": "all"}
    cfg = FlowVLAConfig(**{**base, **kw})
    return FlowVLAPolicy(cfg, action_dim=3, state_dim=5).eval()


def obs(n=256) -> Observation:
    state = torch.randn(n, 5, generator=torch.Generator().manual_seed(1))
    return Observation(image=torch.zeros(n, 1, 1, 3, dtype=torch.uint8), instruction=[""] * n, state=state)


def test_level_interpolates_with_progress_and_is_fixed_without_a_final():
    p = policy(noise_level=2.0, noise_level_final=0.2)
    levels = []
    for progress in (0.0, 0.5, 1.0, 1.7):
        p.set_progress(progress)
        levels.append(p.noise_level)
    assert levels == pytest.approx([2.0, 1.1, 0.2, 0.2])  # clamped past the end
    assert p.rollout_stats() == {"noise_level": pytest.approx(0.2)}
    fixed = policy(noise_level=2.0)
    fixed.set_progress(1.0)
    assert fixed.noise_level == 2.0 and fixed.rollout_stats() == {}


def test_steps_narrow_and_the_update_sees_the_rollouts_level():
    p = policy(noise_level=2.0, noise_level_final=0.1)
    o = obs()
    logps = []
    for progress in (0.0, 1.0):
        p.set_progress(progress)
        d = p.rollout(o, torch.Generator().manual_seed(3), mode="train")
        logps.append(d.batch["old_logp"].mean().item())
        ratio = (p.evaluate(d.batch).logp - d.batch["old_logp"]).exp()
        torch.testing.assert_close(ratio, torch.ones_like(ratio), atol=1e-5, rtol=0)
    # the stochastic steps' std falls 20x: each of the 4 x 3 step elements' log-density rises ~log 20
    # (the actions' spread also carries the initial noise, which the velocity field alone maps)
    assert logps[1] - logps[0] > 12 * 2.0, logps
    # the update must use the level the rollout used: evaluated at another progress, the ratio moves
    p.set_progress(0.0)
    d = p.rollout(o, torch.Generator().manual_seed(3), mode="train")
    p.set_progress(1.0)
    ratio = (p.evaluate(d.batch).logp - d.batch["old_logp"]).exp()
    assert (ratio - 1).abs().max() > 1e-2


def test_learned_initial_noise_scales_x1_and_adds_its_density():
    p = policy(noise_level=1.0, init_noise="learned")
    with torch.no_grad():
        p.init_log_std.fill_(math.log(0.5))
    d = p.rollout(obs(4096), torch.Generator().manual_seed(3), mode="train")
    x1 = d.batch["flow_chain"][:, 0]
    assert x1.std().item() == pytest.approx(0.5, rel=0.05)
    ev = p.evaluate(d.batch)
    torch.testing.assert_close(ev.logp, d.batch["old_logp"], atol=1e-4, rtol=0)  # ratio 1
    fixed = policy(noise_level=1.0)  # the same weights (same seed), unit initial noise
    missing = fixed.load_state_dict(p.state_dict(), strict=False)
    assert missing.unexpected_keys == ["init_log_std"] and not missing.missing_keys
    by_hand = torch.distributions.Normal(0.0, 0.5).log_prob(x1).sum((1, 2))
    torch.testing.assert_close(ev.logp - fixed.evaluate(d.batch).logp, by_hand, atol=1e-3, rtol=1e-5)
    # the RL objective reaches the std: a gradient on the log std
    ev.logp.mean().backward()
    assert p.init_log_std.grad is not None and p.init_log_std.grad.abs().min() > 0
    # the ODE from a given noise (DSRL's map) equals the ode rollout that draws it, scaled alike
    p.cfg.eval_method = "ode"
    o = obs(8)
    eps = torch.randn(8, 1, 3, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(p.act_from_noise(o, eps), fixed.act_from_noise(o, eps * 0.5))


def test_action_noise_is_a_gaussian_around_the_odes_action_recomputed_by_the_update():
    p = policy(noise_level=1.0, stochastic="none", action_noise="learned", action_log_std_init=math.log(0.3))
    o = obs(4096)
    d = p.rollout(o, torch.Generator().manual_seed(3), mode="train")
    chain, action = d.batch["flow_chain"], d.batch["flow_action"]
    assert not d.batch["flow_stoch"].any()  # the chain is the ODE: no step drawn
    eps = action - chain[:, -1]
    assert eps.std().item() == pytest.approx(0.3, rel=0.05) and eps.mean().abs().item() < 0.02
    torch.testing.assert_close(d.actions, p.normalizer.unnormalize(action))  # the noisy action is executed
    ev = p.evaluate(d.batch)
    torch.testing.assert_close(ev.logp, d.batch["old_logp"], atol=1e-4, rtol=0)  # ratio 1
    by_hand = torch.distributions.Normal(chain[:, -1], 0.3).log_prob(action).sum((1, 2))
    torch.testing.assert_close(ev.logp, by_hand, atol=1e-4, rtol=1e-5)
    assert ev.entropy.item() == pytest.approx(0.5 * math.log(2 * math.pi * math.e * 0.09), rel=1e-5)
    # the gradient reaches the log std and, through the ODE integrated again, the velocity field
    ev.logp.mean().backward()
    assert p.action_log_std.grad.abs().min() > 0
    first = next(p.expert.parameters())
    assert first.grad is not None and first.grad.abs().sum() > 0
    # the update's density follows the current weights' ODE, not the stored chain's end
    with torch.no_grad():
        first.add_(0.05)
    assert (p.evaluate(d.batch).logp - d.batch["old_logp"]).abs().max() > 1e-2
    # evaluation is deterministic: the ODE from zero noise (mean) or from a noise draw (ode), no action noise
    p.cfg.eval_method = "mean"
    a = p.rollout(o, torch.Generator().manual_seed(4), mode="eval").actions
    torch.testing.assert_close(a, p.rollout(o, torch.Generator().manual_seed(5), mode="eval").actions)
    torch.testing.assert_close(a, p.act_from_noise(o, torch.zeros(4096, 1, 3)))


def test_sample_prediction_lands_the_ode_on_the_experts_clean_chunk():
    o, eps = obs(2048), torch.randn(2048, 1, 3, generator=torch.Generator().manual_seed(5))
    spreads = {}
    for pred in ("velocity", "sample"):
        p = policy(prediction=pred, stochastic="none", action_noise="learned")
        spreads[pred] = p.act_from_noise(o, eps).std(0).mean().item()
    # untrained: the velocity expert passes the unit noise's spread on, the sample expert outputs ~0
    assert spreads["velocity"] > 0.3 and spreads["sample"] < 0.05, spreads
    # the last Euler step (t = 1/4 -> 0) lands exactly on the expert's output at x_{1/4}
    p = policy(prediction="sample", stochastic="none", action_noise="learned")
    with torch.no_grad():
        p.expert.out.bias.fill_(0.3)  # a visible clean chunk
    d = p.rollout(o, torch.Generator().manual_seed(3), mode="train")
    chain = d.batch["flow_chain"]
    prefix, mask = p.encode(o.image, o.instruction, o.state)
    with torch.no_grad():
        x0_hat = p.expert(chain[:, -2], torch.full((2048,), 0.25), prefix, mask)[0]
    torch.testing.assert_close(chain[:, -1], x0_hat, atol=1e-5, rtol=0)
    ratio = (p.evaluate(d.batch).logp - d.batch["old_logp"]).exp()
    torch.testing.assert_close(ratio, torch.ones_like(ratio), atol=1e-4, rtol=0)


def test_invalid_level_is_one_clear_error():
    with pytest.raises(ConfigError, match="noise_level_final"):
        FlowVLAConfig(noise_level_final=-0.1).validate()
    with pytest.raises(ConfigError, match="init_noise=learned"):
        FlowVLAConfig(init_noise="learned", logp_level="dim").validate()
    with pytest.raises(ConfigError, match="stochastic=none"):
        FlowVLAConfig(action_noise="learned").validate()


def _run(tmp_path, *extra):
    pytest.importorskip("gymnasium", reason='the "gym" simulator needs gymnasium: pip install "mmrl[gym]"')
    from mmrl.experiment import build_trainer, load_experiment

    data = yaml.safe_load(open("configs/gym_pendulum.yaml"))
    overrides = [
        f"run.output_dir={tmp_path}",
        "run.name=a",
        "sim.num_envs=2",
        "sim.eval_num_envs=2",
        "algorithm.epochs=1",
        "algorithm.minibatch_size=8",
        "trainer.rollout_steps=8",
        "trainer.env_steps=64",
        "trainer.eval_episodes=2",
        "trainer.checkpoint_every=10",
        *extra,
    ]
    return build_trainer(load_experiment(data, overrides))


def test_the_trainer_moves_the_level_over_the_env_step_budget(tmp_path):
    trainer = _run(tmp_path, "policy.noise_level=2.0", "policy.noise_level_final=0.4")
    trainer.run()
    rows = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    levels = [r["train/noise_level"] for r in rows if "train/noise_level" in r]
    # 64 env steps in iterations of 16: progress 0, 1/4, 2/4, 3/4 before each rollout
    assert levels == pytest.approx([2.0, 1.6, 1.2, 0.8])


def test_the_trainer_trains_the_initial_noise_std(tmp_path):
    trainer = _run(tmp_path, "policy.init_noise=learned", "trainer.lr=0.01")
    trainer.run()
    assert trainer.policy.init_log_std.detach().abs().min() > 1e-4  # moved from 0 by PPO's updates
    rows = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    stds = [r["train/init_noise_std"] for r in rows if "train/init_noise_std" in r]
    # logged after each iteration's update: it moves every iteration
    assert len(stds) == 4 and len(set(stds)) == 4 and 1.0 not in stds


def test_the_trainer_trains_the_action_noise_std(tmp_path):
    trainer = _run(tmp_path, "policy.stochastic=none", "policy.action_noise=learned", "trainer.lr=0.01")
    trainer.run()
    assert trainer.policy.action_log_std.detach().abs().min() > 1e-4  # moved from 0 by PPO's updates
    rows = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    stds = [r["train/action_noise_std"] for r in rows if "train/action_noise_std" in r]
    assert len(stds) == 4 and len(set(stds)) == 4 and 1.0 not in stds


def test_a_background_rollout_copy_is_refused(tmp_path):
    with pytest.raises((ConfigError, ValueError), match="noise_level_final"):
        _run(tmp_path, "policy.noise_level_final=0.4", "trainer.async_staleness=1", "trainer.rollout_steps=0")
