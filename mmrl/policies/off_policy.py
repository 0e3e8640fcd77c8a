"""The off-policy roles: hooks beyond the base contract (`mmrl.policies.base.Policy`) that a policy
class opts into by subclassing one of the classes below, for the trainer's off-policy mode (SAC,
DSRL, RLPD, residual RL: `mmrl.trainer.off_policy`) and nothing else.

- `OffPolicyActor`: SAC's actor. Its transitions are replayed from a buffer: ``replay_state(obs)`` is
  what a transition's ``state`` / ``next_state`` hold (the simulator's state vector by default),
  ``sample_reparameterized(state, generator)`` draws differentiable tanh-squashed actions of replayed
  states with their log-probs, ``env_actions`` / ``replay_actions`` map its actions to the
  environment's and back (RLPD's demonstrations), ``replay_action_width`` / ``replay_dim`` size the
  critics. The Gaussian policy (``squash: true``), DSRL and residual RL are off-policy actors.
- `LatentNoiseBase`: a flow policy whose action chunk is a deterministic function of its initial
  noise (``act_from_noise``, with ``noise_shape`` and ``observation_features`` / ``feature_dim``):
  the frozen base a latent-noise actor (DSRL, `mmrl.policies.dsrl`) or a residual actor
  (`mmrl.policies.residual`) steers. The flow VLA and LeRobot's flow VLAs are such bases.

A role is declared by the class (``role``, read by `mmrl.capabilities.roles_of`) and the capability
it serves (`mmrl.capabilities.ROLES`) by the configuration: ``Capabilities.reparameterized`` (a
Gaussian policy is SAC's actor only with ``squash: true``) and ``Capabilities.latent_noise``. When a
config loads, an objective that needs ``reparameterized`` (``sac``) with a policy whose class is no
`OffPolicyActor` fails in one line, as DSRL's or residual RL's ``policy.base`` without the
`LatentNoiseBase` role does (`mmrl.experiment.ExperimentConfig.check_capabilities`).
"""

from __future__ import annotations

from typing import ClassVar, Generic

import torch

from mmrl.policies.base import C, Policy


class OffPolicyActor(Policy[C], Generic[C]):
    """SAC's actor in the trainer's off-policy mode (``Capabilities.reparameterized``): the hooks the
    replay buffer, the critics and the uniform actions before learning starts call. A subclass
    implements `sample_reparameterized` (and its ``rollout`` draws its training actions from the same
    distribution); every other hook has a default for a policy acting on the simulator's state vector."""

    #: the role this class gives its subclasses (`mmrl.capabilities.ROLES`)
    role: ClassVar[str] = "OffPolicyActor"

    def replay_action_width(self, action_dim: int) -> int:
        """Width of a replayed action row (what SAC's critics read beside `replay_state`): the action
        chunk, ``chunk_size * action_dim``, by default. A latent-noise actor (DSRL) replays its noise."""
        return self.chunk_size * action_dim

    @property
    def replay_dim(self) -> int:
        """Width of `replay_state`'s rows (the critics of the off-policy mode read it). Default:
        ``state_dim``."""
        return self.state_dim or 0

    def replay_state(self, obs) -> torch.Tensor:
        """``[B, replay_dim]`` float: what the off-policy mode replays of observations ``obs`` (an
        `Observation` of B envs) as a transition's ``state`` / ``next_state``; a rollout's batch
        ``state`` rows are these. Default: the simulator's state vector."""
        if obs.state is None:
            raise ValueError("replayed transitions need the simulator's state vector, and this one has none")
        return obs.state.float()

    def env_actions(self, obs, actions: torch.Tensor) -> torch.Tensor:
        """What the environment receives for actions ``[B, chunk, action_dim]`` in [-1, 1] of the
        space `sample_reparameterized` draws in (the off-policy mode's uniform actions before learning
        starts). Default: the actions themselves; a latent-space policy decodes them."""
        return actions

    def replay_actions(self, obs, chunk: torch.Tensor) -> torch.Tensor:
        """The inverse of `env_actions`: the replayed actions ``[B, chunk, action_dim]`` in [-1, 1]
        whose environment actions are ``chunk`` (env units) for observations ``obs``, clipped to
        [-1, 1] where ``chunk`` lies outside what the policy can act. What a demonstration's chunk
        becomes in the replay buffer (RLPD). Default: ``chunk`` itself, clipped."""
        return chunk.float().clamp(-1.0, 1.0)

    def sample_reparameterized(
        self, state: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """SAC's actor (the trainer's off-policy mode, ``Capabilities.reparameterized``): for replayed
        states ``[B, state_dim]`` (the rollout batch's ``state`` rows), actions ``[B, chunk, action_dim]``
        in [-1, 1] drawn by the reparameterisation trick (differentiable w.r.t. the policy's parameters)
        and their log-probs ``[B]`` (the chunk's sum, with the tanh change of variables). The policy's
        rollout must draw its training actions from the same distribution."""
        raise NotImplementedError(f"{type(self).__name__} has no reparameterised actions (SAC)")


class LatentNoiseBase(Policy[C], Generic[C]):
    """A flow policy with a deterministic map from initial noise to an action chunk
    (``Capabilities.latent_noise``): what DSRL's latent-noise actor and residual RL's actor act
    through, reading its `observation_features`. A subclass implements all four hooks."""

    #: the role this class gives its subclasses (`mmrl.capabilities.ROLES`)
    role: ClassVar[str] = "LatentNoiseBase"

    @property
    def noise_shape(self) -> tuple[int, ...]:
        """Shape of one decision's initial noise of a flow policy (``Capabilities.latent_noise``),
        e.g. ``(chunk, action_dim)``."""
        raise NotImplementedError(f"{type(self).__name__} samples from no initial noise")

    def act_from_noise(self, obs, noise: torch.Tensor) -> torch.Tensor:
        """``Capabilities.latent_noise``: the deterministic action chunk ``[B, chunk, action_dim]`` (in
        the environment's units) that the flow's ODE integrates from the initial ``noise`` ``[B,
        *noise_shape]`` for observations ``obs``: the policy's own ``eval_method: ode`` sample when
        ``noise`` is the noise it would draw. No gradient."""
        raise NotImplementedError(f"{type(self).__name__} has no deterministic noise -> action map")

    @property
    def feature_dim(self) -> int:
        """Width of `observation_features`' rows (``Capabilities.latent_noise``)."""
        raise NotImplementedError(f"{type(self).__name__} exposes no observation features")

    def observation_features(self, obs) -> torch.Tensor:
        """``Capabilities.latent_noise``: ``[B, D]`` features of observations ``obs`` as the policy
        encodes them (images, instruction, state), detached: what a latent-noise actor reads."""
        raise NotImplementedError(f"{type(self).__name__} exposes no observation features")


__all__ = ["LatentNoiseBase", "OffPolicyActor"]
