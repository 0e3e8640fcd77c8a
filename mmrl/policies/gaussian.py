"""A plain diagonal-Gaussian MLP policy over the state vector (Stable-Baselines3's ``MlpPolicy``).

    state -> (normalised) -> actor MLP -> mean of the action chunk [C, A]; std = exp(log_std), a
    state-independent parameter -> action ~ N(mean, std^2), executed as is (the simulator clips to
    [-1, 1], as SB3 clips to the action bounds); a separate critic MLP on the same state.

It is the reference point for the flow policies on state tasks: the same trainer, rollouts,
normalisation and PPO objective with the textbook policy class, so a gap between the two on a
control task is the policy class's, not the algorithm's (``benchmarks/vs_sb3.py``). The log-prob
is one number per decision (sum over the chunk), or per action dimension (``logp_level: dim``).
Evaluation takes the mean action (deterministic). It reads no image: use it where the simulator
has a state vector.

``squash: true`` makes it SAC's actor (the trainer's off-policy mode, ``algorithm.objective: sac``):
the actor MLP outputs the mean and the log std of ``u`` (state-dependent, clamped to [-20, 2] as
SB3's), the action is ``tanh(u)`` and its log-prob carries the change of variables
``- sum log(1 - tanh(u)^2 + 1e-6)``; evaluation takes ``tanh(mean)``. Its actions are drawn by the
reparameterisation trick (`sample_reparameterized`: the class is an
`mmrl.policies.off_policy.OffPolicyActor`, SAC's actor with ``squash`` only); PPO, which replays
stored actions' log-probs, is not offered with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, cast

import torch
from torch import nn

from mmrl.algorithms.normalization import RunningMeanStd
from mmrl.batch import Batch
from mmrl.capabilities import Capabilities
from mmrl.policies.base import Decision, Evaluation, PolicyConfig, log_std_grid
from mmrl.policies.off_policy import OffPolicyActor
from mmrl.utils.rows import randn_rows


@dataclass
class GaussianConfig(PolicyConfig):
    """Configuration of `GaussianPolicy` (the ``policy`` section of an experiment)."""

    type: str = "gaussian"
    chunk_size: int = 1
    hidden: int = 64  # width of the actor and critic MLPs (SB3: 64)
    layers: int = 2  # hidden layers of each (SB3: 2)
    # initial log std of every action dimension (SB3: 0), or "auto": chosen by the trainer from the
    # first rollouts, as the flow policy's action_log_std_init (mmrl.trainer.exploration)
    log_std_init: float | Literal["auto"] = 0.0
    logp_level: Literal["chunk", "dim"] = "chunk"
    critic: bool = True
    obs_norm: bool = True
    # SAC's actor: tanh-squashed actions, state-dependent std (see the module docstring)
    squash: bool = False
    activation: Literal["tanh", "relu"] = "tanh"  # of the hidden layers (SB3's PPO: tanh, its SAC: relu)


#: SB3's bounds of a squashed actor's log std, and the epsilon of the tanh correction
LOG_STD_MIN, LOG_STD_MAX, TANH_EPS = -20.0, 2.0, 1e-6


def mlp(inp: int, hidden: int, layers: int, out: int, activation: type[nn.Module] = nn.Tanh) -> nn.Sequential:
    """MLP ``inp -> hidden x layers -> out`` (tanh by default) with orthogonal init (gain sqrt 2,
    last 0.01 / 1), as SB3 and CleanRL initialise their PPO networks."""
    sizes, mods = [inp] + [hidden] * layers, []
    for a, b in zip(sizes, sizes[1:]):
        lin = nn.Linear(a, b)
        nn.init.orthogonal_(lin.weight, math.sqrt(2))
        nn.init.zeros_(lin.bias)
        mods += [lin, activation()]
    last = nn.Linear(sizes[-1], out)
    nn.init.zeros_(last.bias)
    mods.append(last)
    return nn.Sequential(*mods)


class GaussianPolicy(OffPolicyActor[GaussianConfig]):
    """Diagonal-Gaussian MLP actor + MLP critic on the state vector; see the module docstring."""

    config_class = GaussianConfig

    @classmethod
    def capabilities(cls, cfg: GaussianConfig) -> Capabilities:
        """Action chunks, exact Gaussian log-probs (per chunk or per element), a critic with ``critic``;
        with ``squash``: reparameterised tanh-squashed actions (SAC) instead of replayable log-probs."""
        return Capabilities(
            logp="decision" if cfg.logp_level == "chunk" or cfg.squash else "element",
            critic=cfg.critic,
            likelihood=not cfg.squash,
            reparameterized=cfg.squash,
            exploration_probe=cls.probes_std(cfg),
            asynchronous=not cls.probes_std(cfg),  # the probe collects its rollouts in order
            fixes={
                "likelihood": "policy.squash=true draws tanh-squashed actions, whose log-probs PPO does not "
                "replay: set policy.squash=false, or use algorithm.objective=sac",
                "reparameterized": "set policy.squash=true (SAC's tanh-squashed actor)",
                "critic": "set policy.critic=true, or use a group estimator "
                "(algorithm.advantage: grpo, rloo, ...) with group_size >= 2",
                "likelihood_free": "the Gaussian policy has no flow-matching loss: use algorithm.objective=ppo",
                "kl_reference": "the Gaussian policy keeps no reference model: set algorithm.kl_coef=0",
                "asynchronous": "the initial std's probe (policy.log_std_init: auto) needs synchronous rollouts: "
                "set policy.log_std_init to a number (e.g. 0) or trainer.async_staleness=0",
            },
        )

    @staticmethod
    def probes_std(cfg: GaussianConfig) -> bool:
        """Whether the trainer chooses the initial std (`exploration_stds`; squashed actors have none)."""
        return cfg.log_std_init == "auto" and not cfg.squash

    def exploration_stds(self) -> list[float]:
        return log_std_grid(0.0) if self.probes_std(self.cfg) else []

    def set_exploration_std(self, std: float) -> None:
        assert self.log_std is not None, "set_exploration_std needs policy.squash=false"
        with torch.no_grad():
            self.log_std.fill_(math.log(std))

    @property
    def chunk_size(self) -> int:
        return self.cfg.chunk_size

    uses_images = False

    def __init__(self, cfg: GaussianConfig, action_dim: int, state_dim: int | None = None):
        super().__init__()
        self.state_dim = state_dim
        if not state_dim:
            raise ValueError(
                "policy 'gaussian' reads the state vector, and this simulator has none "
                "(state_dim = 0): use policy.type=flow_vla, whose image encoder reads images"
            )
        self.cfg, self.action_dim = cfg, action_dim
        width = cfg.chunk_size * action_dim
        act = nn.ReLU if cfg.activation == "relu" else nn.Tanh
        # squashed: the actor outputs the mean and the (state-dependent) log std of every element
        self.actor = mlp(state_dim, cfg.hidden, cfg.layers, width * (2 if cfg.squash else 1), act)
        nn.init.orthogonal_(cast(nn.Linear, self.actor[-1]).weight, 0.01)
        start = 0.0 if cfg.log_std_init == "auto" else float(cfg.log_std_init)  # auto: std 1, then the probe's
        self.log_std = None if cfg.squash else nn.Parameter(torch.full((width,), start))
        self.value_head = mlp(state_dim, cfg.hidden, cfg.layers, 1, act) if cfg.critic else None
        if self.value_head is not None:
            nn.init.orthogonal_(cast(nn.Linear, self.value_head[-1]).weight, 1.0)
        self.obs_norm = RunningMeanStd(state_dim) if cfg.obs_norm else None
        self.logp_shape = () if cfg.logp_level == "chunk" else (cfg.chunk_size, action_dim)

    @property
    def _device(self) -> torch.device:
        return cast(nn.Linear, self.actor[0]).weight.device

    def _state(self, state: torch.Tensor) -> torch.Tensor:
        state = state.to(self._device).float()
        return state if self.obs_norm is None else self.obs_norm.normalize(state)

    def _dist(self, state: torch.Tensor) -> torch.distributions.Normal:
        """The Gaussian of the chunk ``[B, C, A]`` (squashed: of ``u``, before the tanh)."""
        out = self.actor(self._state(state)).view(
            -1, self.cfg.chunk_size, self.action_dim * (2 if self.cfg.squash else 1)
        )
        if self.log_std is None:  # squashed: state-dependent log std
            mean, log_std = out.chunk(2, dim=-1)
            return torch.distributions.Normal(mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp())
        std = self.log_std.exp().view(self.cfg.chunk_size, self.action_dim).expand_as(out)
        return torch.distributions.Normal(out, std)

    @staticmethod
    def _squashed_logp(dist: torch.distributions.Normal, u: torch.Tensor) -> torch.Tensor:
        """[B] log-prob of ``tanh(u)`` for ``u`` [B, C, A] drawn from ``dist``: the Gaussian's, minus
        ``sum log(1 - tanh(u)^2 + eps)`` (the tanh's change of variables, SB3's and CleanRL's form)."""
        return (dist.log_prob(u) - torch.log(1.0 - torch.tanh(u) ** 2 + TANH_EPS)).sum((1, 2))

    def sample_reparameterized(
        self, state: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tanh(mean + std * noise) [B, C, A], its log-prob [B])``, differentiable (``squash``)."""
        if not self.cfg.squash:
            raise NotImplementedError("the Gaussian policy draws reparameterised actions with policy.squash=true")
        dist = self._dist(state)
        u = dist.mean + dist.stddev * randn_rows(dist.mean.shape, generator=generator, device=dist.mean.device)
        return torch.tanh(u), self._squashed_logp(dist, u)

    def _logp(self, dist: torch.distributions.Normal, actions: torch.Tensor) -> torch.Tensor:
        logp = dist.log_prob(actions)
        return logp.sum((1, 2)) if self.cfg.logp_level == "chunk" else logp

    def _values(self, state: torch.Tensor) -> torch.Tensor | None:
        return None if self.value_head is None else self.value_head(self._state(state)).squeeze(-1)

    @torch.no_grad()
    def rollout(self, obs, generator: torch.Generator | None = None, mode: str = "train") -> Decision:
        dist = self._dist(obs.state)
        if self.cfg.squash:
            u = dist.mean
            if mode == "train":
                u = u + dist.stddev * randn_rows(dist.mean.shape, generator=generator, device=dist.mean.device)
            actions, logp = torch.tanh(u), self._squashed_logp(dist, u)
        else:
            if mode == "train":
                noise = randn_rows(dist.mean.shape, generator=generator, device=dist.mean.device)
                actions = dist.mean + dist.stddev * noise
            else:
                actions = dist.mean
            logp = self._logp(dist, actions)
        batch = Batch(actions=actions, old_logp=logp, state=obs.state.to(self._device).float())
        values = self._values(obs.state)
        if values is not None:
            batch["old_values"] = values
        return Decision(batch, batch["actions"])

    def evaluate(self, batch: Batch) -> Evaluation:
        if self.cfg.squash:  # the config check refuses likelihood objectives first
            raise NotImplementedError("policy.squash=true: no replayable log-probs (use algorithm.objective=sac)")
        dist = self._dist(batch["state"])
        return Evaluation(
            logp=self._logp(dist, batch["actions"]),
            entropy=dist.entropy().sum((1, 2)).mean(),
            values=self._values(batch["state"]),
        )

    @torch.no_grad()
    def value(self, obs) -> torch.Tensor | None:
        return self._values(obs.state)

    def update_statistics(self, batch: Batch) -> None:
        if self.obs_norm is not None and "state" in batch:
            self.obs_norm.update(batch["state"][batch["valid"]] if "valid" in batch else batch["state"])

    def supervised_loss(self, batch: Batch) -> torch.Tensor:
        """Behaviour cloning: minus the log-likelihood of the demonstrated chunk, per sample (squashed:
        of ``atanh`` of the action, clamped inside (-1, 1))."""
        dist = self._dist(batch["state"])
        actions = batch["actions"].to(dist.mean.device).float()
        if self.cfg.squash:
            return -self._squashed_logp(dist, torch.atanh(actions.clamp(-1 + TANH_EPS, 1 - TANH_EPS)))
        return -dist.log_prob(actions).sum((1, 2))
