"""The policy contract checker (`mmrl check policy NAME`): every registered policy passes it in its
tiny configuration (and the flow VLA with every sampler / log-prob level), and broken policies fail
it for the right reason, naming the check and what it measured."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from mmrl.checks.policy import check_policy, tiny_smolvlm_folder
from mmrl.cli import main
from mmrl.config import load_config
from mmrl.policies.base import Decision
from mmrl.policies.gaussian import GaussianPolicy
from mmrl.registry import POLICIES, MissingDependencyError

# real bugs the checker found: (policy, overrides) -> why the case is xfail(strict=True)
KNOWN_FAILURES: dict = {}  # none today (the VLM entropy NaN and the unused LM head were fixed)


@functools.cache
def checked(name: str, overrides: tuple[str, ...] = ()):
    try:
        POLICIES.get(name)
    except MissingDependencyError as exc:
        pytest.skip(str(exc))
    return check_policy(name, list(overrides), verbose=False)


def case(name: str, *overrides: str):
    reason = KNOWN_FAILURES.get((name, overrides))
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(name, overrides, marks=marks, id="-".join([name, *overrides]))


FLOW_SAMPLERS = [
    (f"method={m}", f"stochastic={s}", f"logp_level={level}", "noise_level=0.7")
    for m in ("sde", "cps", "noise")
    for s in ("all", "one")
    for level in ("chunk", "dim")
]


@pytest.mark.parametrize(
    "name, overrides",
    [case(n) for n in POLICIES.names()]
    + [case("flow_vla", *o) for o in FLOW_SAMPLERS]
    + [
        case("lerobot", f"model=tiny:{f}", *o)
        for f in ("pi0", "pi05")
        for o in [(), ("method=sde", "stochastic=one", "logp_level=dim", "finetune=expert")]
    ]
    + [case("lerobot", "method=cps", "finetune=lora", "reference=adapter")]
    + [
        case("token_vla", "decoding=parallel", "temperature=0.7", "top_k=5"),
        case("gaussian", "logp_level=dim", "critic=false"),
        case("gaussian", "log_std_init=auto"),  # the initial std's probe (exploration_stds)
        case("flow_vla", "backbone=state", "prediction=sample", "stochastic=none", "action_noise=learned"),
        case("diffusion", "logp_level=sample", "method=cps", "guidance_scale=3.0"),
        case("diffusion", "num_frames=4", "method=cps"),  # a video generator, on video_prompts
    ],
)
def test_policy_passes_the_contract_check(name, overrides):
    result = checked(name, overrides)
    assert result.ok, f"\n{result}"
    cls = POLICIES.get(name)
    caps = cls.capabilities(load_config(cls.config_class, {"type": name}, list(overrides)))
    if not caps.acts:  # a model its warm start alone trains (a world model)
        assert result.passed == ["build", "warm_start_only", "save_load"]
        return
    replayed = ["ratio_one", "replay"] if caps.likelihood else ["reparameterized"]  # SAC's actor: no log-probs
    after = "ratio_after_sync" if caps.likelihood else "reparameterized_after_sync"
    probe = ["exploration_stds"] if caps.exploration_probe else []
    assert result.passed == [
        "build",
        "rollout",
        *replayed,
        "eval_deterministic",
        *probe,
        after,
        "gradients",
        "save_load",
    ]


@functools.cache
def flow_vla_on_a_transformers_backbone():
    pytest.importorskip("transformers")
    return check_policy("flow_vla", {"backbone": tiny_smolvlm_folder}, verbose=False)


def test_flow_vla_on_a_transformers_backbone_passes_the_contract_check():
    result = flow_vla_on_a_transformers_backbone()
    assert result.ok, f"\n{result}"


# ---- broken policies: each fails its own check (and only that one) -------------------------------


class RatioOff(GaussianPolicy):
    """evaluate adds 0.01 to the log-probs: the PPO ratio is exp(0.01) before an update."""

    def evaluate(self, batch):
        out = super().evaluate(batch)
        out.logp = out.logp + 0.01
        return out


class DeadParameter(GaussianPolicy):
    """A parameter that requires grad but no forward uses: it can never learn."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.unused = nn.Parameter(torch.zeros(3))


class GlobalNoiseEval(GaussianPolicy):
    """Eval actions get noise from the global RNG: not reproducible with a seeded generator."""

    def rollout(self, obs, generator=None, mode="train"):
        batch, actions = super().rollout(obs, generator, mode)
        if mode == "eval":
            batch["actions"] = actions = actions + 0.1 * torch.randn(actions.shape)
        return Decision(batch, actions)


class SampledEval(GaussianPolicy):
    """Eval actions sampled from the generator, where the Gaussian policy's eval is the mean."""

    def rollout(self, obs, generator=None, mode="train"):
        return super().rollout(obs, generator, "train")


class UnsavedStatistics(GaussianPolicy):
    """A running state offset kept in a non-persistent buffer: a checkpoint loses it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_buffer("shift", torch.zeros(self.state_dim), persistent=False)

    def _state(self, state):
        return super()._state(state) - self.shift

    def update_statistics(self, batch):
        super().update_statistics(batch)
        self.shift += batch["state"].mean(0)


class StdIgnored(GaussianPolicy):
    """Offers initial stds to the trainer's probe (as ``log_std_init: auto``) but never sets them:
    every rollout of the probe would explore at the first std."""

    @staticmethod
    def probes_std(cfg):
        return True

    def set_exploration_std(self, std):
        pass


@pytest.mark.parametrize(
    "cls, failed, needle",
    [
        (RatioOff, ["ratio_one", "ratio_after_sync"], "max |logp - old_logp| = 0.01"),
        (
            DeadParameter,
            ["gradients"],
            "1 of 14 trainable parameters get no usable gradient from logp + entropy + "
            "values + supervised_loss: unused (no gradient)",
        ),
        (GlobalNoiseEval, ["eval_deterministic"], "two eval rollouts with equally seeded generators differ: actions"),
        (SampledEval, ["eval_deterministic"], "eval should ignore the generator (greedy / mean), but another seed"),
        (
            UnsavedStatistics,
            ["save_load"],
            "after load_state_dict a fresh policy rolls out differently: actions differ",
        ),
        (StdIgnored, ["exploration_stds"], "at std 0.135, not less than"),
    ],
)
def test_broken_policies_fail_for_the_right_reason(cls, failed, needle):
    result = check_policy(cls, verbose=False)  # a subclass gets the tiny setup of its config's type
    assert result.failed == failed, f"\n{result}"
    assert needle in result[failed[0]].detail, result[failed[0]].detail
    assert len(result) == 8 + (cls is StdIgnored)


def test_a_policy_that_cannot_be_built_fails_naming_why():
    result = check_policy("gaussian", sim="prompts", verbose=False)  # no state vector to read
    assert result.failed == ["build"] and "reads the state vector" in result["build"].detail
    result = check_policy("gaussian", ["hiddn=8"], verbose=False)
    assert result.failed == ["build"] and "unknown config key 'hiddn'" in result["build"].detail


def test_cli_check_policy(capsys):
    assert main(["check", "policy", "gaussian", "hidden=8", "sim.num_objects=2"]) == 0
    out = capsys.readouterr().out
    assert "ok    ratio_one" in out and "policy 'gaussian' passed 8 contract checks" in out
    assert main(["check", "policy", "gaussian", "sim=prompts"]) == 1
    assert "policy 'gaussian' FAILED 1 of 1 contract checks: build" in capsys.readouterr().out
    assert main(["check", "policy", "gaussian", "hidden"]) == 2
    assert main(["check", "policy", "nope"]) == 2
