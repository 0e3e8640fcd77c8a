"""A fresh policy's initial action noise, chosen from its first rollouts (``action_log_std_init: auto``).

Why (docs/notes/2026-12-05-ant-initial-std-auto.md): a policy learning from scratch explores with a
Gaussian of std 1 in normalised action units (SB3's ``log_std_init`` 0). Where the task charges for
the actions and can end early, that noise alone can make every step cost more than it earns: on
Ant-v5 the untrained policy's reward per step is about -1 at std 1 (a control cost of about 2.7
against +1 for staying up), its episodes end by termination after about 70 steps, and PPO's best
answer is to end them sooner: it learns to fall. A smaller std removes the incentive (+0.46 per step
at std 0.37), but the same smaller std costs Hopper, whose actions are nearly free, most of its return
(issue 33). So the std is not a constant of the template; the first rollouts tell which case a task is.

The rule (`choose_initial_std`), over the stds a policy offers (`Policy.exploration_stds`: its
configured one first, then quieter ones):

1. The first rollout, at the first std, is measured (`measure`): mean reward per environment step
   and episodes that TERMINATED (not cut by a time limit). If none terminated, or the reward per
   step is not negative, ending an episode does not pay (`ending_pays`): that std stays, and the
   rollout trains as any first iteration's does (the run is what it was without ``auto``).
2. Otherwise the next quieter std rolls out, and so on, until one at which a step earns (reward
   per step >= 0). If there the episodes also terminate at most half as often per step as at the
   first std, the noise was what made ending pay (`noise_was_the_cause`): that std starts RL, on the
   rollout it just collected (so the first update's ratio is still 1). Ant-v5: -1.03 per step and
   31 terminations at std 1, -0.19 and 24 at 0.61, +0.50 and 5 at 0.37: RL starts at 0.37.
3. Otherwise (the episodes end about as often, or no std on the list makes a step earn) the costs
   and the endings are the task's own: a body that falls whatever the noise (Walker2d's untrained
   policy: -0.01 to -0.19 per step at std 1, about 100 terminations per 2048 steps at every std; its
   return at 200k fell from 782 to 451 on validation seeds when the quieter std was taken on the
   reward alone), or a cost per step until a goal ends the episode (MountainCar's). The first std
   stays, and its rollout trains; the trainer puts the episodes in progress back where that rollout
   left them (`probe`), so the run goes on as a fixed-std run would.

Every rollout of the probe counts in the run's environment steps; the ones not trained on are
dropped. The measurements and the choice are logged and kept in the checkpoint's state; a resumed
run never probes again (the chosen std is in the saved parameters).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from mmrl import distributed
from mmrl.batch import Batch


@dataclass(frozen=True)
class NoiseMeasurement:
    """What one rollout at action std ``std`` showed (every rank's envs together)."""

    std: float
    reward_per_step: float  # mean reward per environment step over the valid decisions (nan if none)
    terminated: int  # episodes that ended by termination (a time limit's truncations do not count)
    env_steps: int


def measure(batch: Batch, std: float) -> NoiseMeasurement:
    """`NoiseMeasurement` of a rollout batch ``[T, N, ...]`` collected at action std ``std`` (its
    ``rewards`` as scored, ``env_steps``, ``terminated`` and ``valid``), summed over the ranks."""
    valid = batch["valid"].bool()
    sums = {
        "reward": float((batch["rewards"].float() * valid).sum()),
        "steps": float((batch["env_steps"] * valid).sum()),
        "terminated": float((batch["terminated"].bool() & valid).sum()),
    }
    sums = distributed.all_reduce(sums, op="sum")  # a rank's share alone could decide otherwise
    steps = sums["steps"]
    return NoiseMeasurement(
        std=float(std),
        reward_per_step=sums["reward"] / steps if steps else math.nan,
        terminated=int(sums["terminated"]),
        env_steps=int(steps),
    )


def ending_pays(m: NoiseMeasurement) -> bool:
    """Whether a policy exploring as in ``m`` gains by ending its episodes sooner: some of them
    terminated, and a step costs more than it earns on average."""
    return m.terminated > 0 and m.reward_per_step < 0


def noise_was_the_cause(m: NoiseMeasurement, first: NoiseMeasurement) -> bool:
    """Whether the quieter rollout ``m`` shows that the first rollout's noise made ending pay: a
    step earns there, and episodes terminate at most half as often per environment step."""
    rate, first_rate = m.terminated / max(m.env_steps, 1), first.terminated / max(first.env_steps, 1)
    return m.reward_per_step >= 0 and rate <= 0.5 * first_rate


def choose_initial_std(
    stds: list[float], first: tuple[NoiseMeasurement, Any], roll_out: Callable[[int], tuple[NoiseMeasurement, Any]]
) -> tuple[int, list[NoiseMeasurement], Any]:
    """The rule of the module docstring (steps 1-3). ``first`` is the measurement (and whatever the caller keeps
    of it, e.g. the batch) of the rollout at ``stds[0]``; ``roll_out(k)`` rolls out at ``stds[k]``
    (k >= 1) and returns the same pair. Returns the chosen index, every measurement in order and
    the chosen rollout's payload."""
    measurements = [first[0]]
    if not ending_pays(first[0]):
        return 0, measurements, first[1]
    for k in range(1, len(stds)):
        m, payload = roll_out(k)
        measurements.append(m)
        if m.reward_per_step >= 0:  # a step earns here: was the noise what ended the episodes?
            return (k, measurements, payload) if noise_was_the_cause(m, first[0]) else (0, measurements, first[1])
    return 0, measurements, first[1]


def describe(chosen: int, measurements: list[NoiseMeasurement]) -> str:
    """One log line: what each rollout showed and which std RL starts from."""
    parts = [
        f"std {m.std:.3g}: reward per step {m.reward_per_step:+.3f}, {m.terminated} episodes terminated"
        for m in measurements
    ]
    std = measurements[chosen].std
    if len(measurements) == 1:
        why = "ending an episode does not pay"
    elif chosen:
        why = "at it a step earns and episodes end at most half as often: the noise made ending pay"
    else:
        why = "no quieter noise makes a step earn with episodes ending half as often: the task's own costs"
    return (
        f"initial action std (action_log_std_init: auto): {'; '.join(parts)} -> {std:.3g} ({why}; "
        "set a number to fix it)"
    )


def record(chosen: int, measurements: list[NoiseMeasurement]) -> dict:
    """What the trainer's state keeps of the choice (plain data, for the checkpoint and the results)."""
    return {"chosen_std": measurements[chosen].std, "measurements": [asdict(m) for m in measurements]}


def probe(trainer, it: int, batch: Batch, info: dict, gen) -> tuple:
    """`choose_initial_std` on the first iteration's rollout (``batch``, collected at the policy's
    first std) of ``trainer`` (`mmrl.trainer.trainer.Trainer`, whose ``choose_exploration`` calls
    it): each quieter std it asks for is one more rollout, counted in the run's environment steps,
    and RL trains on the rollout of the std it keeps. Where it keeps the first std after probing
    quieter ones, the episodes in progress go back to where the first rollout left them (the
    collector's snapshot, as a checkpoint keeps it), so the run goes on as the fixed-std run does,
    short only of the probe's environment steps; a simulator that cannot snapshot itself goes on
    from the probe's last rollout (said in the log)."""
    stds = trainer.policy.exploration_stds()
    first = (measure(batch, stds[0]), (batch, info, gen))
    # the episodes in progress as the first rollout left them (fresh rounds of episodes keep none)
    snapshot = trainer.collector.state_dict() if ending_pays(first[0]) else {}

    def roll_out(k: int) -> tuple[NoiseMeasurement, tuple]:
        trainer.policy.set_exploration_std(stds[k])
        g = trainer.generator("probe", k)
        b, i = trainer.collect(it, g)
        trainer.state.count(i)
        trainer.check_rewards(it, i)
        return measure(b, stds[k]), (b, i, g)

    chosen, measured, kept = choose_initial_std(stds, first, roll_out)
    trainer.policy.set_exploration_std(stds[chosen])
    trainer.state.exploration = record(chosen, measured)
    line = describe(chosen, measured)
    if chosen == 0 and len(measured) > 1 and snapshot:  # back to the envs the kept rollout left
        if snapshot.get("sim") is not None:
            trainer.collector.load_state_dict(snapshot)
        else:
            line += "; the simulator cannot snapshot its state, so the episodes go on from the probe's last rollout"
    trainer.log_line(line)
    return kept
