"""The Dyna loop: a VLA trained inside a world model that the same trainer trained, judged by a
learned reward model, checked in the real simulator, with every real environment step counted.

`run_dyna` (``python -m mmrl.dyna configs/dyna/reach.yaml``; the settings are `DynaConfig`):

0. **Start** (no real step: demonstrations are free to every method). The acting policy's warm start
   (its experiment, ``trainer.iterations: 0``), the world model's (its experiment: ``policy.type:
   world_model`` on one-step records of the same demonstrations) and the reward model's (a
   `mmrl.reward.LearnedReward`, e.g. ``success_detector``, on the demonstrations' labelled frames).
1. Each round: **collect** ``real_episodes`` episodes with the current policy (sampling as in
   training) in the real simulator (`mmrl.episodes.record_episodes`); their steps are the round's
   real environment steps, all counted. **Refresh** the world model and the reward model on the
   demonstrations and every real episode so far (``world_model_steps`` / ``reward_steps`` more
   steps from their current weights). **Train** the policy in imagination: its own experiment
   resumed for ``imagined_iterations`` more iterations with ``sim.type: world_model`` (start frames
   from the demonstrations' and the real episodes' first observations). **Evaluate** in the real
   simulator on the held-out episodes (``trainer.eval_seed``, as the trainer evaluates), and from the
   same start frames in imagination: the imagined-minus-real success is the round's reward gap
   (RLinf's WorldLoop measured 0.55 imagined against 0.348 real). The world model's open-loop error
   on ``quality_episodes`` held-out real episodes is measured beside it (`rollout_error`).
2. The first round whose real held-out success reaches ``level`` gives ``real_env_steps_to_level``.

Evaluation episodes are not counted (as for every method: they measure, nothing trains on them).
Every round appends one JSON row to ``<output_dir>/dyna.jsonl``; `run_dyna` returns the summary.

**Resume.** After the start and after each round, `Dyna.save_round` writes the loop's state to
``<output_dir>/rounds/round_NNN/`` (the world model's export, the reward model, the real episodes
so far, the policy's checkpoint, the counters and rows): written in a temporary folder, renamed into
place last, the two newest kept. The same command (``resume: true``, the default) continues from the
newest complete one, whatever instant the previous run was killed at: the policy's run folder goes
back to that round's checkpoint, ``dyna.jsonl`` to its rows, and the rounds after it are redone as
they would have run (every round's randomness comes from the seed and the round's number). A run
whose rounds are all done returns its summary again. ``wall_s`` counts the seconds spent in the
loop, not the time between two runs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mmrl.config import ConfigError
from mmrl.episodes import join_episodes, record_episodes
from mmrl.utils.durable import fsync_path
from mmrl.utils.faults import fault_point

#: the real episodes' reset seeds: far from the evaluation's (trainer.eval_seed = 1e9 + e)
COLLECT_SEED = 500_000_000


@dataclass
class DynaConfig:
    """Settings of `run_dyna` (a YAML file of these keys; paths relative to the working directory)."""

    policy_config: str = "configs/quickstart.yaml"  # the acting policy's experiment (warm start, then PPO)
    world_model_config: str = "configs/reach_world_model.yaml"  # the world model's experiment (its warm start)
    policy_overrides: list[str] = field(default_factory=list)  # overrides of the policy's experiment
    world_model_overrides: list[str] = field(default_factory=list)
    reward: str = "success_detector"  # a registered LearnedReward: judges success in imagination
    reward_start_steps: int = 1500  # its training on the demonstrations' labelled frames
    reward_steps: int = 300  # its refresh each round
    # the reward model also learns the world model's frames of the same episodes (`imagine_records`:
    # replayed open loop), labelled with what really happened: trained on real frames alone it called
    # 3 of 21 imagined replays of really successful episodes a success (round 1, held-out episodes)
    reward_on_imagined: bool = True
    # the score at which an imagined frame is a success: 0.8 made the imagined success of 128
    # validation episodes' replays (57) closest to the real (53); at 0.5 it was 72
    success_threshold: float = 0.8
    world_model_steps: int = 600  # the world model's refresh each round (its warm start's batch size and lr)
    rounds: int = 6
    real_episodes: int = 32  # real episodes collected each round (all their steps counted)
    imagined_iterations: int = 10  # the policy's RL iterations in imagination each round
    eval_episodes: int = 256  # held-out real episodes per evaluation (and the same starts imagined)
    quality_episodes: int = 64  # held-out real episodes the world model's open-loop error is measured on
    level: float = 0.85  # the held-out success whose real env steps are reported
    seed: int = 0
    output_dir: str = "runs/dyna"
    # continue a run in output_dir from its newest complete round (false: a run there moves to
    # <output_dir>_previous_<n> and the loop starts over)
    resume: bool = True

    def validate(self) -> None:
        for key in ("rounds", "real_episodes", "eval_episodes", "quality_episodes"):
            if getattr(self, key) < 1:
                raise ConfigError(f"'{key}' = {getattr(self, key)} must be >= 1")
        for key in ("reward_start_steps", "reward_steps", "world_model_steps", "imagined_iterations"):
            if getattr(self, key) < 0:
                raise ConfigError(f"'{key}' = {getattr(self, key)} must be >= 0")
        if not 0 < self.success_threshold <= 1:
            raise ConfigError(f"'success_threshold' = {self.success_threshold}: a reward model's score in (0, 1]")
        if not 0 < self.level <= 1:
            raise ConfigError(f"'level' = {self.level}: a held-out success rate in (0, 1]")
        for key in ("policy_config", "world_model_config"):
            if not Path(getattr(self, key)).is_file():
                raise ConfigError(f"'{key}' = {getattr(self, key)!r}: no such file")


def load_dyna_config(path: str | Path | None, **overrides) -> DynaConfig:
    """`DynaConfig` from a YAML file (unknown keys refused in one line), then ``overrides``."""
    import yaml

    data = yaml.safe_load(Path(path).read_text()) if path else {}
    data = {**(data or {}), **overrides}
    known = {f.name for f in dataclasses.fields(DynaConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{path}: unknown Dyna settings {unknown}; known: {', '.join(sorted(known))}")
    cfg = DynaConfig(**data)
    cfg.validate()
    return cfg


# ---------------------------------------------------------------------------------------- steps
def train(config: str, overrides: list[str]) -> dict:
    """Run one experiment to its end (or resume it) in this process; its results."""
    from mmrl.experiment import build_trainer, load_experiment

    threads = torch.get_num_threads()
    try:
        return build_trainer(load_experiment(config, overrides)).run()
    finally:  # the run set its own (run.threads): the loop's steps keep the loop's, resumed or not
        torch.set_num_threads(threads)


def demo_records(cfg) -> dict:
    """The world model experiment's warm-start records, built as its warm start builds them
    (`mmrl.trainer.warm_start.warm_start_records`: recorded in its simulator as configured)."""
    from mmrl.trainer.warm_start import warm_start_records

    ws = cfg.warm_start
    return warm_start_records(cfg, ws.dataset, ws.num_episodes, ws.kwargs, cfg.policy.chunk_size)


def fine_tune(model, records: dict, steps: int, batch_size: int, lr: float, generator: torch.Generator) -> float:
    """``steps`` Adam steps of the model's own warm-start loss on ``records`` (its current weights
    on); returns the mean loss of the last quarter of them."""
    from mmrl.batch import random_indices

    if steps == 0:
        return float("nan")
    batch = model.warm_start_batch(records)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    losses = []
    # the loss's own noise (flow matching's times and noise: torch's global generator, as in the
    # trainer's warm start) seeded from ``generator`` too: a resumed loop refreshes as the first run did
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)))
        for _ in range(steps):
            idx = random_indices(batch.size, min(batch_size, batch.size), generator)
            loss = model.supervised_loss(batch.index(idx).to(model.device)).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
    model.eval()
    tail = losses[-max(1, steps // 4) :]
    return float(torch.stack(tail).mean())


@torch.no_grad()
def imagined_success(policy, sim, starts, generator: torch.Generator) -> torch.Tensor:
    """bool [N]: each episode started from the real observations ``starts`` (`WorldModelSim.reset_to`)
    reaches success in imagination, the policy sampling as it is evaluated."""
    obs = sim.reset_to(starts)
    n = sim.num_envs
    alive = torch.ones(n, dtype=torch.bool)
    won = torch.zeros(n, dtype=torch.bool)
    for _ in range(math.ceil(sim.max_episode_steps / policy.chunk_size)):
        actions = policy.rollout(obs, generator=generator, mode="eval").actions
        res = sim.step_chunk(actions.to(sim.device))
        won |= res.success.cpu() & alive
        alive &= ~res.done.cpu()
        obs = res.obs
        if not alive.any():
            break
    return won


class Dyna:
    """One run of the loop (see the module docstring); `run` does it all."""

    def __init__(self, cfg: DynaConfig, log=print):
        from mmrl.experiment import load_experiment

        self.cfg, self.log = cfg, log
        self.out = Path(cfg.output_dir)
        self.seed = cfg.seed
        common = [f"run.seed={cfg.seed}", f"run.output_dir={self.out}"]
        self.policy_set = [*common, "run.name=policy", *cfg.policy_overrides]
        self.wm_set = [*common, "run.name=world_model", *cfg.world_model_overrides]
        self.policy_cfg = load_experiment(cfg.policy_config, self.policy_set)
        self.wm_cfg = load_experiment(cfg.world_model_config, self.wm_set)
        if self.wm_cfg.policy.type != "world_model":
            raise ConfigError(
                f"'world_model_config' {cfg.world_model_config} trains policy.type {self.wm_cfg.policy.type!r}, "
                "not world_model"
            )
        if self.wm_cfg.sim.type != self.policy_cfg.sim.type:
            raise ConfigError(
                f"the world model learns simulator {self.wm_cfg.sim.type!r} but the policy acts in "
                f"{self.policy_cfg.sim.type!r}"
            )
        from mmrl.registry import REWARDS
        from mmrl.reward import LearnedReward

        self.reward_cls = REWARDS.get(cfg.reward)
        if not (isinstance(self.reward_cls, type) and issubclass(self.reward_cls, LearnedReward)):
            raise ConfigError(
                f"'reward' = {cfg.reward!r} is not a reward model trained on frames (mmrl.reward.LearnedReward)"
            )
        self.real_env_steps = 0  # every real step of the loop: the collected episodes' rows
        self.logged: dict | None = None  # the real episodes collected so far (one step per row)
        self.rows: list[dict] = []

    # ------------------------------------------------------------------ paths
    @property
    def world_model_dir(self) -> Path:
        return self.out / "world_model_export"

    @property
    def reward_dir(self) -> Path:
        return self.out / "reward_model"

    @property
    def starts_file(self) -> Path:
        return self.out / "starts.pt"

    def imagination_set(self, iterations: int) -> list[str]:
        """Overrides that resume the policy's experiment inside the world model for ``iterations`` in all."""
        kw = {
            "checkpoint": str(self.world_model_dir),
            "reward": self.cfg.reward,
            "reward_kwargs": {"path": str(self.reward_dir)},
            "success_threshold": self.cfg.success_threshold,
            "starts": str(self.starts_file),
            "max_episode_steps": self.policy_cfg.sim.kwargs.get("max_episode_steps", 20),
        }
        return [
            *self.policy_set,
            "sim.type=world_model",
            f"sim.kwargs={json.dumps(kw)}",
            "sim.eval_kwargs={}",
            "warm_start.dataset=null",
            "trainer.resume=true",
            "trainer.accept_config_change=true",
            f"trainer.iterations={iterations}",
            "trainer.env_steps=null",
            "trainer.eval_every=0",
            "trainer.eval_episodes=64",  # the trainer's own evaluation, in imagination: a cheap glance
            "sim.eval_num_envs=64",
            "trainer.video_episodes=0",
        ]

    # ------------------------------------------------------------------ the loop
    def real_sim(self, num_envs: int, evaluation: bool = False):
        from mmrl.experiment import build_sim

        return build_sim(self.policy_cfg, num_envs, self.seed + (1 if evaluation else 0), evaluation=evaluation)

    def policy(self):
        from mmrl.api import load_policy

        return load_policy(self.out / "policy")

    def collect(self, round_: int) -> dict:
        """The round's real episodes, every step counted."""
        from mmrl.trainer.state import run_generator

        n = self.cfg.real_episodes
        sim = self.real_sim(n)
        seeds = [COLLECT_SEED + self.seed * 1_000_003 + round_ * n + i for i in range(n)]
        try:
            recs = record_episodes(self.policy(), sim, seeds, run_generator(self.seed, "rl", 10_000 + round_))
        finally:
            sim.close()
        self.real_env_steps += len(recs["episode"])
        self.logged = join_episodes(self.logged, recs)
        return recs

    def start(self) -> None:
        """Round 0's models, from the demonstrations (no real step)."""
        from mmrl.api import load_policy

        self.log("dyna: the policy's warm start")
        train(self.cfg.policy_config, [*self.policy_set, "trainer.iterations=0", "trainer.env_steps=null"])
        self.log("dyna: the world model's warm start")
        train(self.cfg.world_model_config, self.wm_set)
        self.world_model = load_policy(self.out / "world_model")
        self.demos = demo_records(self.wm_cfg)
        self.log("dyna: the reward model on the demonstrations' frames")
        self.reward = self.reward_cls.untrained(self.world_model.cfg.image_size, seed=self.seed)
        metrics = self.reward.fit(self.reward_data(self.demos), self.cfg.reward_start_steps, seed=self.seed)
        self.log(f"dyna: reward model {json.dumps(metrics)}")

    def reward_data(self, data: dict) -> dict:
        """The reward model's episodes: ``data`` and, with ``reward_on_imagined``, the same episodes
        as the current world model imagines them (their real labels kept)."""
        if not self.cfg.reward_on_imagined:
            return data
        from mmrl.policies.world_model import imagine_records

        return join_episodes(data, imagine_records(self.world_model, data, seed=self.seed))

    def refresh(self, round_: int) -> dict:
        """World model and reward model on the demonstrations and every real episode so far."""
        from mmrl.trainer.state import run_generator

        data = join_episodes(self.demos, self.logged) if self.logged is not None else self.demos
        ws = self.wm_cfg.warm_start
        loss = fine_tune(
            self.world_model,
            data,
            self.cfg.world_model_steps,
            ws.batch_size,
            ws.lr,
            run_generator(self.seed, "warm_start", 10_000 + round_),
        )
        metrics = self.reward.fit(self.reward_data(data), self.cfg.reward_steps, seed=self.seed + 1000 * (round_ + 1))
        shutil.rmtree(self.world_model_dir, ignore_errors=True)
        self.world_model.export_pretrained(self.world_model_dir)
        self.reward.save(self.reward_dir)
        torch.save(data, self.starts_file)
        return {"world_model_loss": round(loss, 5), "reward_model": metrics}

    def evaluate(self) -> dict:
        """Real held-out success, the same starts imagined, and the world model's open-loop error."""
        from mmrl.policies.world_model import rollout_error
        from mmrl.registry import SIMULATORS
        from mmrl.rollout import evaluate_policy
        from mmrl.trainer.state import run_generator

        t = self.policy_cfg.trainer
        policy = self.policy()
        sim = self.real_sim(self.cfg.eval_episodes, evaluation=True)
        try:
            real = evaluate_policy(
                policy, sim, self.cfg.eval_episodes, t.eval_seed, run_generator(self.seed, "eval", 0)
            )
            starts = sim.reset([t.eval_seed + e for e in range(self.cfg.eval_episodes)])
        finally:
            sim.close()
        q = self.cfg.quality_episodes
        quality_sim = self.real_sim(q, evaluation=True)
        try:  # held-out real episodes (evaluation seeds): measured on, never trained on
            seeds = [t.eval_seed + e for e in range(q)]
            held = record_episodes(policy, quality_sim, seeds, run_generator(self.seed, "eval", 1), mode="eval")
        finally:
            quality_sim.close()
        imagined_sim = SIMULATORS.build(
            "world_model",
            model=self.world_model,
            reward_model=self.reward,
            start_records=self.demos,
            success_threshold=self.cfg.success_threshold,
            num_envs=self.cfg.eval_episodes,
            max_episode_steps=sim.max_episode_steps,
            seed=self.seed,
        )
        won = imagined_success(policy, imagined_sim, starts, run_generator(self.seed, "eval", 2))
        quality = rollout_error(self.world_model, held, horizon=sim.max_episode_steps, seed=self.seed)
        real_rate = float(real["success_rate"])
        return {
            "real_success": round(real_rate, 4),
            "imagined_success": round(float(won.float().mean()), 4),
            "reward_gap": round(float(won.float().mean()) - real_rate, 4),
            "world_model_frame_mae": round(quality["frame_mae"], 3),
            "copy_frame_mae": round(quality["copy_mae"], 3),
            "world_model_state_mae": round(quality.get("state_mae", float("nan")), 5),
        }

    # ------------------------------------------------------------------ resume
    @property
    def rounds_dir(self) -> Path:
        return self.out / "rounds"

    def settings(self) -> dict:
        """The settings a resumed run must share with the run it continues (``rounds`` may grow;
        ``level`` only reads the rows)."""
        return {k: v for k, v in dataclasses.asdict(self.cfg).items() if k not in ("rounds", "resume", "level")}

    def save_round(self, round_: int, wall_s: float) -> None:
        """The loop's state after ``round_`` (0: the start) in ``rounds/round_NNN/``, complete or absent."""
        from mmrl.trainer.checkpoint import newest_complete

        final = self.rounds_dir / f"round_{round_:03d}"
        tmp = self.rounds_dir / f".round_{round_:03d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self.world_model.export_pretrained(tmp / "world_model")
        self.reward.save(tmp / "reward_model")
        torch.save({"logged": self.logged}, tmp / "logged.pt")
        checkpoint, problems = newest_complete(self.out / "policy" / "checkpoints")
        if checkpoint is None:
            raise RuntimeError(f"the policy's run {self.out / 'policy'} has no complete checkpoint: {problems}")
        shutil.copytree(checkpoint, tmp / "policy_checkpoints" / checkpoint.name)
        state = {"round": round_, "real_env_steps": self.real_env_steps, "rows": self.rows, "wall_s": wall_s}
        (tmp / "state.json").write_text(json.dumps({**state, "settings": self.settings()}))
        for f in [*tmp.rglob("*"), tmp]:
            fsync_path(f)
        fault_point("dyna.before_save", tmp)
        shutil.rmtree(final, ignore_errors=True)  # only a round redone after its folder's rename
        tmp.rename(final)
        fsync_path(self.rounds_dir)
        fault_point("dyna.after_save", final)
        for old in sorted(self.rounds_dir.glob("round_*"))[:-2]:
            shutil.rmtree(old)

    def newest_round(self) -> Path | None:
        """The newest complete round folder (a ``.tmp`` one never is)."""
        done = sorted(p for p in self.rounds_dir.glob("round_*") if (p / "state.json").is_file())
        return done[-1] if done else None

    def restore(self, folder: Path) -> tuple[int, float]:
        """The loop's state of ``folder`` (`save_round`): returns its round and wall seconds."""
        from mmrl.api import load_policy

        state, settings = json.loads((folder / "state.json").read_text()), self.settings()
        if state["settings"] != settings:
            differ = sorted(k for k in settings if state["settings"].get(k) != settings[k])
            raise ConfigError(
                f"{self.out} holds a Dyna run with other settings ({', '.join(differ)}): run with its settings, "
                "another output_dir, or resume: false to start over (the old run is moved aside)"
            )
        self.world_model = load_policy(folder / "world_model")
        self.reward = self.reward_cls(path=str(folder / "reward_model"))
        self.logged = torch.load(folder / "logged.pt", weights_only=True)["logged"]
        self.demos = demo_records(self.wm_cfg)
        self.real_env_steps, self.rows = state["real_env_steps"], state["rows"]
        # the policy's run folder back to the round's checkpoint (a later one is a round in progress)
        checkpoints = self.out / "policy" / "checkpoints"
        shutil.rmtree(checkpoints, ignore_errors=True)
        shutil.copytree(folder / "policy_checkpoints", checkpoints)
        self.write_rows()
        self.log(f"dyna: resumed after round {state['round']} from {folder} ({self.real_env_steps} real env steps)")
        return state["round"], state["wall_s"]

    def write_rows(self) -> None:
        """``dyna.jsonl``: a row per round done (rewritten whole: a row of a redone round appears once)."""
        tmp = self.out / "dyna.jsonl.tmp"
        tmp.write_text("".join(json.dumps(row) + "\n" for row in self.rows))
        tmp.replace(self.out / "dyna.jsonl")

    def fresh_folder(self) -> None:
        """An empty output folder; a run already there moves to ``<output_dir>_previous_<n>``."""
        if self.out.exists() and any(self.out.iterdir()):
            n = 0
            while self.out.with_name(f"{self.out.name}_previous_{n}").exists():
                n += 1
            moved = self.out.rename(self.out.with_name(f"{self.out.name}_previous_{n}"))
            self.log(f"dyna: resume: false: the run in {self.out} moved to {moved}")
        self.out.mkdir(parents=True, exist_ok=True)

    def run(self) -> dict:
        from mmrl.utils.threads import configure_threads

        configure_threads(self.policy_cfg.run.threads)  # the loop's own steps: the policy run's threads
        newest = self.newest_round() if self.cfg.resume else None
        if newest is None:
            if not self.cfg.resume:
                self.fresh_folder()
            shutil.rmtree(self.rounds_dir, ignore_errors=True)  # only unfinished (.tmp) folders
            self.out.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            self.start()  # the warm starts' runs resume their own checkpoints, if any
            self.write_rows()
            self.save_round(0, round(time.perf_counter() - t0, 1))
            done = 0
        else:
            done, wall = self.restore(newest)
            t0 = time.perf_counter() - wall
        for r in range(done, self.cfg.rounds):
            self.collect(r)
            refreshed = self.refresh(r)
            train(self.cfg.policy_config, self.imagination_set((r + 1) * self.cfg.imagined_iterations))
            row = {
                "round": r + 1,
                "real_env_steps": self.real_env_steps,
                "real_episodes": int(self.logged["final_image"].shape[0]) if self.logged else 0,
                **self.evaluate(),
                **refreshed,
                "wall_s": round(time.perf_counter() - t0, 1),
            }
            self.rows.append(row)
            with open(self.out / "dyna.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
            self.log(f"dyna round {r + 1}: {json.dumps(row)}")
            self.save_round(r + 1, row["wall_s"])
        rows = self.rows[: self.cfg.rounds]
        reached = [row["real_env_steps"] for row in rows if row["real_success"] >= self.cfg.level]
        return {
            "real_env_steps_to_level": reached[0] if reached else None,
            "real_env_steps": rows[-1]["real_env_steps"] if rows else 0,
            "final_success": rows[-1]["real_success"] if rows else None,
            "wall_s": rows[-1]["wall_s"] if rows else round(time.perf_counter() - t0, 1),
            "rounds": rows,
        }


def run_dyna(cfg: DynaConfig, log=print) -> dict:
    """The loop of the module docstring; its summary (and ``dyna.jsonl``, a row per round)."""
    return Dyna(cfg, log).run()


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", nargs="?", default="configs/dyna/reach.yaml")
    p.add_argument("--set", action="append", default=[], help="KEY=VALUE (YAML value) over the file's settings")
    args = p.parse_args(argv)
    import yaml

    over = {}
    for item in args.set:
        key, _, value = item.partition("=")
        over[key] = yaml.safe_load(value)
    try:
        out = run_dyna(load_dyna_config(args.config, **over))
    except ConfigError as exc:
        sys.exit(f"mmrl.dyna: {exc}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
