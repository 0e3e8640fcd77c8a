"""The off-policy mode of the trainer's loop (issue 36): SAC, with RLPD's additions.

The loop is the trainer's own (`mmrl.trainer.trainer.Trainer.iteration`); `OffPolicy` is its learner
(`mmrl.trainer.learner.Learner`, beside `mmrl.trainer.on_policy.OnPolicy`), so in this mode its stages
are:

- collect: a fixed-length rollout (``trainer.rollout_steps = T`` decisions per env, the episodes going
  on across iterations: `mmrl.trainer.collectors.FixedLengthCollector`), which also records each
  decision's ``next_state`` (the final observation's state where an episode ended). Until
  ``algorithm.sac.learning_starts`` env steps the actions are uniform in [-1, 1] (`UniformActions`,
  as SB3's ``learning_starts``);
- learn (`OffPolicy.learn`): the rollout's transitions go into the `ReplayBuffer` (`transitions`: the
  chunk flattened into one action, n-step returns, ``discount = gamma^m``, 0 where the episode
  TERMINATED, kept through a time limit: a truncated episode is bootstrapped from its final state),
  then ``utd_ratio`` gradient steps per transition collected, each on a batch drawn from the buffer
  (RLPD: ``demo_fraction`` of it from a demonstration buffer, `mixed_sample`), each followed by the
  Polyak update of the target critics.

The math is `mmrl.algorithms.sac`'s pure functions, composed in one place: the ``sac`` objective
(`mmrl.trainer.objectives.sac_objective`). What SAC trains beside the policy lives here, owned by the
mode, not by the policy: the twin Q critics, their targets and log(alpha) (`SoftCritics`), since they
score (state, action) pairs of any policy that can draw reparameterised actions
(``Capabilities.reparameterized``, `OffPolicyActor.sample_reparameterized`). One Adam holds three parameter
groups (the policy's at ``trainer.lr``, the critics' at ``trainer.value_lr``, log(alpha) at
``algorithm.sac.temperature_lr``): Adam's update is per parameter, so this is the three optimizers of
SB3 / CleanRL. The buffer, the critics, their targets, log(alpha), the optimizer and the count of
gradient steps are saved with every checkpoint (`OffPolicy.state_dict`): resume is exact. With
``algorithm.sac.checkpoint_buffer: false`` the online buffer is left out (the demonstrations stay):
a resume restores the rest and refills the empty buffer with the restored policy's transitions
(as many rows as learning started with, at least a batch) before its next gradient step; the
update-to-data count goes on from the checkpoint's. Such a resume is not bit-identical.

Replayed observations are the rollout batch's ``state`` rows, which are ``OffPolicyActor.replay_state`` of
the observations, as the ``next_state`` rows are of the observations reached (`mmrl.rollout.next_states`):
the simulator's state vector by default (the Gaussian MLP), a frozen encoder's features of image,
instruction and state for a policy that replays those (DSRL, `mmrl.policies.dsrl`: its actions are
latent noise, which ``OffPolicyActor.env_actions`` decodes for the uniform actions before learning
starts). The policy is an `mmrl.policies.off_policy.OffPolicyActor`: the config check refuses the
mode for any other. The Adam of the mode is built at its first use, after the warm start: it holds
the parameters trainable then (DSRL freezes its base when the warm start ends). Its config section,
`SACConfig` (``algorithm.sac``), is defined here beside it, as is the check of what the mode cannot
combine with (`check_off_policy`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from mmrl.algorithms.replay import ReplayBuffer, mixed_sample
from mmrl.algorithms.sac import n_step_returns, polyak_update
from mmrl.batch import Batch
from mmrl.config import ConfigError, check_range
from mmrl.data import check_dataset_choice
from mmrl.policies.base import Decision
from mmrl.policies.off_policy import OffPolicyActor
from mmrl.registry import OBJECTIVES
from mmrl.trainer.state import TrainerView, run_generator

Tensor = torch.Tensor

#: the fields of a replayed transition (every row of the buffer)
FIELDS = ("state", "actions", "rewards", "discount", "next_state")


@dataclass
class SACConfig:
    """The off-policy mode's options (``algorithm.sac``, read when ``algorithm.objective: sac``):
    SAC (Haarnoja et al. 2018) with SB3's defaults, and RLPD's additions (Ball et al. 2023: layer
    norm in the critics, a high update-to-data ratio, half of each batch from demonstrations). The
    actor learns at ``trainer.lr``, the critics at ``trainer.value_lr`` (null: ``trainer.lr``)."""

    buffer_size: int = 1_000_000  # transitions the replay buffer keeps (the newest)
    # whether checkpoints hold the replay buffer (then a resume is exact). false: they leave it out
    # (a million wide transitions are gigabytes per checkpoint); a resume then restores everything
    # else and refills an empty buffer with the restored policy's transitions before its next
    # gradient step (as many rows as learning started with, at least batch_size): not bit-identical
    checkpoint_buffer: bool = True
    batch_size: int = 256  # transitions per gradient step
    learning_starts: int = 100  # env steps of uniform random actions before the first gradient step
    utd_ratio: float = 1.0  # gradient steps per transition collected (RLPD: 10-20 with layer norm)
    tau: float = 0.005  # Polyak rate of the target critics
    temperature_lr: float | None = None  # learning rate of log(alpha); null = trainer.lr
    init_temperature: float = 1.0  # alpha at the start (SB3: 1.0)
    target_entropy: float | None = None  # null = -(the replayed action width: chunk_size * action_dim; DSRL: the noise)
    # the entropy bonus in the critics' target (SAC's soft backup). false: y = r + gamma min Q' (RLPD's
    # and DrQ's `backup_entropy` switch): with a positive entropy and time limits bootstrapped, the
    # bonus pays for staying in an episode, which works against tasks that end on success
    backup_entropy: bool = True
    n_step: int = 1  # n-step returns (stopping at a rollout's end: needs trainer.rollout_steps >= n_step)
    critic_hidden: int = 256  # width of each of the twin Q MLPs (SB3: 256)
    critic_layers: int = 2  # their hidden layers (SB3: 2)
    critic_layer_norm: bool = False  # RLPD: LayerNorm after every hidden layer of the critics
    # RLPD: a torch file of demonstration transitions (`mmrl.trainer.off_policy.load_demos`: state,
    # actions, rewards, next_state, terminated); `demo_fraction` of every batch is drawn from them
    demos: str | None = None
    demo_fraction: float = 0.5  # RLPD: the fraction of every batch drawn from the demonstrations
    # RLPD from a registered dataset of recorded episodes (one that records rewards and episode ends,
    # e.g. reach_demos), read after the warm start through the policy (`record_transitions`): its
    # features as the states, `Policy.replay_actions` of the recorded chunks as the actions
    demo_dataset: str | None = None
    demo_episodes: int = 1000  # episodes of demo_dataset (its num_episodes)
    demo_kwargs: dict = field(default_factory=dict)  # more arguments of its builder (checked strictly)

    def validate(self) -> None:
        check_range(
            self,
            {
                "buffer_size": ">=1",
                "batch_size": ">=1",
                "learning_starts": ">=0",
                "utd_ratio": ">0",
                "temperature_lr": ">0",
                "init_temperature": ">0",
                "n_step": ">=1",
                "critic_hidden": ">=1",
                "critic_layers": ">=1",
                "demo_fraction": "0..1",
                "demo_episodes": ">=1",
            },
        )
        if self.buffer_size < self.batch_size:
            raise ConfigError(
                f"'buffer_size' = {self.buffer_size} holds fewer transitions than one batch (batch_size = "
                f"{self.batch_size}): every gradient step would draw the same few transitions again; make "
                "buffer_size >= batch_size"
            )
        if not 0 < self.tau <= 1:
            raise ConfigError(f"'tau' = {self.tau!r} must be in (0, 1] (the Polyak rate; 1 copies the critics)")
        if self.demos is not None and not Path(self.demos).is_file():
            raise ConfigError(
                f"'demos' = {self.demos!r} is not a file: give a torch file of demonstration transitions "
                "(mmrl.trainer.off_policy.load_demos), or demos: null"
            )
        if self.demo_dataset is not None:
            check_dataset_choice("demo_dataset", self.demo_dataset, self.demo_kwargs)


def check_off_policy(cfg) -> None:
    """The off-policy mode (``algorithm.objective: sac``) of experiment ``cfg`` collects fixed-length
    rollouts that continue episodes into a replay buffer: what it cannot combine with fails here in one line."""
    a, t, sac = cfg.algorithm, cfg.trainer, cfg.algorithm.sac
    why = (
        "set trainer.rollout_steps >= 1 (decisions per env per iteration, e.g. 1 as SB3's SAC)"
        if not t.rollout_steps
        else f"set trainer.rollout_steps >= algorithm.sac.n_step ({sac.n_step}): n-step returns stop at a rollout's end"
        if t.rollout_steps < sac.n_step
        else "set algorithm.reward_norm=false (it scales on-policy rollouts)"
        if a.reward_norm
        else "set trainer.lr_schedule=constant"
        if t.lr_schedule != "constant"
        else "set trainer.engine.backend=torch"
        if t.engine.backend != "torch"
        else None
    )
    if why:
        raise ConfigError(f"'algorithm.objective' = {a.objective!r} (the off-policy mode): {why}")
    # the most env steps the run can take: iterations x decisions x envs x actions per decision
    chunk = int(getattr(cfg.policy, "chunk_size", 1) or 1)
    most = t.env_steps if t.env_steps is not None else t.iterations * t.rollout_steps * cfg.sim.num_envs * chunk
    if most and sac.learning_starts > most:
        budget = (
            f"trainer.env_steps={t.env_steps}"
            if t.env_steps is not None
            else (f"{t.iterations} iterations x {t.rollout_steps} decisions x {cfg.sim.num_envs} envs x {chunk} steps")
        )
        raise ConfigError(
            f"'algorithm.sac.learning_starts' = {sac.learning_starts} env steps of random actions is the whole run "
            f"({budget} = {most}): no gradient step would be taken; lower learning_starts or train longer"
        )


def q_mlp(inp: int, hidden: int, layers: int, layer_norm: bool) -> nn.Sequential:
    """ReLU MLP ``inp -> hidden x layers -> 1`` (torch's default init, as SB3's SAC critics), with a
    LayerNorm after every hidden linear layer when ``layer_norm`` (RLPD)."""
    sizes, mods = [inp] + [hidden] * layers, []
    for a, b in zip(sizes, sizes[1:]):
        mods += [nn.Linear(a, b), *([nn.LayerNorm(b)] if layer_norm else []), nn.ReLU()]
    mods.append(nn.Linear(sizes[-1], 1))
    return nn.Sequential(*mods)


class SoftCritics(nn.Module):
    """SAC's twin Q critics ``Q_i(state [B, D], action [B, W]) -> [B]``, their target copies (moved
    only by `polyak_update`, never by a gradient: they hold no gradient) and ``log_alpha``."""

    def __init__(
        self,
        state_dim: int,
        action_width: int,
        hidden: int = 256,
        layers: int = 2,
        layer_norm: bool = False,
        init_temperature: float = 1.0,
    ):
        super().__init__()
        self.q = nn.ModuleList(q_mlp(state_dim + action_width, hidden, layers, layer_norm) for _ in range(2))
        self.target_q = copy.deepcopy(self.q).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(init_temperature)))

    def forward(self, state: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        """The online critics' ``(q1 [B], q2 [B])``."""
        x = torch.cat([state, action], -1)
        return self.q[0](x).squeeze(-1), self.q[1](x).squeeze(-1)

    def target(self, state: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        """The target critics' ``(q1 [B], q2 [B])``."""
        x = torch.cat([state, action], -1)
        return self.target_q[0](x).squeeze(-1), self.target_q[1](x).squeeze(-1)

    def frozen(self, state: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        """The online critics with their parameters held fixed: gradients reach ``action`` (the
        actor's), not the critics."""
        x = torch.cat([state, action], -1)
        out = []
        for q in self.q:
            weights = {k: v.detach() for k, v in q.named_parameters()}
            out.append(torch.func.functional_call(q, weights, (x,)).squeeze(-1))
        return out[0], out[1]

    def polyak(self, tau: float) -> None:
        """``target <- (1 - tau) target + tau online``."""
        polyak_update(self.target_q.parameters(), self.q.parameters(), tau)


@dataclass
class SACAgent:
    """What the ``sac`` objective trains: the policy (the actor), its `SoftCritics`, the entropy
    target and the generator of this iteration's reparameterisation noise."""

    policy: nn.Module
    critics: SoftCritics
    target_entropy: float
    generator: torch.Generator | None = field(default=None)


def transitions(batch: Batch, gamma: float, n: int = 1) -> dict[str, Tensor]:
    """The replay rows of a fixed-length rollout ``[T, N, ...]`` (``state`` [T, N, D], ``actions``
    [T, N, C, A], ``rewards`` / ``terminated`` / ``truncated`` / ``valid`` [T, N], ``next_state``
    [T, N, D]): one per valid decision, time-major, with

    ``state`` [M, D], ``actions`` [M, C * A] (the chunk flattened: one action), ``rewards`` [M] (the
    n-step return, `n_step_returns`), ``discount`` [M] (``gamma^m``; 0 where the episode terminated
    within the m steps: nothing to bootstrap; a truncated one is bootstrapped) and ``next_state``
    [M, D] (the state after the return's last step: for an episode that ended there, its final state)."""
    returns, discount, last = n_step_returns(batch["rewards"], batch["terminated"], batch["truncated"], gamma, n)
    nxt = batch["next_state"]
    nxt = nxt.gather(0, last[..., None].expand(-1, -1, nxt.shape[-1]).to(nxt.device))
    valid = batch["valid"].bool()
    return {
        "state": batch["state"][valid].float(),
        "actions": batch["actions"].flatten(2)[valid].float(),
        "rewards": returns[valid].float(),
        "discount": discount[valid].float(),
        "next_state": nxt[valid].float(),
    }


def demo_transitions(data: dict, gamma: float) -> dict[str, Tensor]:
    """Demonstration transitions as replay rows (one-step): ``data`` holds ``state`` [M, D],
    ``actions`` [M, C, A] or [M, C * A] in [-1, 1], ``rewards`` [M], ``next_state`` [M, D] and
    ``terminated`` [M] (bool: the episode ended by the task there; a time limit is not an end)."""
    missing = [k for k in ("state", "actions", "rewards", "next_state", "terminated") if k not in data]
    if missing:
        raise ValueError(f"demonstration transitions lack {missing}; they hold: {', '.join(data)}")
    m = data["state"].shape[0]
    return {
        "state": data["state"].float(),
        "actions": data["actions"].reshape(m, -1).float(),
        "rewards": data["rewards"].float(),
        "discount": gamma * (1.0 - data["terminated"].float()),
        "next_state": data["next_state"].float(),
    }


#: what a dataset of recorded episodes holds for `record_transitions` (reach_demos' fields; ``state``
#: and ``final_state`` too where the simulator has a state vector): rows
#: sorted by episode, then step
RECORD_FIELDS = ("image", "instruction", "actions", "episode", "rewards", "terminated", "final_image")


@torch.no_grad()
def record_transitions(data: dict, policy, device: torch.device | str = "cpu", batch_size: int = 256) -> dict:
    """`demo_transitions`' fields of a dataset of recorded episodes (``RECORD_FIELDS``; one row per
    decision, sorted by episode, then step), as ``policy`` replays them: ``state`` / ``next_state``
    are `OffPolicyActor.replay_state` of the row's observation and of the next one (the next row of the same
    episode, else the episode's ``final_image`` / ``final_state``), ``actions`` are
    `OffPolicyActor.replay_actions` of the recorded chunk; ``rewards`` and ``terminated`` as recorded (a
    truncated episode's last row is bootstrapped from its final observation)."""
    from mmrl.simulator import Observation

    has_state = data.get("state") is not None
    missing = [k for k in RECORD_FIELDS + (("final_state",) if has_state else ()) if data.get(k) is None]
    if missing:
        raise ValueError(
            f"demonstration records lack {missing}: a dataset of recorded episodes with rewards and episode "
            f"ends is needed (reach_demos, or lerobot_dataset with demo_kwargs {{transitions: true}}); these "
            f"hold {', '.join(data)}"
        )
    episode = data["episode"].long()
    m = episode.shape[0]
    if m == 0:
        raise ValueError("the demonstration dataset holds no records")
    if bool((episode[1:] < episode[:-1]).any()):
        raise ValueError("demonstration records must be sorted by episode, then step")
    cont = torch.zeros(m, dtype=torch.bool)  # the next row continues the episode
    cont[:-1] = episode[1:] == episode[:-1]
    nxt = (torch.arange(m) + 1).clamp(max=m - 1)

    def observation(rows: Tensor, after: bool) -> Observation:
        image, state = data["image"], data["state"]
        if after:  # the observation after each row: the next row's, or the episode's final one
            c = cont[rows]
            ends = episode[rows]
            image = torch.where(c.view(-1, *[1] * (image.dim() - 1)), image[nxt[rows]], data["final_image"][ends])
            state = torch.where(c[:, None], state[nxt[rows]], data["final_state"][ends]) if has_state else None
        else:
            image, state = image[rows], state[rows] if has_state else None
        instruction = [data["instruction"][i] for i in rows.tolist()]
        return Observation(image.to(device), instruction, None if state is None else state.to(device).float())

    parts: dict[str, list[Tensor]] = {"state": [], "next_state": [], "actions": []}
    for start in range(0, m, batch_size):
        rows = torch.arange(start, min(start + batch_size, m))
        obs = observation(rows, after=False)
        parts["state"].append(policy.replay_state(obs).cpu())
        parts["next_state"].append(policy.replay_state(observation(rows, after=True)).cpu())
        parts["actions"].append(policy.replay_actions(obs, data["actions"][rows].to(device)).cpu())
    out = {k: torch.cat(v) for k, v in parts.items()}
    out["rewards"] = data["rewards"].float()
    out["terminated"] = data["terminated"].bool()
    return out


def load_demos(path: str | Path, gamma: float) -> ReplayBuffer:
    """A replay buffer of the demonstration transitions in the torch file ``path`` (a dict of the
    tensors `demo_transitions` reads; ``torch.save(dict, path)`` writes one). No mmrl dataset
    builder produces gym transitions yet: this file is the hook RLPD's demonstrations come through."""
    from mmrl.errors import DatasetError

    where = f"algorithm.sac.demos = {str(path)!r}"
    try:  # tensors only: a pickle's code never runs
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a pickle of other objects, random bytes, a truncated file
        import pickle

        why = (
            "a pickle of objects other than tensors, or no pickle at all; it is loaded with weights_only=True, "
            "so no code in it runs"
            if isinstance(exc, pickle.UnpicklingError)
            else f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ''}"
        )
        raise DatasetError(
            f"{where} is not a torch file of tensors ({why}); write the demonstrations as "
            "torch.save({'state': ..., 'actions': ..., 'rewards': ..., 'next_state': ..., 'terminated': ...}, path)"
        ) from None
    if not isinstance(data, dict):
        raise DatasetError(
            f"{where} holds a {type(data).__name__}, not a dict of tensors (state, actions, rewards, next_state, "
            "terminated)"
        )
    try:
        rows = demo_transitions(data, gamma)
    except ValueError as exc:
        raise DatasetError(f"{where}: {exc}") from None
    buf = ReplayBuffer(rows["state"].shape[0])
    buf.add(rows)
    return buf


def check_demo_rows(rows: dict[str, Tensor], state_dim: int, action_width: int, where: str) -> None:
    """Demonstration replay rows (`demo_transitions`) fit the run before any work: states of the
    policy's replayed state size, actions of its replayed width inside [-1, 1] (the squashed actor's
    range: a target it can never reach otherwise trains without a word), every number finite.
    A `mmrl.errors.DatasetError` naming ``where`` and the fix otherwise."""
    from mmrl.errors import DatasetError

    def fail(problem: str) -> None:
        raise DatasetError(f"{where}: {problem}")

    for key, want in (("state", state_dim), ("next_state", state_dim), ("actions", action_width)):
        got = rows[key].shape[-1] if rows[key].dim() == 2 else None
        if got != want:
            fail(
                f"'{key}' rows are {list(rows[key].shape[1:])} wide, this run's policy replays {want} "
                f"({'the state vector of this simulator' if key != 'actions' else 'chunk_size x action_dim'}): "
                "record them from the same simulator and policy settings"
            )
    for key, value in rows.items():
        bad = ~torch.isfinite(value)
        if bool(bad.any()):
            n = int(bad.reshape(bad.shape[0], -1).any(-1).sum()) if value.dim() else 1
            fail(f"{n} transition(s) hold NaN or infinite '{key}': drop or repair them")
    outside = rows["actions"].abs() > 1.0 + 1e-6
    if bool(outside.any()):
        fail(
            f"{int(outside.any(-1).sum())} transition(s) hold actions outside [-1, 1] (largest |a| = "
            f"{rows['actions'].abs().max().item():.3g}), which a squashed (tanh) actor can never take: scale them "
            "into the simulator's normalised [-1, 1] actions"
        )


class UniformActions:
    """The behaviour before learning starts: the policy's rollout rows with its actions replaced by
    uniform draws in [-1, 1] (from the rollout's generator), as SB3 acts before ``learning_starts``."""

    def __init__(self, policy):
        self.policy = policy

    @property
    def chunk_size(self) -> int:
        return self.policy.chunk_size

    def rollout(self, obs, generator: torch.Generator | None = None, mode: str = "train") -> Decision:
        out = self.policy.rollout(obs, generator=generator, mode=mode)
        a = out.batch["actions"]
        uniform = torch.rand(a.shape, generator=generator, device=a.device) * 2 - 1
        out.batch["actions"] = uniform
        return Decision(out.batch, self.policy.env_actions(obs, uniform))

    def value(self, obs) -> Tensor | None:
        return self.policy.value(obs)

    def replay_state(self, obs) -> Tensor:
        return self.policy.replay_state(obs)


class OffPolicy:
    """The off-policy mode's state and its learn stage (see the module docstring): the trainer's
    learner (`mmrl.trainer.learner.Learner`) for an objective that replays transitions. ``step(opt,
    loss)`` is the trainer's guarded optimizer step (a non-finite loss or gradient skips the step
    and is counted); ``seed`` (``run.seed``) seeds the row indices of each iteration's batches."""

    #: the key of its state in a checkpoint (`mmrl.trainer.checkpoint`'s extra), as checkpoints name it
    checkpoint_key = "off_policy"

    def __init__(
        self, algo, trainer_cfg, policy: OffPolicyActor, action_dim: int, device: torch.device, step, seed: int = 0
    ):
        sac = algo.sac
        self.algo, self.sac, self.policy, self.device, self.step = algo, sac, policy, torch.device(device), step
        self.seed = seed
        width = policy.replay_action_width(action_dim)
        self.critics = SoftCritics(
            policy.replay_dim, width, sac.critic_hidden, sac.critic_layers, sac.critic_layer_norm, sac.init_temperature
        ).to(self.device)
        target_entropy = -float(width) if sac.target_entropy is None else float(sac.target_entropy)
        self.agent = SACAgent(policy, self.critics, target_entropy)
        self.trainer_cfg = trainer_cfg
        self._optimizer: torch.optim.Adam | None = None  # built at first use (`optimizer`)
        self.buffer = ReplayBuffer(sac.buffer_size)  # host memory; batches move to the device
        self.demos = load_demos(sac.demos, algo.gamma) if sac.demos else None
        if self.demos is not None:  # before any work: the file's rows fit this run
            filled = {k: v[: len(self.demos)] for k, v in self.demos.data.items()}
            check_demo_rows(filled, policy.replay_dim, width, f"algorithm.sac.demos = {sac.demos!r}")
        self.action_width = width
        self.learning_rows = 0  # transitions collected since learning started (utd_ratio counts them)
        self.updates = 0  # gradient steps taken (or skipped for a non-finite loss)
        self.start_rows = 0  # rows in the buffer when learning started
        self.refill_rows = 0  # rows to collect before learning goes on (a resume without the buffer)

    @property
    def optimizer(self) -> torch.optim.Adam:
        """One Adam, three groups: the policy's parameters trainable at its first use (after the warm
        start, or a checkpoint's weights loaded) at ``trainer.lr``, the critics' at ``value_lr``,
        log(alpha) at ``temperature_lr``."""
        if self._optimizer is None:
            lr = self.trainer_cfg.lr
            self._optimizer = torch.optim.Adam(
                [
                    {"params": [p for p in self.policy.parameters() if p.requires_grad], "lr": lr},
                    {"params": list(self.critics.q.parameters()), "lr": self.trainer_cfg.value_lr or lr},
                    {"params": [self.critics.log_alpha], "lr": self.sac.temperature_lr or lr},
                ]
            )
        return self._optimizer

    @classmethod
    def for_trainer(cls, trainer: TrainerView) -> OffPolicy:
        """The mode of ``trainer``'s run: its config, policy, device and guarded optimizer step, the
        width of its simulator's actions."""
        cfg = trainer.cfg
        return cls(
            cfg.algorithm,
            cfg.trainer,
            trainer.policy,
            trainer.eval_sim.action_dim,
            trainer.device,
            trainer.optimizer_step,
            seed=cfg.run.seed,
        )

    def after_warm_start(self, records: Callable[..., dict], log: Callable[[str], None]) -> None:
        """RLPD from a dataset (``algorithm.sac.demo_dataset``): its recorded episodes, loaded by
        ``records`` (the warm start's loader) once the policy is warm-started, replayed through it
        (`record_transitions`) into the demonstration buffer; nothing without one."""
        sac = self.sac
        if not sac.demo_dataset:
            return
        data = records(sac.demo_dataset, sac.demo_episodes, sac.demo_kwargs)
        where = f"algorithm.sac.demo_dataset = {sac.demo_dataset!r}"
        self.add_demos(record_transitions(data, self.policy, self.device), where)
        log(
            f"RLPD: {len(self.demos or [])} demonstration transitions of {sac.demo_episodes} "
            f"'{sac.demo_dataset}' episodes, {sac.demo_fraction:g} of every batch"
        )

    def add_demos(self, data: dict, where: str = "the demonstrations added") -> None:
        """Add demonstration transitions (`demo_transitions`' fields) to the demonstration buffer:
        the programmatic hook beside ``algorithm.sac.demos``; checked first (`check_demo_rows`)."""
        rows = demo_transitions(data, self.algo.gamma)
        check_demo_rows(rows, self.policy.replay_dim, self.action_width, where)
        if self.demos is None:
            self.demos = ReplayBuffer(max(self.sac.buffer_size, rows["state"].shape[0]))
        self.demos.add(rows)

    def behaviour(self, policy, env_steps: int):
        """Who acts in this iteration's rollout: uniform random actions until ``learning_starts``
        env steps were collected, then the policy."""
        return UniformActions(policy) if env_steps < self.sac.learning_starts else policy

    def learn(self, it: int, batch: Batch, info: dict, gen: torch.Generator, env_steps: int) -> dict:
        """The learn stage of iteration ``it`` (`learn_transitions`): the actor's noise continues
        ``gen``, the batches' rows are drawn from the run's "update" generator of ``it``."""
        indices = run_generator(self.seed, "update", it)  # CPU: the buffer's row indices
        return self.learn_transitions(batch, env_steps, gen, indices)

    def learn_transitions(self, batch: Batch, env_steps: int, noise: torch.Generator, indices: torch.Generator) -> dict:
        """Store the rollout's transitions, then (once ``env_steps`` reached ``learning_starts``)
        ``utd_ratio`` gradient steps per transition collected since, each on ``batch_size`` rows
        drawn with ``indices`` (a CPU generator), the actor's noise drawn with ``noise``."""
        rows = transitions(batch, self.algo.gamma, self.sac.n_step)
        self.buffer.add(rows)
        out: dict[str, float] = {"train/buffer_size": float(len(self.buffer))}
        if env_steps < self.sac.learning_starts:
            return out
        if len(self.buffer) < self.refill_rows:  # resumed without the buffer: collect before learning
            return out
        self.refill_rows = 0
        if not self.start_rows:
            self.start_rows = len(self.buffer)
        self.learning_rows += rows["state"].shape[0]
        steps = math.floor(self.sac.utd_ratio * self.learning_rows) - self.updates
        objective = OBJECTIVES.get(self.algo.objective)
        self.agent.generator = noise
        self.policy.train()
        sums: dict[str, float] = {}
        for _ in range(steps):
            mb = self.sample(indices)
            loss, metrics = objective(self.agent, Batch(mb), self.algo)
            self.updates += 1
            if self.step(self.optimizer, loss):
                self.critics.polyak(self.sac.tau)
                self.policy.after_step()
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
        out.update({f"train/{k}": v / max(steps, 1) for k, v in sums.items()})
        out["train/gradient_steps"] = float(self.updates)
        return out

    def sample(self, generator: torch.Generator) -> dict[str, Tensor]:
        """One batch on the device: uniform over the buffer, or RLPD's mix with the demonstrations
        (``is_demo`` marks their rows)."""
        n = self.sac.batch_size
        if self.demos is None:
            mb = self.buffer.sample(n, generator)
            mb["is_demo"] = torch.zeros(n, dtype=torch.bool)
        else:
            mb = mixed_sample(self.buffer, self.demos, n, self.sac.demo_fraction, generator)
        return {k: v.to(self.device) for k, v in mb.items()}

    def state_dict(self) -> dict:
        """Everything a resume needs beside the policy: the buffers (online and demonstrations), the
        critics with their targets and log(alpha), the optimizer, the step counters."""
        return {
            "buffer": self.buffer.state_dict() if self.sac.checkpoint_buffer else None,
            "buffer_rows": len(self.buffer),
            "critics": {k: v.detach().cpu().clone() for k, v in self.critics.state_dict().items()},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "demos": None if self.demos is None else self.demos.state_dict(),
            "learning_rows": self.learning_rows,
            "updates": self.updates,
            "start_rows": self.start_rows,
            "refill_rows": self.refill_rows,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a checkpoint's state; one saved without its buffer (``checkpoint_buffer: false``)
        leaves the buffer empty, to be refilled with as many rows as learning started with (at least
        ``batch_size``, at most what it held) before the next gradient step."""
        if state["buffer"] is not None:
            self.buffer.load_state_dict(state["buffer"])
            self.refill_rows = int(state.get("refill_rows", 0))
        else:
            self.buffer = ReplayBuffer(self.sac.buffer_size)
            held = int(state["buffer_rows"])
            self.refill_rows = min(held, max(self.sac.batch_size, int(state.get("start_rows", 0))))
        self.start_rows = int(state.get("start_rows", 0))
        self.critics.load_state_dict(state["critics"])
        self.optimizer.load_state_dict(state["optimizer"])
        if state.get("demos") is not None:
            self.demos = ReplayBuffer(int(state["demos"]["capacity"]))
            self.demos.load_state_dict(state["demos"])
        self.learning_rows, self.updates = int(state["learning_rows"]), int(state["updates"])
