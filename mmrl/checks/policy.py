"""Contract checker for policies (see `mmrl.policies.base`).

``check_policy(name_or_class, overrides)`` builds a policy in its tiny configuration (`TINY`: a few
config keys per registered policy, plus ``overrides``), pairs it with a small simulator of its family
(`reach` for VLAs and the Gaussian policy, `qa` for the VLM, `prompts` for diffusion), runs every
check below and returns a `PolicyCheckResult`: one line per check with what it measured, ``ok``
when all passed. Unlike the simulator and reward checkers it does not stop at the first failure:
each check after ``build`` runs on its own, so one report names every broken part. It uses only the
contract: ``configure``, the constructor ``(cfg, action_dim, state_dim)``, ``check_simulator``,
``rollout``, ``evaluate``, ``supervised_loss`` on rows of ``warm_start_batch``, ``after_step``,
``update_statistics``, ``sync_rollout`` and the module's ``state_dict``. As in the trainer, rollouts
run with the module in eval mode and ``evaluate`` in train mode.

Checks, in order:

- ``build``: the config (tiny keys + overrides, validated like YAML), the simulator, the policy; a
  capability it declares whose hooks are a role (`mmrl.capabilities.ROLES`: ``reparameterized``,
  ``latent_noise``) comes with the role's class among its bases (`mmrl.policies.off_policy`).
- ``rollout``: a train-mode rollout of B envs is a `Decision`: a `Batch` whose every value has B rows,
  and actions of its declared ``action_type`` (`Policy.capabilities`: float ``[B, chunk_size,
  action_dim]`` finite, B `Completions`, or uint8 images of the simulator's size); ``old_logp``
  ``[B, *logp_shape]`` finite, of the rank its declared log-prob level says; ``old_values`` ``[B]``
  exactly when it declares a critic; ``ref_logp`` exactly when its KL reference is ``logp``.
- ``ratio_one``: before an update ``evaluate`` gives the rollout's log-probs (max |logp - old_logp|
  over the ``logp_mask`` elements <= ``LOGP_TOL``) and values (|values - old_values|).
- ``replay``: ``evaluate`` twice on the batch is identical; shapes ``logp = old_logp``,
  ``logp_mask`` bool like ``logp``, ``entropy`` a finite scalar, ``values`` ``[B]`` with a critic;
  a shuffled minibatch (rows ``B-1 .. 1``) gets the full batch's log-probs of its rows.
- ``eval_deterministic``: two ``mode="eval"`` rollouts with equally seeded generators (and different
  global RNG states) are identical; where the tiny setup says eval ignores the generator (greedy
  or mean actions: ``TinySetup.eval_ignores_seed``) another generator seed gives the same actions,
  else whether it changes them is reported.
- then one simulated update: every trainable parameter moves by ``1e-2 * N(0, 1)``, then
  ``after_step``, ``update_statistics(batch)``, ``sync_rollout`` (as the trainer calls them); if
  one of these hooks raises, that is reported as ``update_hooks`` and the checks below do not run.
- ``ratio_after_sync``: a new rollout still has ratio 1 (the rollout follows the trained weights).
- ``gradients``: a loss of ``evaluate``'s masked log-probs (random weights), entropy, values and KL,
  plus ``supervised_loss`` on a warm-start batch made of the rollout where the policy has one, gives
  every ``requires_grad`` parameter a finite, not-all-zero gradient (the ones that do not are
  listed). It runs after the simulated update, so zero-initialised layers (LoRA B, an output
  layer) pass gradient as they do from the first step on.
- ``save_load``: ``state_dict`` into a fresh policy of the same config (built with another seed)
  reproduces the train-mode rollout bit for bit with an equally seeded generator (``uid``, a replay
  handle, excepted).

A policy that does not act (``Capabilities.acts`` False: a world model, trained by its warm start
alone) gets ``build``, then ``warm_start_only`` (``supervised_loss`` on rows of ``warm_start_batch``
of episodes of random actions recorded in the simulator, `mmrl.episodes.record_episodes`: finite,
one per row, finite gradients for every trainable weight) and ``save_load`` (its loss under equal
draws, instead of a rollout).

CLI: ``mmrl check policy NAME [key=value ...]``: policy config keys, and ``sim=NAME``,
``sim.KEY=VALUE`` (simulator kwargs), ``device=cuda`` for the checker itself.
"""

from __future__ import annotations

import copy
import functools
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mmrl.batch import Batch
from mmrl.capabilities import ROLES, missing_role
from mmrl.policies.base import Decision, Evaluation, Policy, PolicyConfig
from mmrl.policies.off_policy import OffPolicyActor
from mmrl.simulator import Completions, Observation, Simulator

LOGP_TOL = 1e-5  # recomputed vs rollout log-probs (and values) before an update
UPDATE_SCALE = 1e-2  # std of the simulated update of every trainable parameter
_TINY_DIRS: list[tempfile.TemporaryDirectory] = []  # removed at exit


@functools.cache
def tiny_smolvlm_folder() -> str:
    """A tiny random-weight SmolVLM (Idefics3) saved once per process, for ``model: <folder>``."""
    from mmrl.tiny.tiny_models import tiny_image_text_model

    _TINY_DIRS.append(tempfile.TemporaryDirectory(prefix="mmrl_check_smolvlm_"))
    tiny_image_text_model(_TINY_DIRS[-1].name)
    return _TINY_DIRS[-1].name


@functools.cache
def tiny_wan_folder() -> str:
    """A tiny random-weight diffusers Wan pipeline saved once per process, for ``pretrained: <folder>``."""
    from mmrl.tiny.tiny_wan import tiny_wan_pipeline

    _TINY_DIRS.append(tempfile.TemporaryDirectory(prefix="mmrl_check_wan_"))
    return str(tiny_wan_pipeline(_TINY_DIRS[-1].name))


@dataclass
class TinySetup:
    """How the checker builds one policy type: config keys on top of the config class defaults (a
    zero-argument callable is called for its value) and the simulator it acts in."""

    policy: dict = field(default_factory=dict)
    sim: str = "reach"
    sim_kwargs: dict = field(default_factory=lambda: {"image_size": 32, "max_episode_steps": 8})
    eval_ignores_seed: bool = False  # greedy / mean-action evaluation: the generator is not used


QA = {"dataset": "shapes_vqa", "dataset_kwargs": {"num_samples": 16, "tasks": ["count"]}}
TINY: dict[str, TinySetup] = {
    "flow_vla": TinySetup({"dim": 32, "expert_dim": 32, "expert_layers": 1}),  # eval: ODE from sampled noise
    "gaussian": TinySetup({"hidden": 16, "chunk_size": 2}, eval_ignores_seed=True),  # eval: the mean
    # eval: the actor's mean noise through the base's ODE (the base's critic left out: DSRL trains none)
    "dsrl": TinySetup(
        {"hidden": 16, "base": {"dim": 32, "expert_dim": 32, "expert_layers": 1, "critic": False}},
        eval_ignores_seed=True,
    ),
    # eval: the base's zero-noise chunk plus the actor's mean correction
    "residual": TinySetup(
        {"hidden": 16, "base": {"dim": 32, "expert_dim": 32, "expert_layers": 1, "critic": False}},
        eval_ignores_seed=True,
    ),
    "token_vla": TinySetup(
        {
            "model": tiny_smolvlm_folder,
            "num_bins": 32,
            "image_size": 32,
            "chunk_size": 2,
            "action_tokens": "new",
            "max_instruction_tokens": 32,
        },
        eval_ignores_seed=True,
    ),
    "vlm": TinySetup(
        {"model": "tiny", "max_new_tokens": 6, "max_prompt_tokens": 64}, "qa", QA, eval_ignores_seed=True
    ),  # eval_temperature 0: greedy
    "diffusion": TinySetup(
        {"num_steps": 4, "eval_num_steps": 4, "width": 16, "image_size": 16}, "prompts", {"image_size": 16}
    ),  # eval: ODE from sampled noise
    # a model the warm start alone trains: its loss on recorded random episodes, its weights' round trip
    "world_model": TinySetup({"ch": 8, "dim": 16, "mid_blocks": 1}),
    # the same on the tiny random-weight Wan pipeline (16 px: 4 x 4 latents, 2 x 2 tokens per frame)
    "wan_world_model": TinySetup(
        {"pretrained": tiny_wan_folder, "max_sequence_length": 8, "cond_hidden": 16, "sample_steps": 2},
        sim_kwargs={"image_size": 16, "max_episode_steps": 8},
    ),
    # a tiny random-initialised LeRobot SmolVLA (model=tiny:pi0 / tiny:pi05 for the others); eval: ODE
    "lerobot": TinySetup(
        {
            "model": "tiny:smolvla",
            "chunk_size": 2,
            "finetune": "full",
            "tiny": {"image_size": 32, "patch_size": 8, "hidden": 32, "layers": 2, "horizon": 4},
        }
    ),
}


class CheckFailed(AssertionError):
    pass


@dataclass
class Outcome:
    check: str
    ok: bool
    detail: str

    def __str__(self) -> str:
        return f"  {'ok  ' if self.ok else 'FAIL'}  {self.check:<19} {self.detail}"


class PolicyCheckResult(list):
    """`Outcome` per check, in order."""

    @property
    def ok(self) -> bool:
        return bool(self) and all(o.ok for o in self)

    @property
    def passed(self) -> list[str]:
        return [o.check for o in self if o.ok]

    @property
    def failed(self) -> list[str]:
        return [o.check for o in self if not o.ok]

    def __getitem__(self, key):  # result["ratio_one"] -> its Outcome
        return next(o for o in self if o.check == key) if isinstance(key, str) else super().__getitem__(key)

    def __str__(self) -> str:
        return "\n".join(map(str, self))


def ensure(cond: Any, msg: str) -> None:
    if not cond:
        raise CheckFailed(msg)


def max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    ensure(a.shape == b.shape, f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    d = (a.detach().float() - b.detach().to(a.device).float()).abs()
    d = d[mask.to(d.device).bool()] if mask is not None else d
    return float(d.max()) if d.numel() else 0.0


def batch_diff(a: Batch, b: Batch, skip: tuple[str, ...] = ("uid",)) -> str | None:
    """First difference between two rollout batches (exact comparison), or None."""
    if set(a) != set(b):
        return f"keys differ: {sorted(set(a) ^ set(b))}"
    for k in a:
        if k in skip or torch.equal(a[k].cpu(), b[k].cpu()):
            continue
        if a[k].shape != b[k].shape:
            return f"{k} shapes differ: {tuple(a[k].shape)} vs {tuple(b[k].shape)}"
        return f"{k} differs (max |diff| {max_diff(a[k], b[k]):.3g})"
    return None


def decision_diff(a: Decision, b: Decision) -> str | None:
    """First difference between two decisions: their environment actions, then their batches."""
    x, y = a.actions, b.actions
    if isinstance(x, torch.Tensor):
        if x.shape != y.shape:
            return f"actions shapes differ: {tuple(x.shape)} vs {tuple(y.shape)}"
        if not torch.equal(x.cpu(), y.cpu()):
            return f"actions differ (max |diff| {max_diff(x, y):.3g})"
    elif list(x) != list(y):
        first = next(i for i, (u, v) in enumerate(zip(x, y)) if u != v)
        return f"actions differ (answer {first}: {x[first]!r} vs {y[first]!r})"
    return batch_diff(a.batch, b.batch)


class _Checker:
    # made by `build`, the first check: no other check runs when it fails
    cfg: PolicyConfig
    policy: Policy
    obs: Observation
    actions: Any  # the last rollout's environment actions

    def __init__(
        self,
        cls: type[Policy],
        setup: TinySetup,
        cfg_source: dict,
        cfg_overrides: Sequence[str],
        sim_name: str,
        sim_kwargs: dict,
        device: str,
        seed: int,
        num_envs: int,
        verbose: bool,
    ):
        self.cls, self.setup, self.device, self.seed, self.verbose = cls, setup, device, seed, verbose
        self.cfg_source, self.cfg_overrides = cfg_source, list(cfg_overrides)
        self.sim_name, self.sim_kwargs, self.num_envs = sim_name, sim_kwargs, num_envs
        self.result = PolicyCheckResult()
        self.sim: Simulator | None = None  # closed when the checks end
        self.batch: Batch | None = None  # the last rollout's batch; None after a simulated update

    def gen(self, offset: int = 0) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(self.seed + offset)

    def run_check(self, name: str, fn: Callable[[], str | None], quiet: bool = False) -> bool:
        """Run one check and record its outcome (``quiet``: recorded only if it fails)."""
        try:
            outcome = Outcome(name, True, fn() or "")
        except Exception as exc:  # a crash inside the policy is that check's failure
            msg = str(exc) if isinstance(exc, CheckFailed) else f"{type(exc).__name__}: {exc}"
            outcome = Outcome(name, False, msg.strip().splitlines()[0][:400] if msg.strip() else type(exc).__name__)
        if quiet and outcome.ok:
            return True
        self.result.append(outcome)
        if self.verbose:
            print(outcome, flush=True)
        return outcome.ok

    def run(self) -> PolicyCheckResult:
        try:
            if not self.run_check("build", self.build):
                return self.result
            if not self.policy.caps.acts:  # a model the warm start alone trains (a world model)
                for name in ("warm_start_only", "save_load"):
                    self.run_check(name, getattr(self, name))
                return self.result
            # a policy without replayable log-probs (SAC's actor) is checked on its reparameterised actions
            likelihood = self.policy.caps.likelihood
            for name in ("rollout", *(("ratio_one", "replay") if likelihood else ("reparameterized",))):
                self.run_check(name, getattr(self, name))
            self.run_check("eval_deterministic", self.eval_deterministic)
            if self.policy.caps.exploration_probe:
                self.run_check("exploration_stds", self.exploration_stds)
            if self.run_check("update_hooks", self.simulated_update, quiet=True):
                again = "ratio_after_sync" if likelihood else "reparameterized_after_sync"
                for name in (again, "gradients", "save_load"):
                    self.run_check(name, getattr(self, name))
        finally:
            if self.sim is not None:
                self.sim.close()
        return self.result

    # -------------------------------------------------------------- setup
    def make_policy(self, seed: int) -> Policy:
        sim = self.sim
        assert sim is not None, "build makes the simulator first"
        torch.manual_seed(seed)
        policy = self.cls(self.cfg, action_dim=sim.action_dim, state_dim=sim.state_dim).to(self.device)
        policy.check_simulator(sim)
        return policy

    def build(self) -> str:
        from mmrl.config import load_config
        from mmrl.registry import SIMULATORS

        source = {k: v() if callable(v) else v for k, v in self.cfg_source.items()}
        cfg = load_config(self.cls.config_class, source, self.cfg_overrides)
        if self.cls.capabilities(cfg).action_type == "video" and self.sim_name == "prompts":
            # a video generator (policy.num_frames): the same prompts, as clips of its frame count
            frames = getattr(cfg, "num_frames")  # noqa: B009 (a video policy config has it; PolicyConfig does not)
            self.sim_name, self.sim_kwargs = "video_prompts", {**self.sim_kwargs, "num_frames": frames}
        self.sim = sim = SIMULATORS.get(self.sim_name)(num_envs=self.num_envs, **self.sim_kwargs)
        self.cfg = self.cls.configure(cfg, sim)
        self.policy = self.make_policy(self.seed)
        self.obs = sim.reset(self.seed)
        caps = self.policy.caps
        lacking = missing_role(self.cls, [c for c in ROLES if getattr(caps, c)])
        ensure(
            lacking is None,
            f"declares Capabilities.{lacking}, but {self.cls.__name__} does not subclass its role "
            f"{ROLES.get(lacking or '')} (mmrl.policies.off_policy), whose hooks it needs",
        )
        n = sum(p.numel() for p in self.policy.parameters() if p.requires_grad)
        return f"{type(self.policy).__name__} on '{self.sim_name}' ({self.num_envs} envs), {n} trainable weights"

    def decide(self, policy: Policy | None = None, offset: int = 0, mode: str = "train") -> Decision:
        policy = policy or self.policy
        policy.eval()  # as the trainer collects
        out = policy.rollout(self.obs, self.gen(offset), mode=mode)
        ensure(
            isinstance(out, tuple) and len(out) == 2,
            f"rollout must return a Decision (batch, actions), got {type(out).__name__}",
        )
        return Decision(*out)

    def rollout_batch(self, policy: Policy | None = None, offset: int = 0, mode: str = "train") -> Batch:
        return self.decide(policy, offset, mode).batch

    def check_actions(self, actions) -> str:
        """The decision's actions are what the simulator's ``step_chunk`` takes (`ACTION_TYPES`)."""
        p, b, kind, sim = self.policy, self.num_envs, self.policy.caps.action_type, self.sim
        assert sim is not None, "build made the simulator"
        if kind == "text":
            ensure(
                isinstance(actions, Completions) and len(actions) == b,
                f"text actions must be Completions of {b} answers, got {type(actions).__name__}",
            )
            return f"{b} answers"
        ensure(isinstance(actions, torch.Tensor), f"actions must be a tensor, got {type(actions).__name__}")
        if kind in ("image", "video"):
            want = (b, *sim.image_shape)
            ensure(
                actions.dtype == torch.uint8 and tuple(actions.shape) == want,
                f"{kind} actions must be uint8 {want}, got {actions.dtype} {tuple(actions.shape)}",
            )
        else:
            want = (b, p.chunk_size, sim.action_dim)
            ensure(
                tuple(actions.shape) == want, f"actions {tuple(actions.shape)} != [B, chunk_size, action_dim] {want}"
            )
            ensure(torch.isfinite(actions).all(), "actions have NaN/inf")
        return f"actions {want}"

    def need_batch(self) -> Batch:
        if self.batch is None:
            raise CheckFailed("no rollout batch (see the rollout check)")
        return self.batch

    def evaluate(self, batch: Batch, grad: bool = False) -> Evaluation:
        self.policy.train()  # as the trainer updates
        with torch.set_grad_enabled(grad):
            return self.policy.evaluate(batch)

    # -------------------------------------------------------------- checks
    def rollout(self) -> str:
        p, b = self.policy, self.num_envs
        batch, actions = self.decide()
        ensure(isinstance(batch, Batch), f"rollout's batch must be a Batch, got {type(batch).__name__}")
        rows = {k: tuple(v.shape) for k, v in batch.items() if v.dim() == 0 or v.shape[0] != b}
        ensure(not rows, f"every value needs {b} rows (the trainer indexes them): {rows}")
        shown = self.check_actions(actions)
        caps = p.caps
        ensure(
            tuple(batch["old_logp"].shape) == (b, *p.logp_shape),
            f"old_logp {tuple(batch['old_logp'].shape)} != [B, *logp_shape] {(b, *p.logp_shape)}",
        )
        rank = {"decision": 0, "element": 2, "token": 1, "step": 1}[caps.logp]
        ensure(
            len(p.logp_shape) == rank,
            f"logp_shape {p.logp_shape} has rank {len(p.logp_shape)}, but the declared "
            f"log-prob level {caps.logp!r} has rank {rank}",
        )
        ensure(torch.isfinite(batch["old_logp"]).all(), "old_logp has NaN/inf")
        ensure(
            ("old_values" in batch) == caps.critic,
            f"old_values {'missing' if caps.critic else 'present'} with capabilities critic={caps.critic}",
        )
        if caps.critic:
            ensure(tuple(batch["old_values"].shape) == (b,), f"old_values {tuple(batch['old_values'].shape)} != [B]")
        ensure(
            ("ref_logp" in batch) == (caps.kl_reference == "logp"),
            f"ref_logp {'present' if 'ref_logp' in batch else 'missing'} with capabilities kl_reference="
            f"{caps.kl_reference!r}",
        )
        self.batch, self.actions = batch, actions
        return f"{shown}, old_logp {tuple(batch['old_logp'].shape)}, keys {', '.join(sorted(batch))}"

    def ratio(self, batch: Batch) -> tuple[float, str]:
        out = self.evaluate(batch)
        ensure(
            out.logp.shape == batch["old_logp"].shape,
            f"logp {tuple(out.logp.shape)} != old_logp {tuple(batch['old_logp'].shape)}",
        )
        d = max_diff(out.logp, batch["old_logp"], out.logp_mask)
        text = f"max |logp - old_logp| = {d:.3g}"
        if out.logp_mask is not None:
            text += f" over {int(out.logp_mask.sum())}/{out.logp_mask.numel()} masked elements"
        ensure(d <= LOGP_TOL, f"{text} > {LOGP_TOL}: the PPO ratio is not 1 before an update")
        if out.values is not None and "old_values" in batch:
            dv = max_diff(out.values, batch["old_values"])
            text += f", max |values - old_values| = {dv:.3g}"
            ensure(dv <= LOGP_TOL, f"{text} > {LOGP_TOL}")
        return d, text

    def ratio_one(self) -> str:
        return self.ratio(self.need_batch())[1]

    def exploration_stds(self) -> str:
        """``Capabilities.exploration_probe``: the initial stds offered fall, and a rollout at the
        first and at the last replays with ratio 1, its actions spreading less at the last."""
        p = self.policy
        stds = p.exploration_stds()
        ensure(
            len(stds) >= 2 and all(a > b > 0 for a, b in zip(stds, stds[1:])),
            f"exploration_stds() must offer at least two positive, falling stds, got {stds}",
        )
        spread = []
        try:
            for std in (stds[0], stds[-1]):
                p.set_exploration_std(std)
                d = self.decide(offset=7)
                self.ratio(d.batch)
                spread.append(float(torch.as_tensor(d.actions).float().std()))
        finally:
            p.set_exploration_std(stds[0])
        ensure(
            spread[1] < spread[0],
            f"actions spread {spread[1]:.3g} at std {stds[-1]:.3g}, not less than {spread[0]:.3g}",
        )
        return (
            f"{len(stds)} stds, {stds[0]:.3g} -> {stds[-1]:.3g}: ratio 1 at both, "
            f"actions spread {spread[0]:.3g} -> {spread[1]:.3g}"
        )

    def replay(self) -> str:
        p, batch, b = self.policy, self.need_batch(), self.num_envs
        e1, e2 = self.evaluate(batch), self.evaluate(batch)
        want = (b, *p.logp_shape)
        ensure(tuple(e1.logp.shape) == want, f"logp {tuple(e1.logp.shape)} != [B, *logp_shape] {want}")
        if e1.logp_mask is not None:
            ensure(
                e1.logp_mask.dtype == torch.bool and e1.logp_mask.shape == e1.logp.shape,
                f"logp_mask must be bool like logp, got {e1.logp_mask.dtype} {tuple(e1.logp_mask.shape)}",
            )
        ent = torch.as_tensor(e1.entropy)
        ensure(ent.dim() == 0 and torch.isfinite(ent), f"entropy must be a finite scalar, got {ent}")
        ensure(
            (e1.values is not None) == p.caps.critic,
            f"values {'missing' if p.caps.critic else 'present'} with capabilities critic={p.caps.critic}",
        )
        if e1.values is not None:
            ensure(tuple(e1.values.shape) == (b,), f"values {tuple(e1.values.shape)} != [B] ({b},)")
        twice = max_diff(e1.logp, e2.logp)
        ensure(twice == 0, f"evaluate twice on one batch differs by {twice:.3g}")
        idx = torch.arange(b - 1, 0, -1) if b > 1 else torch.arange(1)
        sub = self.evaluate(batch.index(idx))
        mask = None if e1.logp_mask is None else e1.logp_mask[idx.to(e1.logp_mask.device)]
        d = max_diff(sub.logp, e1.logp[idx.to(e1.logp.device)], mask)
        ensure(
            d <= LOGP_TOL,
            f"a minibatch (rows {idx.tolist()}) gets other log-probs than the full batch: "
            f"max |diff| {d:.3g} > {LOGP_TOL}",
        )
        return f"logp {want} identical twice; minibatch rows {idx.tolist()} max |diff| {d:.3g}"

    def reparameterized(self) -> str:
        """A policy without replayable log-probs: SAC's actor (``Capabilities.reparameterized``), whose
        rollout's ``state`` rows are its `OffPolicyActor.replay_state` and whose reparameterised actions of
        them lie in [-1, 1] with finite log-probs."""
        p, b = self.policy, self.num_envs
        if self.batch is None:
            self.batch, self.actions = self.decide(offset=2)
        ensure(p.caps.reparameterized, "no replayable log-probs (likelihood=false) and no reparameterized actions")
        if not isinstance(p, OffPolicyActor):  # build reported it already: the role's hooks are missing
            raise CheckFailed(f"{type(p).__name__} is not an OffPolicyActor (mmrl.policies.off_policy)")
        state = p.replay_state(self.obs)
        ensure(
            tuple(state.shape) == (b, p.replay_dim),
            f"replay_state {tuple(state.shape)} != [B, replay_dim] {(b, p.replay_dim)}",
        )
        ensure(torch.equal(self.batch["state"].cpu(), state.cpu()), "the rollout's state rows are not its replay_state")
        with torch.no_grad():
            a, logp = p.sample_reparameterized(state, self.gen(5))
        want = (b, *self.batch["actions"].shape[1:])
        ensure(tuple(a.shape) == want, f"actions {tuple(a.shape)} unlike the rollout's {want}")
        ensure(bool(a.abs().max() <= 1), f"reparameterized actions leave [-1, 1]: max |a| {a.abs().max():.3g}")
        ensure(tuple(logp.shape) == (b,) and bool(torch.isfinite(logp).all()), "log-probs must be finite [B]")
        return f"state {tuple(state.shape)} = replay_state; actions {tuple(a.shape)} in [-1, 1], finite log-probs"

    def reparameterized_after_sync(self) -> str:
        return self.reparameterized() + " (after an update and sync_rollout)"

    def eval_deterministic(self) -> str:
        torch.manual_seed(self.seed + 11)  # a policy drawing from the global RNG gets other draws
        a = self.decide(mode="eval")
        torch.manual_seed(self.seed + 12)
        b = self.decide(mode="eval")
        diff = decision_diff(a, b)
        ensure(diff is None, f"two eval rollouts with equally seeded generators differ: {diff}")
        c = self.decide(offset=1, mode="eval")
        other = decision_diff(a, c)
        if self.setup.eval_ignores_seed:
            ensure(other is None, f"eval should ignore the generator (greedy / mean), but another seed gives: {other}")
            return "repeatable, and independent of the generator seed"
        return f"repeatable; another generator seed {'changes ' + other.split()[0] if other else 'gives the same'}"

    def simulated_update(self) -> None:
        """What one iteration's update does to a policy, with random steps instead of gradients."""
        g = torch.Generator().manual_seed(self.seed + 3)
        with torch.no_grad():
            for p in self.policy.parameters():
                if p.requires_grad:
                    p.add_(torch.randn(p.shape, generator=g).to(p) * UPDATE_SCALE)
        self.policy.after_step()
        if self.batch is not None:
            self.policy.update_statistics(self.batch)
        self.policy.sync_rollout()
        self.batch = None

    def ratio_after_sync(self) -> str:
        self.batch, self.actions = self.decide(offset=2)
        return self.ratio(self.batch)[1] + " (after an update and sync_rollout)"

    def demonstrations(self, batch: Batch) -> dict:
        """Warm-start data of the simulator family's datasets, made of the rollout's actions."""
        obs, actions = self.obs, self.actions
        if self.policy.caps.action_type == "text":  # questions: prompt, images, solution
            images = obs.images if obs.images is not None else [[im] for im in obs.image]
            return {"prompt": list(obs.instruction), "images": images, "solution": list(actions)}
        if self.policy.caps.action_type in ("image", "video"):  # (image or video, prompt) pairs: the generated ones
            return {self.policy.caps.action_type: actions.cpu(), "prompt": list(obs.instruction)}
        data = {"image": obs.image, "instruction": list(obs.instruction), "actions": actions}
        return data if obs.state is None else {**data, "state": obs.state}

    def gradients(self) -> str:
        p, batch = self.policy, self.need_batch()
        p.zero_grad(set_to_none=True)
        g = torch.Generator().manual_seed(self.seed + 4)
        if p.caps.likelihood:
            out = self.evaluate(batch, grad=True)
            w = torch.rand(out.logp.shape, generator=g).to(out.logp)
            if out.logp_mask is not None:
                w = w * out.logp_mask
            loss, parts = (w * out.logp).sum() + out.entropy, ["logp", "entropy"]
            for name, x in (("values", out.values), ("kl", out.kl)):
                if x is not None:
                    loss, parts = loss + (torch.rand(x.shape, generator=g).to(x) * x).sum(), parts + [name]
        else:  # SAC's actor: its reparameterised actions and their log-probs
            if not isinstance(p, OffPolicyActor):
                raise CheckFailed("no replayable log-probs (likelihood=false), and not SAC's actor (OffPolicyActor)")
            p.train()
            a, logp = p.sample_reparameterized(batch["state"], self.gen(6))
            loss, parts = (torch.rand(a.shape, generator=g).to(a) * a).sum() + logp.sum(), ["sample_reparameterized"]
        p.train()
        try:
            loss = loss + p.supervised_loss(p.warm_start_batch(self.demonstrations(batch)).to(self.device)).sum()
            parts.append("supervised_loss")
        except NotImplementedError:
            pass
        loss.backward()
        bad = []
        trainable = [(n, q) for n, q in p.named_parameters() if q.requires_grad]
        for n, q in trainable:
            if q.grad is None:
                bad.append(f"{n} (no gradient)")
            elif not torch.isfinite(q.grad).all():
                bad.append(f"{n} (NaN/inf)")
            elif not q.grad.abs().sum() > 0:
                bad.append(f"{n} (all zero)")
        p.zero_grad(set_to_none=True)
        ensure(trainable, "no parameter requires grad")
        ensure(
            not bad,
            f"{len(bad)} of {len(trainable)} trainable parameters get no usable gradient from "
            f"{' + '.join(parts)}: {', '.join(bad[:8])}{' ...' if len(bad) > 8 else ''}",
        )
        return f"all {len(trainable)} trainable parameters get finite non-zero gradients from {' + '.join(parts)}"

    def recorded_episodes(self) -> dict:
        """Episodes of random actions in the check's simulator, one step per row (`mmrl.episodes`):
        the data a policy that does not act (a world model) is trained on."""
        from mmrl.episodes import record_episodes
        from mmrl.policies.base import Decision

        sim, gen = self.sim, self.gen(7)
        assert sim is not None
        width = sim.action_dim

        class Random(torch.nn.Module):
            def rollout(self, obs, generator=None, mode="train"):
                return Decision(Batch(), torch.rand(len(obs.instruction), 1, width, generator=gen) * 2 - 1)

        return record_episodes(Random(), sim, [self.seed + i for i in range(sim.num_envs)], gen)

    def warm_start_only(self) -> str:
        """A policy that does not act: ``supervised_loss`` on rows of ``warm_start_batch`` of recorded
        episodes is finite per row, and (after every weight moves by ``1e-2 * N(0, 1)``, so that
        zero-initialised layers pass gradient) gives every trainable weight a finite gradient."""
        p = self.policy
        self.ws_batch = batch = p.warm_start_batch(self.recorded_episodes())
        with torch.no_grad():
            for q in p.parameters():
                if q.requires_grad:
                    q.add_(1e-2 * torch.randn(q.shape, generator=self.gen(8)).to(q))
        p.train()
        loss = p.supervised_loss(batch.to(self.device))
        ensure(loss.shape == (batch.size,), f"supervised_loss gave shape {tuple(loss.shape)}, not [{batch.size}]")
        ensure(bool(torch.isfinite(loss).all()), "supervised_loss is not finite")
        loss.sum().backward()
        trainable = [(n, q) for n, q in p.named_parameters() if q.requires_grad]
        bad = [n for n, q in trainable if q.grad is None or not torch.isfinite(q.grad).all()]
        p.zero_grad(set_to_none=True)
        ensure(not bad, f"{len(bad)} of {len(trainable)} trainable parameters get no finite gradient: {bad[:8]}")
        mean = loss.mean().item()
        return f"{batch.size} recorded steps, mean loss {mean:.4g}; {len(trainable)} parameters get gradients"

    def save_load(self) -> str:
        if not self.policy.caps.acts:  # its loss under equal draws, instead of a rollout
            return self.save_load_weights()
        state = copy.deepcopy(self.policy.state_dict())
        fresh = self.make_policy(self.seed + 1)
        before = decision_diff(self.decide(), self.decide(fresh))
        fresh.load_state_dict(state)
        diff = decision_diff(self.decide(), self.decide(fresh))
        ensure(diff is None, f"after load_state_dict a fresh policy rolls out differently: {diff}")
        note = "" if before else " (a fresh policy matched even before loading: the round trip proved little)"
        return f"{len(state)} state entries; a fresh policy's rollout is identical after loading{note}"

    def save_load_weights(self) -> str:
        """``state_dict`` into a fresh model reproduces its warm-start loss under equal draws."""
        batch = getattr(self, "ws_batch", None) or self.policy.warm_start_batch(self.recorded_episodes())
        fresh = self.make_policy(self.seed + 1)
        fresh.load_state_dict(copy.deepcopy(self.policy.state_dict()))
        losses = []
        for model in (self.policy, fresh):
            model.eval()
            torch.manual_seed(self.seed)
            losses.append(model.supervised_loss(batch.to(self.device)).detach())
        ensure(torch.equal(*losses), f"after load_state_dict the loss differs by {max_diff(*losses):.3g}")
        return f"a fresh model's warm-start loss is identical after loading ({batch.size} rows)"


def split_overrides(items: Sequence[str]) -> tuple[list[str], dict]:
    """CLI ``key=value`` items -> (policy config overrides, checker kwargs: ``sim``, ``sim_kwargs``,
    ``device``)."""
    import yaml

    cfg: list[str] = []
    kw: dict[str, Any] = {"sim_kwargs": {}}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"argument {item!r} must look like key=value")
        if key in ("sim", "device"):
            kw[key] = value
        elif key.startswith("sim."):
            kw["sim_kwargs"][key[4:]] = yaml.safe_load(value)
        else:
            cfg.append(item)
    return cfg, kw


def check_policy(
    policy: str | type[Policy],
    overrides: Sequence[str] | dict = (),
    *,
    sim: str | None = None,
    sim_kwargs: dict | None = None,
    device: str = "cpu",
    seed: int = 0,
    num_envs: int = 4,
    verbose: bool = True,
) -> PolicyCheckResult:
    """Run the contract checks on a registered policy type (or a `Policy` subclass, set up as the
    registered type its config's ``type`` names); print a line per check and return the outcomes.

    ``overrides``: policy config keys on top of the tiny setup, as ``["key=value", ...]`` or a dict.
    ``sim`` / ``sim_kwargs``: the simulator (default: the tiny setup's; kwargs are merged).
    """
    from mmrl.registry import POLICIES, MissingDependencyError

    name = policy if isinstance(policy, str) else policy.config_class.type
    setup = TINY.get(name, TinySetup())
    try:
        cls = POLICIES.get(policy) if isinstance(policy, str) else policy  # an unknown name raises
    except MissingDependencyError as exc:  # a policy that cannot be built fails, naming why
        result = PolicyCheckResult([Outcome("build", False, str(exc))])
        if verbose:
            print(result[0])
        return result
    source = {**setup.policy, **(overrides if isinstance(overrides, dict) else {}), "type": name}
    listed = [] if isinstance(overrides, dict) else list(overrides)
    sim_name = sim or setup.sim
    kwargs = {**(setup.sim_kwargs if sim_name == setup.sim else {}), **(sim_kwargs or {})}
    if verbose and name not in TINY:
        print(f"  note  no tiny setup for policy '{name}': its config defaults on '{sim_name}'")
    return _Checker(cls, setup, source, listed, sim_name, kwargs, device, seed, num_envs, verbose).run()


__all__ = ["check_policy", "PolicyCheckResult", "TINY", "TinySetup", "split_overrides", "tiny_smolvlm_folder"]
