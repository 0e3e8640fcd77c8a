"""Recorded episodes as decision records, the layout world models and success detectors learn from.

A *decision record* is what a policy executing C actions per decision saw and did, one row per
decision, sorted by episode, then step: the layout `datasets/reach_demos` builds and
`datasets/lerobot_dataset` reads from a LeRobotDataset (``transitions=True``):

- ``image`` uint8 ``[M, H, W, 3]``, ``state`` float ``[M, D]`` (optional), ``instruction`` list of M str,
  ``actions`` float ``[M, C, A]`` (the chunk executed from that observation),
- ``episode`` / ``step`` long ``[M]`` (episode index in ``[0, E)``, decision index in it),
- ``rewards`` float ``[M]``, ``terminated`` / ``truncated`` bool ``[M]`` (what executing the chunk returned),
- ``final_image`` / ``final_state`` ``[E, ...]``: the observation each episode ended on,
- optionally ``success`` bool ``[M]`` (the task's success reached by that chunk); without it a
  terminating chunk with a positive reward is a success (`decision_success`), as in every sparse
  success task (reach, LIBERO, Meta-World's success flag as its reward).

`transitions` pairs every row with the observation executing its chunk led to (the next row of the
episode, or the episode's final observation), which is a world model's training example and a
success detector's labelled frame. `join_episodes` appends episodes (renumbering them), which is how
a Dyna loop grows its logged data; `record_episodes` records them, one step per row, from a policy
acting in a simulator, and counts the environment steps it took.
"""

from __future__ import annotations

import torch

#: the columns every decision record has (``state`` and ``success`` are optional)
REQUIRED = ("image", "instruction", "actions", "episode", "step", "rewards", "terminated", "truncated", "final_image")


def check_records(records: dict, what: str = "decision records") -> None:
    """ValueError naming the missing columns (and where such records come from) unless ``records``
    hold every `REQUIRED` column with one row per decision."""
    missing = [k for k in REQUIRED if k not in records]
    if missing:
        raise ValueError(
            f"{what} need the columns {', '.join(missing)} (have: {', '.join(sorted(records))}): record them "
            "with datasets/reach_demos, or read a LeRobotDataset with lerobot_dataset's transitions=True"
        )
    m = records["image"].shape[0]
    for key in ("actions", "episode", "step", "rewards", "terminated", "truncated"):
        if records[key].shape[0] != m:
            raise ValueError(f"{what}: '{key}' has {records[key].shape[0]} rows, 'image' has {m}")
    if len(records["instruction"]) != m:
        raise ValueError(f"{what}: {len(records['instruction'])} instructions for {m} rows")


def decision_success(records: dict) -> torch.Tensor:
    """bool ``[M]``: the ``success`` column, or a terminating chunk with a positive reward."""
    if "success" in records:
        return records["success"].bool()
    return records["terminated"].bool() & (records["rewards"].float() > 0)


def next_rows(records: dict) -> torch.Tensor:
    """long ``[M]``: for each row, the row of the episode's next decision, or -1 where the row is
    its episode's last (its next observation is then the episode's final one)."""
    ep, step = records["episode"].long(), records["step"].long()
    m = ep.shape[0]
    nxt = torch.full((m,), -1, dtype=torch.long)
    if m > 1:
        follows = (ep[1:] == ep[:-1]) & (step[1:] == step[:-1] + 1)
        nxt[:-1] = torch.where(follows, torch.arange(1, m), torch.full((m - 1,), -1))
    return nxt


def transitions(records: dict) -> dict:
    """Every decision with what it led to: the record's own columns plus ``next_image`` (and
    ``next_state`` where records have ``state``), ``success`` bool [M] (`decision_success`) and
    ``done`` bool [M] (the chunk ended the episode). Records must be sorted by episode, then step
    (as builders return them; `mmrl.data.record_order`)."""
    check_records(records)
    nxt = next_rows(records)
    last = nxt < 0
    ep = records["episode"].long()
    out = {
        k: records[k]
        for k in ("image", "state", "instruction", "actions", "episode", "step", "rewards")
        if k in records
    }
    nxt_img = records["image"][nxt.clamp(min=0)].clone()
    nxt_img[last] = records["final_image"][ep[last]]
    out["next_image"] = nxt_img
    if "state" in records and "final_state" in records:
        nxt_state = records["state"][nxt.clamp(min=0)].clone()
        nxt_state[last] = records["final_state"][ep[last]].to(nxt_state.dtype)
        out["next_state"] = nxt_state
    out["success"] = decision_success(records)
    out["done"] = records["terminated"].bool() | records["truncated"].bool() | last
    return out


def episode_starts(records: dict) -> torch.Tensor:
    """long: the rows that start an episode (``step == 0``), whose observations are start frames."""
    return (records["step"].long() == 0).nonzero().flatten()


def num_episodes(records: dict) -> int:
    """Episodes the records index (``final_image`` has one row per episode)."""
    return int(records["final_image"].shape[0])


#: the optional columns records join on when both have them (a summary like ``success_rate`` or a
#: builder's ``meta`` is not joined)
OPTIONAL = ("state", "final_state", "success")


def join_episodes(first: dict | None, second: dict) -> dict:
    """The decision records of ``first``'s episodes, then ``second``'s renumbered after them: the
    `REQUIRED` columns and the `OPTIONAL` ones (both must have those or neither), the per-episode
    ``final_image`` / ``final_state`` joined in the same order. Other entries (a builder's summaries)
    are left out. ``first`` None is ``second``."""
    check_records(second)
    if first is None:
        return dict(second)
    check_records(first)
    odd = [k for k in OPTIONAL if (k in first) != (k in second)]
    if odd:
        raise ValueError(f"episodes to join must both have or both lack {', '.join(odd)}")
    offset = num_episodes(first)
    out: dict = {}
    for key in (*REQUIRED, *[k for k in OPTIONAL if k in first]):
        a, b = first[key], second[key]
        if key == "episode":
            out[key] = torch.cat([a, b + offset])
        elif isinstance(a, list):
            out[key] = [*a, *b]
        else:
            out[key] = torch.cat([a, b.to(a.dtype)])
    return out


@torch.no_grad()
def record_episodes(policy, sim, seeds: list[int], generator: torch.Generator | None, mode: str = "train") -> dict:
    """One episode per environment of ``sim`` (reset with ``seeds``), ``policy`` choosing a chunk at
    each decision and the simulator executing it one step at a time, recorded one row per *step*
    (``actions`` [M, 1, A]: the records a one-step world model learns from). Every row is one
    environment step of an episode that had not ended; the steps the batched simulator takes in
    environments whose episode already ended (their auto-reset episodes) are not part of any
    recorded episode and are not rows, so the real environment steps taken are the rows. Returns
    decision records (`REQUIRED`, plus ``state`` / ``final_state`` where the simulator has a state)."""
    n = sim.num_envs
    if len(seeds) != n:
        raise ValueError(f"{len(seeds)} seeds for {n} environments")
    obs = sim.reset(seeds)
    alive = torch.ones(n, dtype=torch.bool)
    steps_done = torch.zeros(n, dtype=torch.long)
    cols: dict[str, list] = {
        k: [] for k in ("image", "state", "actions", "episode", "step", "rewards", "terminated", "truncated")
    }
    instructions: list[str] = []
    final: dict[str, torch.Tensor] = {}
    was_training = policy.training
    policy.eval()
    try:
        while bool(alive.any()):
            chunk = policy.rollout(obs, generator=generator, mode=mode).actions.to(sim.device)
            for i in range(chunk.shape[1]):
                if not bool(alive.any()):
                    break
                rows = alive.nonzero().flatten()
                res = sim.step(chunk[:, i])
                cols["image"].append(obs.image[rows].cpu())
                if obs.state is not None:
                    cols["state"].append(obs.state[rows].float().cpu())
                instructions.extend(obs.instruction[r] for r in rows.tolist())
                cols["actions"].append(chunk[rows, i : i + 1].float().cpu())
                cols["episode"].append(rows.clone())
                cols["step"].append(steps_done[rows].clone())
                cols["rewards"].append(res.reward.float().cpu()[rows])
                cols["terminated"].append(res.terminated.cpu()[rows])
                cols["truncated"].append(res.truncated.cpu()[rows])
                steps_done[rows] += 1
                ended = alive & res.done.cpu()
                if bool(ended.any()):
                    assert res.final_obs is not None, "the simulator ended episodes without final_obs"
                    for key in ("image", "state"):
                        value = getattr(res.final_obs, key)
                        if value is None:
                            continue
                        if key not in final:
                            final[key] = torch.zeros(n, *value.shape[1:], dtype=value.dtype)
                        final[key][ended] = value.cpu()[ended]
                alive &= ~res.done.cpu()
                obs = res.obs
    finally:
        policy.train(was_training)
    out: dict = {k: torch.cat(v) for k, v in cols.items() if v}
    out["instruction"] = instructions
    out["final_image"] = final["image"]
    if "state" in final:
        out["final_state"] = final["state"]
    from mmrl.data import record_order

    order = record_order(out["episode"], out["step"])
    per_episode = ("final_image", "final_state")
    for key, value in list(out.items()):
        if key not in per_episode:
            out[key] = [value[i] for i in order.tolist()] if isinstance(value, list) else value[order]
    assert len(out["episode"]) == int(steps_done.sum())
    return out
