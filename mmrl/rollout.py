"""Collect episodes from a batched simulator with action chunks, and evaluate a policy.

An iteration resets all N environments together (per-env seeds; a GRPO group of G consecutive
envs shares one seed, hence one initial state) and steps chunk by chunk until every episode has
ended. Steps after an environment's episode ended are kept with ``valid = False`` so the rollout
stays a dense ``[T, N, ...]`` `Batch`; the simulator's auto reset keeps those rows well defined.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import sys
import zlib
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from mmrl.batch import Batch
from mmrl.distributed import Ranks, gather_objects
from mmrl.simulator import Observation, Simulator, check_observation, check_step_result
from mmrl.utils.rows import batch_rows


def episode_seeds(base_seed: int, num_envs: int, group_size: int = 1) -> list[int]:
    """Per-env reset seeds; envs i and j share a seed iff they are in the same group of G."""
    if num_envs % group_size:
        raise ValueError(f"num_envs ({num_envs}) must be a multiple of group_size ({group_size})")
    return [base_seed + i // group_size for i in range(num_envs)]


@torch.no_grad()
def truncation_values(policy, res, alive: torch.Tensor) -> torch.Tensor:
    """``[N]`` critic value of the last observation of each episode the time limit cut (truncated,
    not terminated) in this step, 0 elsewhere: the trainer bootstraps the return there, since a
    time limit is not a terminal state of the task. Zeros for a policy without a critic."""
    out = torch.zeros(alive.shape[0])
    cut = (alive & res.truncated & ~res.terminated).cpu()
    if cut.any() and res.final_obs is not None:
        v = policy.value(res.final_obs.index(cut.to(res.final_obs.image.device)))
        if v is not None:
            out[cut] = v.float().cpu()
    return out


#: the top-level packages of mmrl's own simulators: an exception there is mmrl's bug (a traceback)
OWN_PACKAGES = ("mmrl", "simulators", "mmrl_simulators")


def is_plugin(cls: type) -> bool:
    """Whether simulator class ``cls`` is a user's (outside `OWN_PACKAGES`): its exceptions are
    reported in one line, where mmrl's own are its bugs and keep their traceback."""
    return cls.__module__.partition(".")[0] not in OWN_PACKAGES


def step_simulator(sim, actions, traced: bool = False):
    """``sim.step_chunk(actions)`` (with its step trace when ``traced``). A user's simulator (a
    plugin: its class lives outside `OWN_PACKAGES`) that raises becomes a `SimulatorError` in one
    line naming its class, the call and the line, its traceback kept as the cause."""
    try:
        return sim.step_chunk(actions, trace=True) if traced else sim.step_chunk(actions)
    except Exception as exc:
        cls = type(sim)
        if not is_plugin(cls):
            raise
        import traceback

        from mmrl.errors import SimulatorError

        frames = traceback.extract_tb(exc.__traceback__)
        own = [f for f in frames if f.filename == getattr(sys.modules.get(cls.__module__), "__file__", None)]
        at = own[-1] if own else (frames[-1] if frames else None)
        line = f" at {Path(at.filename).name}:{at.lineno}" if at is not None else ""
        raise SimulatorError(
            f"simulator {cls.__module__}.{cls.__qualname__} raised {type(exc).__name__} in step_chunk: "
            f"{str(exc).strip().splitlines()[0][:200] if str(exc).strip() else '(no message)'}{line}; fix the "
            f"simulator (`mmrl check simulator` runs its contract checks alone)"
        ) from exc


def act(policy, sim, obs: Observation, generator, mode: str, alive: torch.Tensor, reward=None, episodes=None):
    """One decision in ``sim``: the policy's `Decision` on ``obs``, the simulator's step (traced
    where the reward stage scores its frames), and the reward stage's score of the decision
    (``reward``: a `mmrl.trainer.reward_stage.RewardStage`, or None; ``episodes``: its per-env state,
    `RewardStage.episode_scores`). Returns (training batch rows, `StepResult`)."""
    batch, actions = policy.rollout(obs, generator=generator, mode=mode)
    actions_here = actions.to(sim.device) if isinstance(actions, torch.Tensor) else actions
    traced = reward is not None and reward.traced
    res = step_simulator(sim, actions_here, traced)
    check_step_result(sim, res)
    if reward is not None:
        res = reward(res, obs, actions, alive, episodes)
    return batch, res


def step_record(out: Batch, res, alive: torch.Tensor, bootstrap: torch.Tensor | None) -> Batch:
    """The environment's feedback on one decision, added to the policy's rollout output ``out``
    (the keys of `mmrl.batch.KEYS`: rewards, dones, terminated, truncated, success, valid,
    env_steps and, when given, bootstrap)."""
    out.update(
        rewards=res.reward.float(),
        dones=res.done,
        terminated=res.terminated,
        truncated=res.truncated,
        success=res.success,
        valid=alive.clone(),
        env_steps=res.info["num_steps"].long() * alive,
    )
    if bootstrap is not None:
        out["bootstrap"] = bootstrap
    return out


def episode_info(batch: Batch) -> dict:
    """Per-episode ``return`` [N], ``success`` [N] and ``length`` [N] (environment steps) of a
    one-episode-per-env rollout, and ``env_steps`` (their sum)."""
    valid = batch["valid"]
    length = (batch["env_steps"] * valid).sum(0)
    return {
        "return": (batch["rewards"] * valid).sum(0),
        "success": (batch["success"] & valid).any(0),
        "length": length,
        "env_steps": int(length.sum()),
    }


def episode_tasks(obs: Observation) -> list[str] | None:
    """Per env, the task its episode runs (``Observation.meta[i]["task"]``, set by multi-task
    simulators such as LIBERO), or None when the simulator names none."""
    meta = obs.meta
    if not meta or not all(isinstance(m, dict) and "task" in m for m in meta):
        return None
    return [str(m["task"]) for m in meta]


def episode_breakdown(obs: Observation) -> dict[str, list[str]] | None:
    """Per dimension, each env's label (``Observation.meta[i]["breakdown"]``: ``{dimension: label}``,
    e.g. reach's goal colour, goal cell and start distance), for the dimensions every env names; None
    when the simulator names none. The evaluation reports success per label of each dimension."""
    meta = obs.meta
    if not meta or not all(isinstance(m, dict) and isinstance(m.get("breakdown"), dict) for m in meta):
        return None
    dims = set.intersection(*(set(m["breakdown"]) for m in meta))
    return {d: [str(m["breakdown"][d]) for m in meta] for d in sorted(dims)} or None


def merged_breakdown(parts: list[dict[str, list[str]] | None]) -> dict[str, list[str]] | None:
    """The `episode_breakdown` of envs split in parts (pipeline stages), in order: the dimensions
    every part names; None when a part names none."""
    if not parts or any(p is None for p in parts):
        return None
    dims = set.intersection(*(set(p) for p in parts if p is not None))
    return {d: [x for p in parts if p is not None for x in p[d]] for d in sorted(dims)} or None


def label_episodes(batch: Batch, info: dict, tasks: list[str] | None, breakdown: dict | None) -> None:
    """A one-episode-per-env rollout's labels, in place: ``info["task"]`` and the batch key ``task``
    ([T, N] ids, `task_ids`) when the simulator names each env's task, ``info["breakdown"]`` when it
    labels its episodes."""
    if tasks is not None:
        info["task"] = tasks
        batch["task"] = task_ids(tasks).expand(batch["valid"].shape).clone()
    if breakdown is not None:
        info["breakdown"] = breakdown


def task_ids(tasks: list[str]) -> torch.Tensor:
    """``[N]`` long ids of task names (CRC-32 of the name: the same id in every process, iteration and
    resume, with no table to keep), the batch key ``task``."""
    return torch.tensor([zlib.crc32(t.encode()) for t in tasks], dtype=torch.long)


def weighted_rates(items) -> dict[str, dict]:
    """``{key: {"success_rate", "episodes"}}`` from ``(key, success_rate, episodes)`` items: the
    episode-weighted success rate of each key (keys sorted)."""
    acc: dict = {}
    for key, rate, n in items:
        a = acc.setdefault(key, [0.0, 0])
        a[0] += rate * n
        a[1] += n
    return {k: {"success_rate": total / n, "episodes": n} for k, (total, n) in sorted(acc.items())}


def success_by_task(tasks: list[str], success: torch.Tensor) -> dict[str, dict]:
    """``{task: {"success_rate", "episodes"}}`` of episodes labelled ``tasks`` (sorted by task)."""
    if len(tasks) != len(success):
        raise ValueError(f"{len(tasks)} task labels for {len(success)} episodes")
    return weighted_rates((t, s, 1) for t, s in zip(tasks, success.detach().float().cpu().tolist()))


def task_logs(prefix: str, by_task: dict[str, dict]) -> dict[str, float]:
    """Scalar logs of a `success_by_task` result: ``<prefix>/success/<task>`` and, for
    ``group/task`` labels such as LIBERO's ``libero_spatial/3``, the episode-weighted
    ``<prefix>/success_suite/<group>``; empty for fewer than two tasks."""
    if len(by_task) < 2:
        return {}
    out = {f"{prefix}/success/{t}": r["success_rate"] for t, r in by_task.items()}
    if all("/" in t for t in by_task):
        groups = weighted_rates((t.split("/", 1)[0], r["success_rate"], r["episodes"]) for t, r in by_task.items())
        out.update({f"{prefix}/success_suite/{g}": r["success_rate"] for g, r in groups.items()})
    return out


@torch.no_grad()
def collect_episodes(
    policy,
    sim: Simulator,
    seeds: list[int],
    generator: torch.Generator | None,
    mode: str = "train",
    frames_of: int = 0,
    reward=None,
) -> tuple[Batch, dict]:
    """Run one episode per env, each decision scored by the reward stage ``reward`` (if any).
    Returns (Batch [T, N, ...], info).

    info: ``return`` [N], ``success`` [N] bool, ``length`` [N] environment steps, ``env_steps``, and
    for videos of the first ``frames_of`` envs: ``frames`` uint8 [T+1, frames_of, H, W, 3] (a video
    simulator's: the generated clips, [F, frames_of, H, W, 3]),
    ``frame_success`` bool [T+1, frames_of] (success reached by that frame) and ``captions`` (their
    instructions); ``task`` [N] labels when the simulator names each episode's task
    (`episode_tasks`); ``breakdown`` {dimension: [N] labels} when it labels its episodes
    (`episode_breakdown`); ``counters`` {name: [N]}, each of the simulator's ``episode_counters``
    summed over the episode. In train mode the batch carries ``bootstrap`` (`truncation_values`).
    """
    chunk = policy.chunk_size
    horizon = math.ceil(sim.max_episode_steps / chunk)
    obs = sim.reset(seeds)
    check_observation(sim, obs)
    tasks, breakdown = episode_tasks(obs), episode_breakdown(obs)
    alive = torch.ones(sim.num_envs, dtype=torch.bool, device=sim.device)
    episodes = reward.episode_scores(sim.num_envs) if reward is not None else None
    steps, frames = [], [obs.image[:frames_of].cpu()] if frames_of else []
    captions, reached = list(obs.instruction[:frames_of]), [torch.zeros(frames_of, dtype=torch.bool)]
    counters = {k: torch.zeros(sim.num_envs) for k in sim.episode_counters}
    for _ in range(horizon):
        out, res = act(policy, sim, obs, generator, mode, alive, reward, episodes)
        boot = truncation_values(policy, res, alive) if mode == "train" else None
        steps.append(step_record(out, res, alive, boot).to("cpu"))
        for k, total in counters.items():
            total += torch.as_tensor(res.info[k]).float().cpu() * alive.cpu()
        if frames_of:  # show the finished episode's last frame, not the auto-reset one
            img = res.obs.image[:frames_of].clone()
            if res.final_obs is not None:
                ended = res.done[:frames_of]
                img[ended] = res.final_obs.image[:frames_of][ended]
            recorded = alive[:frames_of].view(-1, *[1] * (img.dim() - 1))  # any image rank
            frames.append(torch.where(recorded, img, frames[-1].to(img.device)).cpu())
            reached.append(reached[-1] | (res.success[:frames_of] & alive[:frames_of]).cpu())
        alive &= ~res.done
        obs = res.obs
        if not alive.any():
            break
    batch = Batch.stack(steps)  # [T, N, ...]
    info = episode_info(batch)
    label_episodes(batch, info, tasks, breakdown)
    if counters:
        info["counters"] = counters
    if frames_of:
        shown, success = torch.stack(frames), torch.stack(reached)
        if sim.action_type == "video":  # the generated clip is the episode: its frames are the video's time
            shown = shown[-1].transpose(0, 1)  # [F, frames_of, H, W, 3]
            success = success[-1].expand(shown.shape[0], -1)
        info.update(frames=shown, frame_success=success, captions=captions)
    return batch, info


def next_states(res, policy) -> torch.Tensor:
    """``[N, D]`` the replayed state (``policy.replay_state``: the simulator's state vector unless the
    policy replays features of its own) each env reached by a step: where its episode ended, the
    final observation's (before the auto reset), else the new observation's."""
    out = policy.replay_state(res.obs).float().clone()
    done = res.done.to(out.device)
    if done.any():
        final = res.final_obs.index(done.to(res.final_obs.image.device))
        out[done] = policy.replay_state(final).float().to(out.device)
    return out


class StepCollector:
    """Fixed-length rollouts (``trainer.rollout_steps = T``): every call runs T decisions in each of
    the N envs, continuing the episodes in progress from the previous call (the first call resets
    with ``seeds``; later episodes start by the simulator's own auto reset, reproducibly).

    The batch is dense ``[T, N, ...]`` with every decision valid; ``info["last_values"]`` [N] is the
    critic's value of the observation after the last decision (the trainer bootstraps the advantage
    of envs whose episode goes on there). info's ``return`` / ``success`` / ``length`` are those of
    the episodes that ENDED during this rollout ([E], possibly empty), ``env_steps`` the steps
    executed. `state_dict` / `load_state_dict` carry the episodes in progress across a checkpoint
    (exact when the simulator can snapshot itself, `Simulator.get_state`). With ``next_state`` each
    decision also records the (replayed) state it led to (`next_states`), for replayed transitions.
    """

    def __init__(self, sim: Simulator, steps: int, seeds: list[int], reward=None, next_state: bool = False):
        self.sim, self.steps, self.seeds, self.reward = sim, int(steps), list(seeds), reward
        self.next_state = next_state
        self.episodes = reward.episode_scores(sim.num_envs) if reward is not None else None  # reward state
        self.obs: Observation | None = None  # of the episodes in progress (None: reset at the next collect)
        n = sim.num_envs
        self.ep_return, self.ep_length = torch.zeros(n), torch.zeros(n, dtype=torch.long)
        self.ep_success = torch.zeros(n, dtype=torch.bool)

    @torch.no_grad()
    def collect(self, policy, generator: torch.Generator | None) -> tuple[Batch, dict]:
        sim, n = self.sim, self.sim.num_envs
        if self.obs is None:
            self.obs = sim.reset(self.seeds)
        every = torch.ones(n, dtype=torch.bool, device=sim.device)
        steps: list[Batch] = []
        finished: dict[str, list[torch.Tensor]] = {"return": [], "success": [], "length": []}
        names: dict[int, str] = {}
        ended_tasks: list[str] = []  # the task of each episode that ended, in the order of ``finished``
        for _ in range(self.steps):
            tasks = episode_tasks(self.obs)  # the task of the episode each decision belongs to
            out, res = act(policy, sim, self.obs, generator, "train", every, self.reward, self.episodes)
            record = step_record(out, res, every, truncation_values(policy, res, every))
            if tasks is not None:
                record["task"] = task_ids(tasks)
                names.update(zip(record["task"].tolist(), tasks))
            if self.next_state:
                record["next_state"] = next_states(res, policy)
            steps.append(record.to("cpu"))
            self.ep_return += res.reward.float().cpu()
            self.ep_length += res.info["num_steps"].long().cpu()
            self.ep_success |= res.success.cpu()
            done = res.done.cpu()
            if done.any():
                if tasks is not None:
                    ended_tasks.extend(tasks[i] for i in done.nonzero().flatten().tolist())
                finished["return"].append(self.ep_return[done])
                finished["success"].append(self.ep_success[done])
                finished["length"].append(self.ep_length[done])
                self.ep_return[done], self.ep_length[done], self.ep_success[done] = 0.0, 0, False
            self.obs = res.obs
        batch = Batch.stack(steps)
        last = policy.value(self.obs)
        info: dict[str, Any] = {
            k: torch.cat(v) if v else torch.zeros(0, dtype=dtype)
            for (k, v), dtype in zip(finished.items(), (torch.float32, torch.bool, torch.long))
        }
        info.update(
            env_steps=int(batch["env_steps"].sum()), last_values=torch.zeros(n) if last is None else last.float().cpu()
        )
        if names:
            info["task_names"] = names  # the batch's ``task`` ids -> names
        if names and len(ended_tasks) == len(info["return"]):  # the ended episodes' tasks (train/success/<task>)
            info["task"] = ended_tasks
        return batch, info

    def state_dict(self) -> dict:
        """The episodes in progress: observation, counters and the simulator's snapshot (None if it
        cannot snapshot itself: the episodes then restart from a reset when loaded)."""
        if self.obs is None:
            return {"obs": None}
        try:
            sim_state = self.sim.get_state()
        except NotImplementedError:
            sim_state = None
        obs = {f.name: getattr(self.obs, f.name) for f in dataclasses.fields(self.obs)}  # plain data, no class
        out = {
            "obs": obs,
            "sim": sim_state,
            "return": self.ep_return.clone(),
            "length": self.ep_length.clone(),
            "success": self.ep_success.clone(),
        }
        if self.episodes is not None:
            out["reward_episodes"] = self.episodes.state_dict()
        return out

    def load_state_dict(self, state: dict) -> str | None:
        """Restore `state_dict`; returns a warning when the episodes in progress cannot be resumed."""
        if state.get("obs") is None:
            return None
        if state["sim"] is None:
            self.obs = None
            return (
                "the simulator cannot snapshot its state (Simulator.get_state): the episodes in "
                "progress at the checkpoint restart from a reset, so this resume is not bit-exact"
            )
        self.sim.set_state(state["sim"])
        self.obs = Observation(**state["obs"])
        self.ep_return, self.ep_length, self.ep_success = state["return"], state["length"], state["success"]
        if self.episodes is not None:
            self.episodes.load_state_dict(state["reward_episodes"])
        return None


@torch.no_grad()
def evaluate_policy(
    policy,
    sim: Simulator,
    num_episodes: int,
    seed: int,
    generator: torch.Generator | None = None,
    video_path: Path | None = None,
    video_envs: int = 8,
    reward=None,
    ranks: Ranks | None = None,
) -> dict:
    """Success rate over ``num_episodes`` held-out episodes, in batches of ``sim.num_envs``, each
    decision scored by the reward stage ``reward`` (if any) as in training; with it the mean return
    and length, and the mean per episode of each of the simulator's ``episode_counters`` (e.g. a
    tool simulator's ``tool_calls``), under its own name.

    Episode e uses reset seed ``seed + e``, so the evaluation set is fixed and reproducible. A
    multi-task simulator's episodes (`episode_tasks`) are also scored per task (``tasks``), and
    labelled episodes (`episode_breakdown`) per label of each dimension (``breakdown``:
    ``{dimension: {label: {"success_rate", "episodes"}}}``).
    Writes an mp4 grid of the first ``video_envs`` episodes when ``video_path`` is given.

    With N ``ranks`` (`mmrl.distributed`, every rank calling) a batch is N x ``sim.num_envs``
    episodes, each rank playing its share (drawing its rows of the batch's noise), and every rank
    returns the results of all: one process with N x the envs evaluates the same episodes.
    """
    ranks = ranks or Ranks()
    was_training = policy.training
    policy.eval()
    #: per round, this rank's episodes in the set: (success, return, length, tasks or None, counters,
    #: breakdown or None)
    rounds: list[tuple] = []
    done = 0
    n = sim.num_envs
    batch = n * ranks.world  # episodes per round, over the ranks
    first = ranks.rank * n  # this rank's first episode of a round
    bar = tqdm(total=num_episodes, desc="eval", unit="ep", leave=False, dynamic_ncols=True, disable=not ranks.main)
    try:  # the bar cleared whatever happens: an error's line starts a line of its own
        while done < num_episodes:
            seeds = [seed + done + first + i for i in range(n)]
            want_video = video_path is not None and done == 0
            with batch_rows(first, n, batch):
                _, info = collect_episodes(
                    policy,
                    sim,
                    seeds,
                    generator,
                    mode="eval",
                    frames_of=min(video_envs, n) if want_video else 0,
                    reward=reward,
                )
            take = max(0, min(n, num_episodes - done - first))  # of this rank's episodes, those in the set
            task = info["task"][:take] if "task" in info else None
            counts = {k: v[:take].cpu() for k, v in info.get("counters", {}).items()}
            labels = {d: v[:take] for d, v in info["breakdown"].items()} if "breakdown" in info else None
            rounds.append(
                (
                    info["success"][:take].cpu(),
                    info["return"][:take].cpu(),
                    info["length"][:take].cpu(),
                    task,
                    counts,
                    labels,
                )
            )
            if want_video:
                assert video_path is not None  # want_video says so
                write_video(info["frames"], video_path, info["captions"], info["frame_success"])
            bar.update(min(batch, num_episodes - done))
            done += min(batch, num_episodes - done)
    finally:
        bar.close()
    policy.train(was_training)
    if ranks.distributed:  # every rank's episodes, in the order one process plays them: round by round
        rounds = [part for rnd in zip(*gather_objects(rounds)) for part in rnd]
    success = torch.cat([r[0] for r in rounds]).float()
    # each episode's task (None: a simulator without tasks)
    tasks = None if any(r[3] is None for r in rounds) else [t for r in rounds for t in r[3]]
    out: dict[str, Any] = {
        "success_rate": success.mean().item(),
        "return": torch.cat([r[1] for r in rounds]).mean().item(),
        "length": torch.cat([r[2] for r in rounds]).float().mean().item(),
        "episodes": int(success.numel()),
    }
    for k in sim.episode_counters:  # per episode, as train/<name> logs them
        out[k] = torch.cat([r[4][k] for r in rounds]).float().mean().item()
    if tasks and len(set(tasks)) > 1:  # a multi-task simulator: success per task as well
        out["tasks"] = success_by_task(tasks, success)
    labels = merged_breakdown([r[5] for r in rounds])  # every round's labels, in the order of ``success``
    if labels is not None:  # labelled episodes: success per label of each dimension
        out["breakdown"] = {d: success_by_task(v, success) for d, v in labels.items()}
    return out


def breakdown_logs(prefix: str, breakdown: dict[str, dict]) -> dict[str, float]:
    """Scalar logs of an evaluation's ``breakdown``: ``<prefix>/success_by/<dimension>/<label>``."""
    return {
        f"{prefix}/success_by/{dim}/{label}": r["success_rate"]
        for dim, rows in breakdown.items()
        for label, r in rows.items()
    }


TILE_MIN_PX, TILE_MAX_PX = 128, 256  # an episode's tile in videos and grids: longest side (automatic scale)


def tile_scale(h: int, w: int, low: int = TILE_MIN_PX, high: int = TILE_MAX_PX) -> tuple[int, int]:
    """``(up, down)`` integer factors bringing an ``h x w`` frame's longest side into about
    [low, high]: small frames are upscaled (a 32 px frame x4), large ones downscaled (a 1024 px
    image / 4); sizes in between stay."""
    side = max(h, w)
    if side <= low:
        return max(1, low // side), 1
    return (1, -(-side // high)) if side > high else (1, 1)


_GIF_WARNED: set[Path] = set()  # videos already said to be GIFs (said once per file, not per evaluation)


def write_video(
    frames: torch.Tensor,
    path: Path,
    captions: list[str] | None = None,
    success: torch.Tensor | None = None,
    fps: int = 4,
    scale: int | None = None,
) -> None:
    """frames uint8 [T, E, H, W, 3] -> an mp4 with the E episodes in a grid of rows (ceil(sqrt(E))
    tiles per row), each tile scaled by `tile_scale` (or upscaled ``scale`` times), with its
    instruction / prompt written underneath and a green border once ``success`` [T, E] is reached.
    Several cameras ([T, E, V, H, W, 3]) are shown next to each other inside an episode's tile.
    The last frame is also saved as a PNG beside it (for generated images: the sample grid)."""
    import imageio.v2 as imageio
    import numpy as np
    from PIL import Image, ImageDraw

    if frames.dim() == 6:
        frames = frames.permute(0, 1, 3, 2, 4, 5).flatten(3, 4)  # [T, E, H, V*W, 3]
    t, e, h, w, _ = frames.shape
    up, down = (scale, 1) if scale else tile_scale(h, w)
    if down > 1:  # average-pool large images down (a PIL resize per frame would be slower)
        pad_h, pad_w = (-h) % down, (-w) % down
        x = torch.nn.functional.pad(
            frames.permute(0, 1, 4, 2, 3).float().flatten(0, 1), (0, pad_w, 0, pad_h), mode="replicate"
        )
        frames = (
            torch.nn.functional.avg_pool2d(x, down)
            .round()
            .clamp(0, 255)
            .to(torch.uint8)
            .unflatten(0, (t, e))
            .permute(0, 1, 3, 4, 2)
        )
        h, w = frames.shape[2:4]
    tiles = frames.repeat_interleave(up, 2).repeat_interleave(up, 3)  # [T, E, th, tw, 3]
    th, tw = h * up, w * up
    if success is not None:
        edge = torch.zeros(th, tw, dtype=torch.bool)
        edge[:2], edge[-2:], edge[:, :2], edge[:, -2:] = True, True, True, True
        green = torch.tensor([40, 220, 60], dtype=torch.uint8)
        tiles = torch.where((success[:, :, None, None] & edge)[..., None], green, tiles)
    cols = math.ceil(math.sqrt(e))
    rows = math.ceil(e / cols)
    caption_h = 14 if captions else 0
    cell_h = th + caption_h
    out = np.zeros((t, rows * cell_h, cols * tw, 3), dtype=np.uint8)
    strip = Image.new("RGB", (cols * tw, rows * cell_h)) if captions else None
    draw = ImageDraw.Draw(strip) if strip is not None else None
    fits = max((tw - 4) // 5, 1)  # characters of PIL's default font (~5 px each) under a tile
    for i in range(e):
        r, c = divmod(i, cols)
        out[:, r * cell_h : r * cell_h + th, c * tw : (c + 1) * tw] = tiles[:, i].numpy()
        if captions and i < len(captions):
            assert draw is not None  # drawn on with the captions
            draw.text((c * tw + 2, r * cell_h + th + 1), captions[i][:fits], fill=(230, 230, 230))
    if captions:
        text = np.asarray(strip)
        for r in range(rows):
            band = slice(r * cell_h + th, (r + 1) * cell_h)
            out[:, band] = text[band][None]
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".mp4" and importlib.util.find_spec("imageio_ffmpeg") is None:
        # Without its ffmpeg backend imageio hands ".mp4" to another plugin, which fails on `fps`.
        gif = path.with_suffix(".gif")
        if gif not in _GIF_WARNED:
            _GIF_WARNED.add(gif)
            print(
                f"mmrl: imageio-ffmpeg is not installed, so the evaluation video is written as {gif.name} "
                "instead of an mp4 (pip install imageio-ffmpeg for mp4)",
                file=sys.stderr,
                flush=True,
            )
        Image.fromarray(out[0]).save(
            gif, save_all=True, append_images=[Image.fromarray(f) for f in out[1:]], duration=1000 // fps, loop=0
        )
    else:
        imageio.mimwrite(str(path), list(out), fps=fps, macro_block_size=1)
    imageio.imwrite(str(path.with_suffix(".png")), out[-1])  # the last frames as a still grid
