"""mmrl's PPO against Stable-Baselines3's PPO on gymnasium control tasks with state observations.

    pip install 'stable-baselines3==2.9.2'      # benchmark-only (the `bench` extra), never a runtime dependency
    python benchmarks/vs_sb3.py                  # Pendulum-v1 and InvertedPendulum-v5, 3 seeds each
    python benchmarks/vs_sb3.py --tasks mujoco --jobs 2   # HalfCheetah, Hopper, Walker2d, Swimmer (200k), Ant (1M)
    python benchmarks/vs_sb3.py --seeds 1 --tasks Reacher-v5 --env-steps 100000   # any gymnasium id
    python benchmarks/vs_sb3.py --validation ...     # choose settings: other training seeds, other episodes
    python benchmarks/vs_sb3.py --smoke              # seconds: one update per run, no figure

Any registered gymnasium id runs: Pendulum and InvertedPendulum from their own configs, every other id
from the state template (``configs/gym_inverted_pendulum.yaml`` with the env id swapped in, as a user
copying it would) at ``--env-steps`` (default: the task's budget in ``TASKS``, where SB3's defaults
clearly learn it: 200k for HalfCheetah, Hopper, Walker2d and Swimmer, 1M for Ant; 300k for any
other id). ``--validation`` trains seeds 100, 101, ... and evaluates on episodes from reset
seed 2e9: settings are chosen there, and the reported figures (seeds 0, 1, ..., episodes from 1e9)
never choose anything.

Identical work on both sides, per task and seed: the same gymnasium env id, the same number of
environment steps of training, then the same held-out episodes (reset seeds ``1e9 + e``, e <
``--eval-episodes``) played with the deterministic policy (SB3: ``predict(deterministic=True)``;
mmrl: the flow policy's ``eval_method: mean``, the rollout chain's means from zero noise / the
Gaussian's mean). Every run is a fresh subprocess with one torch thread; the sides alternate order
seed by seed.

- ``sb3``: ``PPO("MlpPolicy", env_id, seed=seed)`` with SB3's published defaults (1 env, 2048 steps
  per update, 10 epochs of minibatches of 64, lr 3e-4, gamma 0.99, GAE 0.95, clip 0.2, no
  normalisation).
- ``flow``: mmrl's default flow policy from the task's config alone (``configs/gym_*.yaml``:
  ``flow_vla`` with ``backbone: auto``, i.e. the state MLP and an MLP action expert predicting the
  clean action, an ODE chain and a learned Gaussian on its action whose initial std the first
  rollouts choose (``action_log_std_init: auto``; per seed in ``action_std_init``), PPO at lr 1e-3,
  16 envs x 128-step rollouts = SB3's 2048 steps per update, 10 epochs of minibatches of 256 (an
  update stops after the epoch whose approx. KL passes ``target_kl`` 0.2),
  observation and reward normalisation; no warm start).
- ``gaussian``: the same config with ``policy.type=gaussian`` (SB3's policy class inside mmrl's
  trainer) at SB3's lr 3e-4, to tell the algorithm from the policy class.

Figures: the final held-out return per seed; ``ratio_return`` = (mmrl flow mean - random) /
(SB3 mean - random), where random is the uniform random policy's mean return on the same held-out
episodes (1 = SB3's level, 0 = random's; a plain ratio of means is meaningless for Pendulum's negative
returns); ``ratio_return_gaussian`` the same for the Gaussian policy; ``ratio_steps_per_s`` = flow's
training env steps per second (rollouts + updates, evaluation excluded) / SB3's. The last line is
one JSON object with, per task, the per-seed lists and these ratios, plus the load average.
``--jobs 2`` runs two subprocesses at a time (one per core on a 2-core machine: both sides then
share the machine with one other run; the speed ratio compares runs made under the same load).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TAG = "VS_SB3_RESULT "
EVAL_SEED = 1_000_000_000  # mmrl's trainer.eval_seed: held-out episode e resets with EVAL_SEED + e
# tasks with a config of their own and the budget of the documented figures (docs/benchmarks/vs-sb3.md);
# any other gymnasium id runs from the template of its observation kind with ``--env-steps`` (default DEFAULT_ENV_STEPS)
TASKS = {
    "Pendulum-v1": {"config": "configs/gym_pendulum.yaml", "env_steps": 100_000},
    "InvertedPendulum-v5": {"config": "configs/gym_inverted_pendulum.yaml", "env_steps": 50_000},
    # the MuJoCo locomotion set from the state template at budgets where SB3's PPO defaults clearly
    # learn: 200k steps, but Ant 1M (at 200k SB3 ends below the ~970 of an ant that merely stands)
    "HalfCheetah-v5": {"env_steps": 200_000},
    "Hopper-v5": {"env_steps": 200_000},
    "Walker2d-v5": {"env_steps": 200_000},
    "Swimmer-v5": {"env_steps": 200_000},
    "Ant-v5": {"env_steps": 1_000_000},
}
TEMPLATE_STATE = "configs/gym_inverted_pendulum.yaml"  # state observations: the env id swapped in
MUJOCO_LOCOMOTION = "HalfCheetah-v5,Hopper-v5,Walker2d-v5,Ant-v5,Swimmer-v5"
DEFAULT_ENV_STEPS = 300_000
GAUSSIAN_LR = 3e-4  # the Gaussian side's (SB3's) learning rate; the flow template's own is larger
VALIDATION_SEED0, VALIDATION_EVAL_SEED = 100, 2_000_000_000  # --validation: other seeds, other episodes
SIDES = ("sb3", "flow", "gaussian")


# ----------------------------------------------------------------------------------- the sides
def play(act, env_id: str, episodes: int, eval_seed: int = EVAL_SEED) -> list[float]:
    """Returns of ``episodes`` held-out episodes of ``act(obs) -> action`` (reset seeds eval_seed + e)."""
    import gymnasium as gym

    env, out = gym.make(env_id), []
    for e in range(episodes):
        obs, _ = env.reset(seed=eval_seed + e)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            total += float(reward)
            done = terminated or truncated
        out.append(total)
    env.close()
    return out


def run_sb3(task: str, seed: int, env_steps: int, episodes: int, eval_seed: int) -> dict:
    import torch
    from stable_baselines3 import PPO

    torch.set_num_threads(1)
    model = PPO("MlpPolicy", task, seed=seed, device="cpu", verbose=0)
    t0 = time.perf_counter()
    model.learn(total_timesteps=env_steps)
    train_s = time.perf_counter() - t0
    returns = play(lambda o: model.predict(o, deterministic=True)[0], task, episodes, eval_seed)
    return {"return": statistics.mean(returns), "train_s": train_s, "env_steps": int(model.num_timesteps)}


def task_config(task: str, config: str | None = None) -> dict:
    """The experiment of ``task``: ``config`` (a path under the repository), else the task's own
    config, else the state template; with the task's env id swapped in."""
    import yaml

    path = config or TASKS.get(task, {}).get("config", TEMPLATE_STATE)
    data = yaml.safe_load((ROOT / path).read_text())
    data["sim"]["kwargs"]["env_id"] = task
    return data


def run_mmrl(
    task: str,
    seed: int,
    env_steps: int,
    episodes: int,
    eval_seed: int,
    policy: str,
    overrides: list[str],
    config: str | None = None,
) -> dict:
    """One mmrl run of ``task`` (`task_config`; ``policy`` "gaussian" swaps in the Gaussian MLP's
    defaults), trained for ``env_steps`` and evaluated on ``episodes`` held-out episodes."""
    sys.path.insert(0, str(ROOT))
    from mmrl.experiment import build_trainer, load_experiment

    data = task_config(task, config)
    if policy == "gaussian":  # the same experiment with the Gaussian MLP's defaults as the policy
        data["policy"] = {"type": "gaussian"}
        data["trainer"]["lr"] = GAUSSIAN_LR
    cfg = load_experiment(
        data,
        [
            f"run.name=bench_sb3_{task}_{policy}_{seed}",
            "run.output_dir=runs",
            "trainer.resume=false",
            f"run.seed={seed}",
            "run.threads=1",
            f"trainer.env_steps={env_steps}",
            "trainer.checkpoint_every=1000000",
            f"trainer.eval_episodes={episodes}",
            f"trainer.eval_seed={eval_seed}",
            *overrides,
        ],
    )
    trainer = build_trainer(cfg)
    final = trainer.run()["final"]
    out = {"return": final["return"], "train_s": final["rl_seconds"], "env_steps": final["env_steps"]}
    if trainer.state.exploration:  # action_log_std_init: auto chose the initial action std
        out["action_std_init"] = round(trainer.state.exploration["chosen_std"], 4)
    return out


def run_random(task: str, episodes: int, eval_seed: int) -> dict:
    import gymnasium as gym
    import numpy as np

    space = gym.make(task).action_space
    rng = np.random.default_rng(0)
    returns = play(lambda o: rng.uniform(space.low, space.high).astype(space.dtype), task, episodes, eval_seed)
    return {"return": statistics.mean(returns)}


# --------------------------------------------------------------------------------- orchestration
def child(args: argparse.Namespace) -> None:
    from mmrl.utils.processes import exit_with_parent_if_asked

    exit_with_parent_if_asked()  # started by `spawn`: stop if the orchestrator is killed
    eval_seed = VALIDATION_EVAL_SEED if args.validation else EVAL_SEED
    if args.side == "sb3":
        out = run_sb3(args.task, args.seed, args.env_steps, args.eval_episodes, eval_seed)
    elif args.side == "random":
        out = run_random(args.task, args.eval_episodes, eval_seed)
    else:
        out = run_mmrl(args.task, args.seed, args.env_steps, args.eval_episodes, eval_seed, args.side, args.overrides)
    print(TAG + json.dumps(out), flush=True)


def child_command(
    side: str, task: str, seed: int, env_steps: int, args: argparse.Namespace, script: str = __file__
) -> tuple[list[str], dict[str, str]]:
    """``(command, environment)`` of one side's run in a fresh subprocess of ``script`` (its
    ``--child`` mode, one thread): ``args`` gives ``eval_episodes``, ``overrides`` and optionally
    ``validation``."""
    cmd = [
        sys.executable,
        script,
        "--child",
        "--side",
        side,
        "--task",
        task,
        "--seed",
        str(seed),
        "--env-steps",
        str(env_steps),
        "--eval-episodes",
        str(args.eval_episodes),
        *(["--validation"] if getattr(args, "validation", False) else []),
        *args.overrides,
    ]
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)  # keep the caller's
    return cmd, {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1", "PYTHONPATH": path}


def spawn(
    side: str, task: str, seed: int, env_steps: int, args: argparse.Namespace, script: str = __file__, tag: str = TAG
) -> dict:
    """Run one side in a fresh subprocess of ``script`` (`child_command`) and return the result it
    printed after ``tag``."""
    from mmrl.utils.processes import child_env

    cmd, env = child_command(side, task, seed, env_steps, args, script)
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**env, **child_env()}, cwd=ROOT)
    for line in proc.stdout.splitlines():
        if line.startswith(tag):
            return json.loads(line[len(tag) :])
    raise RuntimeError(f"{side} on {task} seed {seed} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def check_tasks(tasks: list[str]) -> None:
    """Exit in one line, before any run, on an id gymnasium does not know: the gym adapter's own
    check (`simulators.gym_env.check_env_id`, which names close ids)."""
    sys.path.insert(0, str(ROOT))
    from mmrl.errors import UserError
    from simulators.gym_env import check_env_id

    for task in tasks:
        try:
            check_env_id(task)
        except UserError as err:
            sys.exit(f"--tasks: {err}")


def stats(values: list[float]) -> dict:
    return {
        "mean": statistics.mean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "per_seed": [round(v, 2) for v in values],
    }


def add_child_args(p: argparse.ArgumentParser) -> None:
    """The hidden arguments of one run in its subprocess (`spawn`) and the mmrl overrides."""
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--side", help=argparse.SUPPRESS)
    p.add_argument("--task", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*", help="dotted overrides for the mmrl runs")


def require_sb3(benchmark: str) -> None:
    """Exit in one line, before any run, when Stable-Baselines3 (benchmark-only) is missing."""
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        sys.exit(
            f"{benchmark} needs Stable-Baselines3 (benchmark-only): pip install 'mmrl[bench]' "
            "or pip install stable-baselines3==2.9.2"
        )


def side_by_side(
    tasks: list[str],
    sides: list[str],
    seeds,
    steps_of: Callable[[str], int],
    run: Callable[[str, str, int, int], dict],
    ratio_keys: dict[str, str],
    speed_side: str,
    jobs: int = 1,
) -> dict:
    """Every side on every task and seed, ``jobs`` runs at a time (the sides alternate order seed by
    seed), and the uniform random policy once per task: per task the per-seed returns and env steps
    per second (`stats`), ``ratio_keys[side]`` = (side mean - random) / (SB3 mean - random) and
    ``ratio_steps_per_s`` = ``speed_side``'s env steps per second / SB3's. ``run(side, task, seed,
    steps)`` runs one (`spawn`). Also used by ``benchmarks/sample_efficiency.py``."""
    figures: dict = {}
    for task in tasks:
        steps = steps_of(task)
        todo = [(seed, side) for seed in seeds for side in (sides if seed % 2 == 0 else sides[::-1])]

        def one(job, task=task, steps=steps):  # bound now: runs while this loop turn waits
            seed, side = job
            r = run(side, task, seed, steps)
            print(
                f"{task} seed {seed} {side:8s}: return {r['return']:9.2f}, "
                f"{r['env_steps'] / r['train_s']:7.0f} env steps/s",
                flush=True,
            )
            return r

        with ThreadPoolExecutor(max(1, jobs)) as pool:
            done = dict(zip(todo, pool.map(one, todo)))
        runs = {side: [done[(seed, side)] for seed in seeds] for side in sides}
        random = run("random", task, 0, steps)["return"]
        row: dict = {"env_steps": steps, "random_return": round(random, 2)}
        for side, rs in runs.items():
            row[side] = {
                "return": stats([r["return"] for r in rs]),
                "steps_per_s": stats([r["env_steps"] / r["train_s"] for r in rs]),
            }
            if any("action_std_init" in r for r in rs):  # per seed, what action_log_std_init: auto chose
                row[side]["action_std_init"] = [r.get("action_std_init") for r in rs]
            ret = row[side]["return"]
            print(f"{task} {side}: per seed {ret['per_seed']}, mean {ret['mean']:.2f}, std {ret['std']:.2f}")
        if "sb3" in runs:
            base = row["sb3"]["return"]["mean"] - random
            for side, key in ratio_keys.items():
                if side in runs:
                    row[key] = round((row[side]["return"]["mean"] - random) / base, 3) if base else None
            if speed_side in runs:
                row["ratio_steps_per_s"] = round(
                    row[speed_side]["steps_per_s"]["mean"] / row["sb3"]["steps_per_s"]["mean"], 3
                )
        figures[task] = row
        print(f"{task}: " + ", ".join(f"{k} {v}" for k, v in row.items() if k.startswith("ratio")), flush=True)
    return figures


def main() -> None:
    from _smoke import parse_args, scratch

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--tasks",
        default="Pendulum-v1,InvertedPendulum-v5",
        help=f"comma-separated gymnasium ids (any registered id; 'mujoco' = {MUJOCO_LOCOMOTION})",
    )
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--env-steps", type=int, default=None, help="override every task's training env steps")
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument(
        "--validation",
        action="store_true",
        help=f"choose settings here: seeds from {VALIDATION_SEED0} and evaluation episodes from "
        f"{VALIDATION_EVAL_SEED}, never those of the reported figures",
    )
    p.add_argument("--sides", default=",".join(SIDES), help="which of sb3, flow, gaussian to run")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (each one torch thread)")
    add_child_args(p)
    args = parse_args(p, seeds=1, env_steps=2048, eval_episodes=1, jobs=2)
    if args.smoke:  # the mmrl runs' folders in a temporary folder
        args.overrides = [f"run.output_dir={scratch()}", *args.overrides]
    if args.child:
        return child(args)
    require_sb3("vs_sb3")
    sides = [s for s in args.sides.split(",") if s]
    unknown = set(sides) - set(SIDES)
    if unknown:
        sys.exit(f"--sides: unknown {sorted(unknown)}; choose from {', '.join(SIDES)}")
    tasks = [t for t in args.tasks.replace("mujoco", MUJOCO_LOCOMOTION).split(",") if t]
    check_tasks(tasks)
    seed0 = VALIDATION_SEED0 if args.validation else 0
    figures: dict = {
        "load_avg_start": round(os.getloadavg()[0], 2),
        "split": "validation" if args.validation else "test",
    }
    figures |= side_by_side(
        tasks,
        sides,
        range(seed0, seed0 + args.seeds),
        lambda task: args.env_steps or TASKS.get(task, {}).get("env_steps", DEFAULT_ENV_STEPS),
        lambda side, task, seed, steps: spawn(side, task, seed, steps, args),
        {"flow": "ratio_return", "gaussian": "ratio_return_gaussian"},
        speed_side="flow",
        jobs=args.jobs,
    )
    figures["load_avg_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
