"""Command line: ``mmrl train|eval|export|list|config|init|check``.

mmrl train configs/quickstart.yaml [key=value ...]     train (resumes from the run's last checkpoint)
mmrl eval RUN_OR_CHECKPOINT [key=value ...]            evaluate a run's newest checkpoint with its own config
mmrl eval configs/quickstart.yaml checkpoint=PATH [key=value ...]
mmrl export RUN --to DIR [--adapter] [--push-to-hub REPO]  a trained policy in its family's format + card
mmrl list                                              every registered component, objective and flow sampler
mmrl estimate CONFIG [key=value ...] [--world-size N] [--gpu-memory 80GiB] [--json]
                                                       the memory plan per device, before any work
mmrl config show CONFIG [key=value ...]                the resolved config, every default filled in
mmrl config keys [PREFIX]                              every config key: type, default and what it does
mmrl init [NAME]                                       write an example config (configs/NAME.yaml) into this folder
mmrl --version
mmrl check simulator NAME[:TASK] [key=value ...]       run the simulator contract checker
mmrl check reward NAME [key=value ...]                 run the reward contract checker
mmrl check reward NAME labelled=FILE [heldout=NAME]    ... then how it tracks success on a labelled sample
mmrl check policy NAME [key=value ...]                 run the policy contract checker on its tiny config
                                                       (policy config keys; sim=NAME, sim.KEY=VALUE)
"""

from __future__ import annotations

import argparse
import errno
import sys


def _split_checkpoint(overrides: list[str]) -> tuple[str | None, list[str]]:
    ckpt, rest = None, []
    for item in overrides:
        if item.startswith("checkpoint="):
            ckpt = item.split("=", 1)[1]
        else:
            rest.append(item)
    return ckpt, rest


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: the run stops where it is and says how to resume."""


def _terminate(signum, frame):
    raise Terminated()


def cmd_train(args) -> int:
    import signal
    from pathlib import Path

    from mmrl import distributed
    from mmrl.experiment import build_trainer, load_experiment
    from mmrl.utils import jsonio

    if args.config is None or ("=" in args.config and not Path(args.config).exists()):
        from mmrl.errors import UserError

        got = "" if args.config is None else f", before its overrides (got {args.config!r} first)"
        raise UserError(
            f"mmrl train needs an experiment config{got}: mmrl train configs/quickstart.yaml [key=value ...] "
            "(mmrl init quickstart writes one here)"
        )
    cfg = load_experiment(args.config, args.overrides)
    if cfg.placement.train_ranks > 1 and not distributed.launched().distributed:  # Ray starts the ranks
        from mmrl.experiment import check_ranks
        from mmrl.ray_train import train_on_ray

        check_ranks(cfg, distributed.Ranks(world=cfg.placement.train_ranks))  # one line, before Ray starts
        from mmrl.planning.estimate import check_plan

        check_plan(cfg, cfg.placement.train_ranks)  # the memory plan fits, before Ray starts
        cfg.placement.check_backend()
        print(jsonio.dumps(train_on_ray(args.config, list(args.overrides), cfg)))
        return 0
    signal.signal(signal.SIGTERM, _terminate)
    trainer = None
    try:
        trainer = build_trainer(cfg)
        results = trainer.run()  # ends with its summary line (metric before / after, folder)
    except KeyboardInterrupt as exc:
        what = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
        if trainer is None:
            print(f"{what} before training started; nothing was lost", file=sys.stderr)
        else:
            print(
                f"{what} at iteration {trainer.state.iteration}; newest complete checkpoint: "
                f"{trainer.newest_checkpoint()}; run the same command to resume",
                file=sys.stderr,
            )
        return 143 if isinstance(exc, Terminated) else 130
    if distributed.current().main:
        print(jsonio.dumps(results))
    return 0


def cmd_eval(args) -> int:
    from pathlib import Path

    from mmrl.api import evaluate_checkpoint
    from mmrl.utils import jsonio

    ckpt, overrides = _split_checkpoint(args.overrides)
    target = Path(args.config)
    if not target.exists() and target.suffix not in (".yaml", ".yml"):
        print(f"error: nothing at {target}: pass a run folder, a checkpoint folder or a config YAML", file=sys.stderr)
        return 2
    if (target.is_dir() or target.name in ("state.pt", "model.safetensors")) and ckpt:
        print(
            "error: give the checkpoint once: `mmrl eval RUN_OR_CHECKPOINT [key=value ...]`, or "
            "`mmrl eval CONFIG checkpoint=PATH`",
            file=sys.stderr,
        )
        return 2
    report, out = evaluate_checkpoint(target, overrides, checkpoint=ckpt)
    for row in report["tasks"]:
        label = row.get("instruction") or ("as configured" if row["task"] is None else row["task"])
        print(f"  {row['success_rate']:6.3f}  ({row['episodes']} episodes)  {label}")
    for name, row in report.get("suites", {}).items():
        print(f"  {row['success_rate']:6.3f}  ({row['episodes']} episodes)  suite {name}")
    for dim, rows in report.get("breakdown", {}).items():  # where the policy fails: success per label
        for label, row in rows.items():
            print(f"  {row['success_rate']:6.3f}  ({row['episodes']} episodes)  {dim} = {label}")
    audit = report.get("reward_audit")
    if audit is not None:  # how the trained reward tracked success (and the held-out reward) here
        parts = [f"reward '{audit['reward']}' mean {_fmt(audit['mean'])}"]
        if "auc_success" in audit:
            parts.append(f"correlation with success {audit['corr_success']:.3f}, AUC {audit['auc_success']:.3f}")
        if "heldout_mean" in audit:
            parts.append(f"held-out '{audit['heldout']}' mean {_fmt(audit['heldout_mean'])}")
        print("  " + "; ".join(parts))
    print(
        f"overall success {report['success_rate']:.3f} over {report['episodes']} episodes; "
        f"report: {out / 'eval_report.json'}"
    )
    print(jsonio.dumps(report))
    return 0


def cmd_estimate(args) -> int:
    """``mmrl estimate CONFIG [key=value ...]``: the memory plan per device (`mmrl.planning`), exit
    status 0 when it fits, 1 when it does not."""
    import json

    from mmrl.experiment import load_experiment
    from mmrl.planning.estimate import NotPlanned, device_memory_of, parse_bytes, plan_experiment
    from mmrl.planning.memory import as_json, render

    cfg = load_experiment(args.config, args.overrides)
    if args.world_size is not None and args.world_size < 1:
        print(f"error: --world-size {args.world_size}: give a number of training ranks >= 1", file=sys.stderr)
        return 2
    if args.gpu_memory is not None:
        try:
            memory = parse_bytes(args.gpu_memory)
        except ValueError as exc:
            print(f"error: --gpu-memory: {exc}", file=sys.stderr)
            return 2
    else:
        memory = device_memory_of(cfg) or parse_bytes(DEFAULT_GPU_MEMORY)
    try:
        plan = plan_experiment(cfg, memory, args.world_size)
    except NotPlanned as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(as_json(plan)) if args.json else render(plan))
    return 0 if plan.fits else 1


DEFAULT_GPU_MEMORY = "80GiB"  # what `mmrl estimate` plans for without --gpu-memory, run.gpu_memory or a GPU here


def cmd_config(args) -> int:
    """``mmrl config show CONFIG [key=value ...]``: the resolved config (every key, defaults filled in),
    as YAML that ``mmrl train`` reads back; ``mmrl config keys [PREFIX]``: every key with its type,
    default and what it does."""
    import yaml

    from mmrl.config import config_keys, to_dict
    from mmrl.experiment import ExperimentConfig, load_experiment

    if args.action == "show":
        if not args.rest:
            print("error: mmrl config show needs a config: mmrl config show CONFIG [key=value ...]", file=sys.stderr)
            return 2
        cfg = load_experiment(args.rest[0], args.rest[1:])
        print(yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=False), end="")
        return 0
    prefix = args.rest[0] if args.rest else ""
    lines = [ln for ln in config_keys(ExperimentConfig, with_help=True) if ln.startswith(prefix)]
    if not lines:
        print(
            f"error: no config key starts with {prefix!r}; sections: run, sim, reward, policy, warm_start, "
            "algorithm, trainer, placement",
            file=sys.stderr,
        )
        return 2
    print("\n".join(lines))
    return 0


def cmd_export(args) -> int:
    from mmrl.export import export

    out = export(
        args.run,
        args.to,
        merge=not args.adapter,
        push_to_hub=args.push_to_hub,
        private=not args.public,
        force=args.force,
    )
    pushed = f" and pushed to https://huggingface.co/{args.push_to_hub}" if args.push_to_hub else ""
    print(f"exported to {out}{pushed}")
    return 0


def cmd_init(args) -> int:
    from mmrl.examples import example_names, write_example

    if not args.name:
        print("example configs (mmrl init NAME):")
        for name in example_names():
            print(f"  {name}")
        return 0
    target = write_example(args.name, args.to, args.force)
    print(f"wrote {target}; train it with: mmrl train {target}")
    return 0


def cmd_list(args) -> int:
    for kind, rows in list_sections().items():
        print(f"{kind}:")
        for name, desc in rows:
            print(f"  {name:<24} {desc}".rstrip())
    return 0


def list_sections() -> dict[str, list[tuple[str, str]]]:
    """What ``mmrl list`` shows (and the components reference page): every registry's names with
    their one-line descriptions, and the flow sampler choices a config selects by name."""
    from mmrl.flow import mean_path, steps
    from mmrl.registry import ALL, _first_line

    sections = {kind: registry.describe() for kind, registry in ALL.items()}
    # choices a config selects by name that are not registries
    sections["flow samplers (policy.method, policy.eval_method)"] = [
        (m, _first_line(getattr(steps, f"{m}_step"))) for m in steps.STEP_METHODS
    ] + [("mean", "policy.eval_method only: " + _first_line(mean_path))]
    sections["flow stochastic steps (policy.stochastic)"] = [
        ("all", "every denoising step"),
        ("one", "one random step per sample, ODE elsewhere"),
        ("window", "the steps of policy.window, ODE elsewhere"),
    ]
    return sections


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
        print(
            f"policy '{args.name}' passed {len(result.passed)} contract checks"
            if result.ok
            else f"policy '{args.name}' FAILED {len(result.failed)} of {len(result)} contract checks: "
            f"{', '.join(result.failed)}"
        )
        return 0 if result.ok else 1
    try:
        kwargs = _kwargs(args.overrides)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from mmrl.experiment import constructor_arguments

    def unknown(cls, what: str, exclude=()) -> str | None:
        allowed = constructor_arguments(cls, exclude)
        bad = [k for k in kwargs if allowed is not None and k not in allowed]
        wrap = getattr(cls, "passthrough_arg", None)
        hint = (
            (
                f'; arguments of what it wraps go under {wrap}: "{wrap}={{'
                + ", ".join(f"{k}: {kwargs[k]!r}" for k in bad)
                + '}"'
            )
            if bad and wrap
            else ""
        )
        return (
            (
                f"error: {', '.join(map(repr, bad))} {'is not an argument' if len(bad) == 1 else 'are not arguments'} "
                f"of {what} '{args.name}'{hint}. Valid: {', '.join(allowed or []) or 'none'}"
            )
            if bad
            else None
        )

    # the audit on a labelled sample: how the reward tracks success (and a held-out reward) there
    labelled, heldout = (
        (kwargs.pop("labelled", None), kwargs.pop("heldout", None)) if args.kind == "reward" else (None, None)
    )
    if heldout is not None and labelled is None:
        print(
            "error: heldout=NAME is scored beside the reward on a labelled sample: add labelled=FILE", file=sys.stderr
        )
        return 2
    if args.kind == "reward" and ":" in args.name:  # a function, as reward.type takes it (TRL style)
        from mmrl.checks.reward import check_reward
        from mmrl.trainer.reward_stage import reward_model

        kind = kwargs.pop("kind", "text")
        if kind not in ("text", "image", "video"):
            print(
                f"error: kind={kind!r}: a function reward scores 'text' (completions), 'image' or 'video'",
                file=sys.stderr,
            )
            return 2
        try:
            reward = reward_model(args.name, kwargs, kind)
        except (ValueError, TypeError) as exc:  # a reference that does not import, a non-callable
            print(f"error: {exc}", file=sys.stderr)
            return 2
        try:
            passed = check_reward(reward, kind=kind)
        except AssertionError as exc:  # user code that failed a check: its one line, as `check policy` says it
            print(f"reward '{args.name}' FAILED {exc}", file=sys.stderr)
            return 1
    elif args.kind == "reward":
        from mmrl.checks.reward import check_reward
        from mmrl.registry import REWARDS

        cls = REWARDS.get(args.name)
        problem = unknown(cls, "reward")
        if problem:
            print(problem, file=sys.stderr)
            return 2
        reward = cls(**kwargs)
        passed = check_reward(reward, kind=getattr(reward, "kind", "image"))
    else:
        from mmrl.checks.simulator import check_simulator
        from mmrl.registry import SIMULATORS

        base, _, variant = args.name.partition(":")  # e.g. maniskill:PickCube-v1, gym:CartPole-v1
        cls = SIMULATORS.get(base)
        if variant:
            key = getattr(cls, "name_arg", None)
            if key is None:
                print(f"error: simulator '{base}' takes no ':' suffix", file=sys.stderr)
                return 2
            kwargs[key] = variant
        problem = unknown(cls, "simulator")
        if problem:
            print(problem, file=sys.stderr)
            return 2
        try:
            passed = check_simulator(lambda **kw: cls(**{**kwargs, **kw}))
        except AssertionError as exc:  # a contract check that failed: its one line names the check
            print(f"simulator '{args.name}' FAILED {exc}", file=sys.stderr)
            return 1
        except Exception as exc:
            from mmrl.rollout import is_plugin

            if not is_plugin(cls):
                raise  # mmrl's own adapter: a bug, whose traceback helps
            print(
                f"simulator '{args.name}' FAILED: {cls.__module__}.{cls.__qualname__} raised {type(exc).__name__}: "
                f"{str(exc).strip()[:300]} during its contract checks",
                file=sys.stderr,
            )
            return 1
    for name in passed:
        print(f"  ok  {name}")
    print(f"{args.kind} '{args.name}' passed {len(passed)} contract checks")
    if labelled is not None:
        return _labelled_audit(args.name, reward, labelled, heldout)
    return 0


def _labelled_audit(name: str, reward, labelled: str, heldout: str | None) -> int:
    """`mmrl check reward NAME labelled=FILE [heldout=NAME]`: the reward audit on a labelled sample,
    one readable line and one JSON line (`mmrl.checks.reward.labelled_audit`)."""
    import json

    from mmrl.checks.reward import labelled_audit, load_labelled
    from mmrl.trainer.reward_stage import reward_model

    try:
        data = load_labelled(labelled, reward.kind)
        held = reward_model(heldout, {}, reward.kind) if heldout else None
    except (ValueError, TypeError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = labelled_audit(reward, data, held)
    line = (
        f"reward '{name}' on {out['n']} labelled samples ({labelled}, success share {out['success_share']:.3f}): "
        f"correlation with success {out['corr_success']:.3f}, AUC {out['auc_success']:.3f}, mean "
        f"{_fmt(out['mean_success'])} on successes and {_fmt(out['mean_failure'])} on failures"
    )
    if held is not None:
        line += f"; held-out '{heldout}' mean {_fmt(out['heldout_mean'])}, correlation {out['corr_heldout']:.3f}"
    print(line)
    print(json.dumps({"reward": name, "labelled": str(labelled), **({"heldout": heldout} if heldout else {}), **out}))
    return 0


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.4g}"


OVERRIDING = ("train", "eval")  # commands whose trailing arguments are dotted config overrides
#: flags of ``mmrl estimate`` that ``mmrl train`` takes too, as the config keys they set
FLAG_KEYS = {"gpu-memory": "run.gpu_memory", "gpu_memory": "run.gpu_memory"}
KEEP = ("-h", "--help", "--version")


def dotted_overrides(argv: list[str]) -> list[str]:
    """``--key=value`` and ``--key value`` after ``train`` / ``eval`` as the overrides ``key=value``
    (the spelling of TRL's, accelerate's and LeRobot's command lines)."""
    if not argv or argv[0] not in OVERRIDING:
        return argv
    out, i = [argv[0]], 1
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--") and arg not in KEEP and len(arg) > 2:
            key, eq, value = arg[2:].partition("=")
            if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                value, i = argv[i + 1], i + 1
            elif not eq:
                value = "true"  # a bare flag, as --gradient_checkpointing is
            arg = f"{FLAG_KEYS.get(key, key)}={value}"
        out.append(arg)
        i += 1
    return out


def flags_last(argv: list[str]) -> list[str]:
    """``mmrl estimate``'s flags moved after its overrides, so ``--world-size 4 key=value`` parses
    (argparse takes no positional after an option once the positionals started)."""
    if not argv or argv[0] != "estimate":
        return argv
    head, flags, i = [argv[0]], [], 1
    while i < len(argv):
        arg = argv[i]
        if arg in ("--world-size", "--gpu-memory") and i + 1 < len(argv):
            flags += argv[i : i + 2]
            i += 2
            continue
        (flags if arg.startswith("--") else head).append(arg)
        i += 1
    return head + flags


def main(argv: list[str] | None = None) -> int:
    argv_now = flags_last(dotted_overrides(sys.argv[1:] if argv is None else list(argv)))
    args = build_parser(argv_now).parse_args(argv_now)
    return run_command(args)


def build_parser(argv_now: list[str] | None = None) -> argparse.ArgumentParser:
    """The ``mmrl`` argument parser (also what the CLI reference page is generated from).
    ``argv_now``: the arguments about to be parsed, which decide whether the long help texts
    (every config key for ``train --help``, the export formats) are built."""
    argv_now = argv_now or []
    parser = argparse.ArgumentParser(
        prog="mmrl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    from mmrl.version import __version__

    parser.add_argument("--version", action="version", version=f"mmrl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    wants_help = bool(argv_now) and argv_now[0] == "train" and ("-h" in argv_now or "--help" in argv_now)
    p = sub.add_parser(
        "train",
        help="train an experiment config",
        epilog=_train_epilog() if wants_help else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("config", nargs="?", help="an experiment YAML (configs/*.yaml)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.lr=1e-4 (keys below)")
    p.set_defaults(fn=cmd_train)
    p = sub.add_parser("eval", help="evaluate a checkpoint on held-out episodes")
    p.add_argument(
        "config",
        help="a run folder or checkpoint folder (evaluated with its own config and the "
        "training's evaluation draws), or a config YAML (then checkpoint=PATH)",
    )
    p.add_argument("overrides", nargs="*", help="checkpoint=PATH and dotted overrides")
    p.set_defaults(fn=cmd_eval)
    p = sub.add_parser(
        "export",
        help="write a trained policy in its family's format (transformers / peft, "
        "LeRobot, diffusers, safetensors) with a model card; optionally push it "
        "to the hub",
        description=_export_doc() if argv_now[:1] == ["export"] else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run", help="a run folder (its newest complete checkpoint) or a checkpoint folder")
    p.add_argument("--to", required=True, help="the folder to write (new or empty; see --force)")
    p.add_argument(
        "--force", action="store_true", help="write into a non-empty folder (never one inside a run's checkpoints)"
    )
    p.add_argument(
        "--adapter",
        action="store_true",
        help="a LoRA run (VLM, SD3 / FLUX): the adapter alone (peft / diffusers LoRA), not merged",
    )
    p.add_argument("--push-to-hub", metavar="REPO", help="upload the folder to this hub repo (user/name)")
    p.add_argument("--public", action="store_true", help="with --push-to-hub: a public repo (default private)")
    p.set_defaults(fn=cmd_export)
    p = sub.add_parser(
        "estimate",
        help="the memory plan per device (weights, gradients, optimizer, reference, rollout, activations) "
        "and whether it fits, before any work; exit status 1 when it does not",
    )
    p.add_argument("config", help="an experiment YAML (configs/*.yaml)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algorithm.minibatch_size=8")
    p.add_argument("--world-size", type=int, help="training ranks (default: placement.train_ranks)")
    p.add_argument(
        "--gpu-memory",
        help=f"memory per device, e.g. 80GiB or 24GB (default: run.gpu_memory, else this machine's GPU, "
        f"else {DEFAULT_GPU_MEMORY})",
    )
    p.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    p.set_defaults(fn=cmd_estimate)
    p = sub.add_parser("config", help="show a resolved config, or every config key with its default and help")
    p.add_argument("action", choices=["show", "keys"], help="show CONFIG [key=value ...] | keys [PREFIX]")
    p.add_argument("rest", nargs="*", help="show: CONFIG and its dotted overrides; keys: an optional key PREFIX")
    p.set_defaults(fn=cmd_config)
    p = sub.add_parser("list", help="list registered components")
    p.set_defaults(fn=cmd_list)
    p = sub.add_parser("init", help="write an example experiment config into this folder (mmrl init quickstart)")
    p.add_argument("name", nargs="?", help="the example (without a name: the list)")
    p.add_argument("--to", default=".", help="the folder (or .yaml path) to write it to")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.set_defaults(fn=cmd_init)
    p = sub.add_parser("check", help="run a contract checker")
    p.add_argument("kind", help="simulator, reward or policy")
    p.add_argument(
        "name", help="the registered name (mmrl list); simulators take NAME:TASK, rewards also path/file.py:function"
    )
    p.add_argument(
        "overrides",
        nargs="*",
        help="constructor (policy: config) arguments key=value; a function reward (path/file.py:fn): "
        "kind=text|image|video and its bound keywords",
    )
    p.set_defaults(fn=cmd_check)
    return parser


def run_command(args: argparse.Namespace) -> int:
    """Run a parsed command; a user's error is one line on stderr and exit status 2."""
    from mmrl.config import ConfigError
    from mmrl.errors import UserError
    from mmrl.registry import MissingDependencyError, UnknownComponentError
    from mmrl.reward import RewardError
    from mmrl.trainer.checkpoint import CheckpointError

    try:
        return args.fn(args)
    except (ConfigError, MissingDependencyError, UnknownComponentError, UserError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RewardError as exc:
        if not isinstance(exc.__cause__, RewardError):  # a bug in a reward's code: its traceback helps
            raise
        # the reward's own one-line error (e.g. a reward server that does not answer)
        resume = (
            "; the newest complete checkpoint is kept: run the same command to resume"
            if args.command == "train"
            else ""
        )
        print(f"error: {exc}{resume}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno not in _USER_ERRNOS:
            raise
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"error: {exc.strerror or exc}{where}: {_USER_ERRNOS[exc.errno]}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _export_doc() -> str:
    from mmrl import export

    return export.__doc__


def _train_epilog() -> str:
    """Every config key with its type and default (``mmrl config keys`` adds what each does)."""
    from mmrl.config import config_keys
    from mmrl.experiment import ExperimentConfig

    return (
        "config keys (KEY: TYPE = DEFAULT; `mmrl config keys [PREFIX]` explains each, "
        "`mmrl config show CONFIG` prints a resolved config):\n  " + "\n  ".join(config_keys(ExperimentConfig))
    )


_USER_ERRNOS = {  # OS errors a user fixes on the machine, and how
    errno.ENOSPC: "free some space and run the same command again (a training run resumes from its newest "
    "complete checkpoint)",
    errno.EDQUOT: "free some space under your quota and run the same command again",
    errno.EACCES: "fix the permissions or point run.output_dir / the path elsewhere",
    errno.EROFS: "the file system is read-only: point run.output_dir / the path at a writable folder",
}


if __name__ == "__main__":
    sys.exit(main())
