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
from mmrl.policies.base import Decision, Evaluation, Policy, PolicyConfig
from mmrl.utils.rows import randn_rows


@dataclass
class GaussianConfig(PolicyConfig):
    """Configuration of `GaussianPolicy` (the ``policy`` section of an experiment)."""

    type: str = "gaussian"
    chunk_size: int = 1
    hidden: int = 64  # width of the actor and critic MLPs (SB3: 64)
    layers: int = 2  # hidden layers of each (SB3: 2)
    log_std_init: float = 0.0  # initial log std of every action dimension (SB3: 0)
    logp_level: Literal["chunk", "dim"] = "chunk"
    critic: bool = True
    obs_norm: bool = True


def mlp(inp: int, hidden: int, layers: int, out: int) -> nn.Sequential:
    """tanh MLP ``inp -> hidden x layers -> out`` with orthogonal init (gain sqrt 2, last 0.01 / 1),
    as SB3 and CleanRL initialise their PPO networks."""
    sizes, mods = [inp] + [hidden] * layers, []
    for a, b in zip(sizes, sizes[1:]):
        lin = nn.Linear(a, b)
        nn.init.orthogonal_(lin.weight, math.sqrt(2))
        nn.init.zeros_(lin.bias)
        mods += [lin, nn.Tanh()]
    last = nn.Linear(sizes[-1], out)
    nn.init.zeros_(last.bias)
    mods.append(last)
    return nn.Sequential(*mods)


class GaussianPolicy(Policy[GaussianConfig]):
    """Diagonal-Gaussian MLP actor + MLP critic on the state vector; see the module docstring."""

    config_class = GaussianConfig

    @classmethod
    def capabilities(cls, cfg: GaussianConfig) -> Capabilities:
        """Action chunks, exact Gaussian log-probs (per chunk or per element), a critic with ``critic``."""
        return Capabilities(
            logp="decision" if cfg.logp_level == "chunk" else "element",
            critic=cfg.critic,
            fixes={
                "critic": "set policy.critic=true, or use a group estimator "
                "(algorithm.advantage: grpo, rloo, ...) with group_size >= 2",
                "likelihood_free": "the Gaussian policy has no flow-matching loss: use algorithm.objective=ppo",
                "kl_reference": "the Gaussian policy keeps no reference model: set algorithm.kl_coef=0",
            },
        )

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
        self.actor = mlp(state_dim, cfg.hidden, cfg.layers, width)
        nn.init.orthogonal_(cast(nn.Linear, self.actor[-1]).weight, 0.01)
        self.log_std = nn.Parameter(torch.full((width,), float(cfg.log_std_init)))
        self.value_head = mlp(state_dim, cfg.hidden, cfg.layers, 1) if cfg.critic else None
        if self.value_head is not None:
            nn.init.orthogonal_(cast(nn.Linear, self.value_head[-1]).weight, 1.0)
        self.obs_norm = RunningMeanStd(state_dim) if cfg.obs_norm else None
        self.logp_shape = () if cfg.logp_level == "chunk" else (cfg.chunk_size, action_dim)

    def _state(self, state: torch.Tensor) -> torch.Tensor:
        state = state.to(self.log_std.device).float()
        return state if self.obs_norm is None else self.obs_norm.normalize(state)

    def _dist(self, state: torch.Tensor) -> torch.distributions.Normal:
        mean = self.actor(self._state(state)).view(-1, self.cfg.chunk_size, self.action_dim)
        std = self.log_std.exp().view(self.cfg.chunk_size, self.action_dim).expand_as(mean)
        return torch.distributions.Normal(mean, std)

    def _logp(self, dist: torch.distributions.Normal, actions: torch.Tensor) -> torch.Tensor:
        logp = dist.log_prob(actions)
        return logp.sum((1, 2)) if self.cfg.logp_level == "chunk" else logp

    def _values(self, state: torch.Tensor) -> torch.Tensor | None:
        return None if self.value_head is None else self.value_head(self._state(state)).squeeze(-1)

    @torch.no_grad()
    def rollout(self, obs, generator: torch.Generator | None = None, mode: str = "train") -> Decision:
        dist = self._dist(obs.state)
        if mode == "train":
            noise = randn_rows(dist.mean.shape, generator=generator, device=dist.mean.device)
            actions = dist.mean + dist.stddev * noise
        else:
            actions = dist.mean
        batch = Batch(
            actions=actions, old_logp=self._logp(dist, actions), state=obs.state.to(self.log_std.device).float()
        )
        values = self._values(obs.state)
        if values is not None:
            batch["old_values"] = values
        return Decision(batch, batch["actions"])

    def evaluate(self, batch: Batch) -> Evaluation:
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
        """Behaviour cloning: minus the log-likelihood of the demonstrated chunk, per sample."""
        dist = self._dist(batch["state"])
        return -dist.log_prob(batch["actions"].to(dist.mean.device)).sum((1, 2))
