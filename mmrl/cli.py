"""Command line: ``mmrl train|eval|list|check``.

    mmrl train configs/quickstart.yaml [key=value ...]     train (resumes from the run's last checkpoint)
    mmrl eval configs/quickstart.yaml checkpoint=PATH [key=value ...]
    mmrl list                                              every registered component, objective and flow sampler
    mmrl check simulator NAME[:TASK] [key=value ...]       run the simulator contract checker
    mmrl check reward NAME [key=value ...]                 run the reward contract checker
    mmrl check policy NAME [key=value ...]                 run the policy contract checker on its tiny config
                                                           (policy config keys; sim=NAME, sim.KEY=VALUE)
"""

from __future__ import annotations

import argparse
import json
import sys


def _split_checkpoint(overrides: list[str]) -> tuple[str | None, list[str]]:
    ckpt, rest = None, []
    for item in overrides:
        if item.startswith("checkpoint="):
            ckpt = item.split("=", 1)[1]
        else:
            rest.append(item)
    return ckpt, rest


def cmd_train(args) -> int:
    from mmrl.experiment import build_trainer, load_experiment

    cfg = load_experiment(args.config, args.overrides)
    results = build_trainer(cfg).run()  # ends with its summary line (metric before / after, folder)
    print(json.dumps(results))
    return 0


def cmd_eval(args) -> int:
    from pathlib import Path

    import torch

    from mmrl.experiment import build_policy, build_reward, build_sim, eval_tasks, load_experiment, output_dir
    from mmrl.trainer.checkpoint import latest_path, load_policy
    from mmrl.trainer.evaluation import evaluate_suite

    ckpt, overrides = _split_checkpoint(args.overrides)
    cfg = load_experiment(args.config, overrides)
    path = Path(ckpt) if ckpt else latest_path(output_dir(cfg))
    if path is None or not path.exists():
        print(f"error: no checkpoint at {ckpt or output_dir(cfg) / 'checkpoints'}; "
              "pass checkpoint=PATH (a folder holding state.pt)", file=sys.stderr)
        return 2
    tasks = eval_tasks(cfg)
    t, seed = cfg.trainer, cfg.run.seed + 1

    def make_sim(task, num_envs):
        return build_sim(cfg, num_envs, seed, evaluation=True, task=task)

    probe = make_sim(tasks[0], 1)  # shapes for the policy; one env, closed at once
    policy = build_policy(cfg, probe)
    probe.close()
    load_policy(path, policy)
    gen = torch.Generator(device=cfg.run.device).manual_seed(cfg.run.seed)
    out = output_dir(cfg)
    report = evaluate_suite(policy, make_sim, tasks, t.eval_episodes, t.eval_seed, gen,
                            out / "videos" if t.video_episodes else None, t.video_episodes,
                            max_envs=cfg.sim.eval_num_envs, reward=build_reward(cfg))
    report["checkpoint"] = str(path)
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval_report.json").write_text(json.dumps(report, indent=2))
    for row in report["tasks"]:
        label = row.get("instruction") or ("as configured" if row["task"] is None else row["task"])
        print(f"  {row['success_rate']:6.3f}  ({row['episodes']} episodes)  {label}")
    for name, row in report.get("suites", {}).items():
        print(f"  {row['success_rate']:6.3f}  ({row['episodes']} episodes)  suite {name}")
    print(f"overall success {report['success_rate']:.3f} over {report['episodes']} episodes; "
          f"report: {out / 'eval_report.json'}")
    print(json.dumps(report))
    return 0


def cmd_list(args) -> int:
    from mmrl.flow import steps
    from mmrl.registry import ALL, _first_line
    from mmrl.trainer.objectives import OBJECTIVES

    sections = {kind: registry.describe() for kind, registry in ALL.items()}
    # choices a config selects by name that are not registries
    sections["objectives (algorithm.objective)"] = [(n, _first_line(fn)) for n, fn in OBJECTIVES.items()]
    sections["flow samplers (policy.method, policy.eval_method)"] = [
        (m, _first_line(getattr(steps, f"{m}_step"))) for m in steps.STEP_METHODS]
    sections["flow stochastic steps (policy.stochastic)"] = [
        ("all", "every denoising step"), ("one", "one random step per sample, ODE elsewhere"),
        ("window", "the steps of policy.window, ODE elsewhere")]
    for kind, rows in sections.items():
        print(f"{kind}:")
        for name, desc in rows:
            print(f"  {name:<24} {desc}".rstrip())
    return 0


def _kwargs(items: list[str]) -> dict:
    import yaml

    out = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"argument {item!r} must look like key=value")
        k, v = item.split("=", 1)
        out[k] = yaml.safe_load(v)
    return out


def cmd_check(args) -> int:
    if args.kind not in ("simulator", "reward", "policy"):
        print(f"error: unknown check kind {args.kind!r}; valid: simulator, reward, policy", file=sys.stderr)
        return 2
    if args.kind == "policy":  # prints a line per check; exit status 1 when one fails
        from mmrl.checks.policy import check_policy, split_overrides

        try:
            overrides, kwargs = split_overrides(args.overrides)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        result = check_policy(args.name, overrides, **kwargs)
        print(f"policy '{args.name}' passed {len(result.passed)} contract checks" if result.ok else
              f"policy '{args.name}' FAILED {len(result.failed)} of {len(result)} contract checks: "
              f"{', '.join(result.failed)}")
        return 0 if result.ok else 1
    try:
        kwargs = _kwargs(args.overrides)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.kind == "reward":
        from mmrl.registry import REWARDS
        from mmrl.checks.reward import check_reward

        cls = REWARDS.get(args.name)
        reward = cls(**kwargs)
        passed = check_reward(reward, kind=getattr(reward, "kind", "image"))
    else:
        from mmrl.registry import SIMULATORS
        from mmrl.checks.simulator import check_simulator

        base, _, variant = args.name.partition(":")  # e.g. maniskill:PickCube-v1, gym:CartPole-v1
        cls = SIMULATORS.get(base)
        if variant:
            key = getattr(cls, "name_arg", None)
            if key is None:
                print(f"error: simulator '{base}' takes no ':' suffix", file=sys.stderr)
                return 2
            kwargs[key] = variant
        passed = check_simulator(lambda **kw: cls(**{**kwargs, **kw}))
    for name in passed:
        print(f"  ok  {name}")
    print(f"{args.kind} '{args.name}' passed {len(passed)} contract checks")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mmrl", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train an experiment config")
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.lr=1e-4")
    p.set_defaults(fn=cmd_train)
    p = sub.add_parser("eval", help="evaluate a checkpoint on held-out episodes")
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", help="checkpoint=PATH and dotted overrides")
    p.set_defaults(fn=cmd_eval)
    p = sub.add_parser("list", help="list registered components")
    p.set_defaults(fn=cmd_list)
    p = sub.add_parser("check", help="run a contract checker")
    p.add_argument("kind", help="simulator, reward or policy")
    p.add_argument("name")
    p.add_argument("overrides", nargs="*", help="constructor (policy: config) arguments key=value")
    p.set_defaults(fn=cmd_check)
    args = parser.parse_args(argv)
    from mmrl.config import ConfigError
    from mmrl.registry import MissingDependencyError, UnknownComponentError

    try:
        return args.fn(args)
    except (ConfigError, MissingDependencyError, UnknownComponentError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
