"""The Python API: the command line's ``mmrl train`` / ``mmrl eval`` as functions.

    import mmrl

    def exact(completions, answer, **kwargs):          # TRL style; dataset columns arrive as keywords
        return [float(c.strip() == str(a)) for c, a in zip(completions, answer)]

    results = mmrl.train("configs/vlm_quickstart.yaml", "trainer.iterations=20", reward=exact)
    report = mmrl.evaluate("runs/vlm_quickstart")     # the run's newest checkpoint, its own config
    policy = mmrl.load_policy("runs/vlm_quickstart")  # for inference: no simulator is built

``config`` is a YAML path, a dict or an `ExperimentConfig`; ``overrides`` are ``key=value`` strings as
on the command line. ``reward`` is any callable or `mmrl.reward.Reward`, or several: a list (TRL's
``reward_funcs``, with ``reward_weights`` a list of as many weights, 1 each by default) or a mapping
``{reward: weight}``; it replaces the config's ``reward`` section. A function defined in an importable module is
recorded in the run's config as ``module:function``, so the run resumes from any process; one
defined in ``__main__`` (a notebook, a script) is recorded under ``mmrl.api:`` and a resume needs the
same ``reward=`` again.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

#: functions given from ``__main__`` (not importable by name elsewhere), by the name the config records
USER_REWARDS: dict[str, Any] = {}


def reward_reference(obj) -> str:
    """The ``module:function`` reference a config records for ``obj``; a function that is not
    importable by name (``__main__``, a lambda, a closure) is kept in `USER_REWARDS` under one."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if module and qualname and module != "__main__" and "<" not in qualname:
        owner = sys.modules.get(module)
        if owner is not None and getattr(owner, qualname, None) is obj:
            return f"{module}:{qualname}"
    base = getattr(obj, "__name__", None) or type(obj).__name__  # what TRL logs it as: rewards/<name>/...
    base = base.replace("<", "").replace(">", "").replace(".", "_") or "reward"
    name, n = base, 1
    while USER_REWARDS.get(name, obj) is not obj:  # another function of that name was given before
        n += 1
        name = f"{base}_{n}"
    USER_REWARDS[name] = obj
    setattr(sys.modules[__name__], name, obj)  # so that import_reference("mmrl.api:name") finds it
    return f"{__name__}:{name}"


def _ref(r) -> str:
    return r if isinstance(r, str) else reward_reference(r)


def _config(config, overrides, reward, reward_weights=None):
    import yaml

    from mmrl.config import to_dict
    from mmrl.experiment import ExperimentConfig, load_experiment

    if isinstance(config, ExperimentConfig):
        data = to_dict(config)
    elif isinstance(config, dict):
        data = dict(config)
    else:
        path = Path(config)
        data = yaml.safe_load(path.read_text()) if path.is_file() else None
        if data is None:
            return load_experiment(config, overrides)  # its one-line error: file not found / empty
    if reward_weights is not None and not isinstance(reward, (list, tuple)):
        raise TypeError("reward_weights weighs a list of rewards (TRL's reward_funcs): pass reward=[f, g, ...]")
    if reward is not None:
        section = dict(data.get("reward") or {})
        if isinstance(reward, dict):
            section.update(type="weighted_sum", weights={_ref(r): w for r, w in reward.items()}, kwargs={})
        elif isinstance(reward, (list, tuple)):  # TRL: reward_funcs=[f, g], reward_weights=[1.0, 0.5]
            weights = [1.0] * len(reward) if reward_weights is None else [float(w) for w in reward_weights]
            section.update(type=[_ref(r) for r in reward], weights=weights, kwargs={})
        else:
            section.update(type=_ref(reward), kwargs={}, weights={})
        data["reward"] = section
    return load_experiment(data, overrides)


def train(config, *overrides: str, reward=None, reward_weights=None, train_dataset=None, eval_dataset=None) -> dict:
    """Train like ``mmrl train CONFIG OVERRIDES...`` (resuming the run folder's newest checkpoint);
    returns the held-out results (``{"start": {...}, "final": {...}}``).

    ``train_dataset`` / ``eval_dataset``: Hugging Face `datasets.Dataset` objects of VLM questions, as
    TRL's GRPOTrainer takes them (columns as `vlm_records` reads them: ``prompt``, ``image(s)``,
    ``answer`` or ``solution``, ...). They are saved in the run folder (``data/``, `save_to_disk`)
    and the simulator reads them from there (``sim.kwargs.dataset=vlm_records``), so the run's config
    names them and the run resumes from any process; column names go in overrides
    (``sim.kwargs.dataset_kwargs.prompt_key=problem``)."""
    from mmrl.experiment import build_trainer

    if train_dataset is not None:
        overrides = (*_saved_datasets(config, overrides, reward, train_dataset, eval_dataset), *overrides)
    elif eval_dataset is not None:
        raise TypeError("eval_dataset needs train_dataset (the questions RL trains on)")
    return build_trainer(_config(config, overrides, reward, reward_weights)).run()


def _saved_datasets(config, overrides, reward, train_dataset, eval_dataset) -> list[str]:
    """Save ``train_dataset`` (and ``eval_dataset``) as one DatasetDict in the run folder's
    ``data/`` (written aside, then renamed into place) and return the overrides that read it."""
    import importlib
    import shutil

    from mmrl.experiment import output_dir

    hf = importlib.import_module("datasets")  # Hugging Face's (the repository's datasets/ is no package)
    if not hasattr(hf, "DatasetDict"):
        raise ImportError("train_dataset= takes a Hugging Face datasets.Dataset: pip install datasets")
    DatasetDict = hf.DatasetDict
    folder = output_dir(_config(config, overrides, reward)) / "data"
    tmp = folder.with_name("data.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    splits = {"train": train_dataset, **({"eval": eval_dataset} if eval_dataset is not None else {})}
    DatasetDict(splits).save_to_disk(str(tmp))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return ["sim.kwargs.dataset=vlm_records", f"sim.kwargs.dataset_kwargs={{path: {folder.resolve()}}}"]


def evaluate(run_or_checkpoint, *overrides: str) -> dict:
    """Like ``mmrl eval RUN_OR_CHECKPOINT OVERRIDES...``: the newest complete checkpoint of a run
    folder (or the checkpoint folder given) with its own config and the training's evaluation draws;
    returns the report (also written to the run folder's ``eval_report.json``)."""
    return evaluate_checkpoint(Path(run_or_checkpoint), list(overrides))[0]


def evaluate_checkpoint(target: Path, overrides, checkpoint: str | None = None) -> tuple[dict, Path]:
    """`mmrl eval`'s work: ``target`` is a run / checkpoint folder (evaluated with its own config)
    or a config YAML (then ``checkpoint``, or the configured run's newest checkpoint). Evaluates on
    the held-out episodes with the training's evaluation draws (`run_generator`), in batches of
    ``sim.eval_num_envs`` as training does, so the number equals the training's; writes
    ``eval_report.json`` to the run folder. Returns ``(report, run folder)``."""
    from mmrl.experiment import (
        build_policy,
        build_reward,
        build_sim,
        check_device_available,
        eval_tasks,
        load_experiment,
        output_dir,
    )
    from mmrl.trainer.checkpoint import recorded_config
    from mmrl.trainer.evaluation import evaluate_suite, load_checkpoint_policy, resolve_checkpoint, run_folder_of
    from mmrl.trainer.trainer import run_generator
    from mmrl.utils import jsonio

    target = Path(target)
    # a run or checkpoint folder: its own config
    if target.is_dir() or target.name in ("state.pt", "model.safetensors"):
        path = resolve_checkpoint(str(target), target)
        cfg = load_experiment(recorded_config(path), overrides)
        out = run_folder_of(path)
    else:
        cfg = load_experiment(target, overrides)
        path = resolve_checkpoint(checkpoint, output_dir(cfg))  # checked before any simulator is built
        # the report (and videos) go with the checkpoint evaluated, never into another run's folder
        out = run_folder_of(path) if checkpoint else output_dir(cfg)
    check_device_available("run.device", cfg.run.device)
    tasks = eval_tasks(cfg)
    t, seed = cfg.trainer, cfg.run.seed + 1

    def make_sim(task, num_envs):
        return build_sim(cfg, num_envs, seed, evaluation=True, task=task)

    probe = make_sim(tasks[0], 1)  # shapes for the policy; one env, closed at once
    policy = build_policy(cfg, probe)
    probe.close()
    load_checkpoint_policy(path, policy, cfg)
    gen = run_generator(cfg.run.seed, "eval", 0, cfg.run.device)  # the draws of the training's evaluations
    report = evaluate_suite(
        policy,
        make_sim,
        tasks,
        t.eval_episodes,
        t.eval_seed,
        gen,
        out / "videos" if t.video_episodes else None,
        t.video_episodes,
        max_envs=cfg.sim.eval_num_envs,
        reward=build_reward(cfg),
        audit=cfg.reward is not None and cfg.reward.audit.enabled,
    )
    report["checkpoint"] = str(path)
    out.mkdir(parents=True, exist_ok=True)
    jsonio.write_json(out / "eval_report.json", report)
    return report, out


def load_policy(run_or_checkpoint, device: str = "cpu"):
    """The trained policy of a run folder's newest complete checkpoint (or of the checkpoint folder
    given, or of a folder `mmrl export` wrote in mmrl's format), in eval mode on ``device``, built
    from the spec the checkpoint stores: no simulator is built (a LIBERO policy loads without
    LIBERO's assets), and only safetensors are read (nothing unpickled)."""
    import json

    from mmrl.trainer.evaluation import resolve_checkpoint
    from mmrl.utils.weights import load_weights

    target = Path(run_or_checkpoint)
    if (target / "mmrl_policy.json").is_file() and (target / "model.safetensors").is_file():  # `mmrl export`
        return build_from_spec(
            load_weights(target / "model.safetensors")[0],
            json.loads((target / "mmrl_policy.json").read_text()),
            target,
            device,
        )
    return policy_from_checkpoint(resolve_checkpoint(str(target), target), device)


def policy_from_checkpoint(path: Path, device: str = "cpu"):
    """`load_policy` of a checkpoint folder already resolved and verified (`resolve_checkpoint`)."""
    from mmrl.trainer import checkpoint as ckpt

    weights, spec = ckpt.read_weights(path)  # model.safetensors: nothing unpickled
    return build_from_spec(weights, spec, path, device, source=ckpt.source_of(path))


def build_from_spec(weights: dict, spec: dict | None, path: Path, device: str = "cpu", source: dict | None = None):
    """The policy ``spec`` (`mmrl.experiment.build_policy`'s ``build_spec``) describes, holding
    ``weights`` (read from ``path``; ``source``: the weights left to its pretrained files, see
    `mmrl.trainer.checkpoint.load_into`), in eval mode on ``device``."""
    from mmrl.config import load_config
    from mmrl.errors import UserError
    from mmrl.policies.base import PolicyConfig
    from mmrl.registry import POLICIES
    from mmrl.trainer.checkpoint import load_into

    if not spec:
        raise UserError(
            f"checkpoint {path} was written before checkpoints stored how to rebuild their policy: "
            "build it with its simulator (mmrl.experiment.build_policy) and load_state_dict, or "
            "resume the run once to write a new checkpoint"
        )
    config = load_config(PolicyConfig, spec["config"])
    policy = POLICIES.get(spec["type"])(config, action_dim=spec["action_dim"], state_dim=spec["state_dim"])
    load_into(policy, weights, source, where=f"checkpoint {path}")
    policy.build_spec = spec
    return policy.to(device).eval()
