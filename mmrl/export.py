"""``mmrl export RUN --to DIR``: a trained policy out of mmrl, in the format its family's tools load,
with a model card (``README.md``: the config, the held-out results) and optionally pushed to the
Hugging Face hub.

- VLM: a transformers folder (LoRA merged; ``AutoModelForImageTextToText.from_pretrained(DIR)``), or
  with ``--adapter`` the peft adapter alone (``PeftModel.from_pretrained(base, DIR)``);
- LeRobot VLAs (SmolVLA, PI0, PI05): LeRobot's checkpoint format (``<Family>Policy.from_pretrained``);
- diffusion generators on SD3 / FLUX: a diffusers pipeline folder (LoRA fused into the transformer;
  ``StableDiffusion3Pipeline`` / ``FluxPipeline.from_pretrained(DIR)``), or with ``--adapter`` the
  LoRA alone (``pytorch_lora_weights.safetensors``; ``pipe.load_lora_weights(DIR)`` on the base
  pipeline);
- every other family: ``model.safetensors`` + ``mmrl_policy.json`` (``mmrl.load_policy(DIR)``).

No simulator is built (`mmrl.load_policy`).
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml


def model_card(
    run_name: str,
    family: str,
    fmt: str,
    config_yaml: str,
    results: dict | None,
    base_model: str | None,
    iteration: int | None = None,
) -> str:
    """The ``README.md`` of an exported policy: hub front matter, how to load it, the held-out
    results and the config it was trained with. ``iteration``: the exported checkpoint's; only the
    evaluations made up to it are shown (a run's final results are not an older checkpoint's)."""
    library = {
        "transformers": "transformers",
        "peft adapter": "peft",
        "lerobot": "lerobot",
        "diffusers": "diffusers",
        "diffusers lora": "diffusers",
    }.get(fmt, "mmrl")
    front = ["---", f"library_name: {library}", "tags:", "- mmrl", "- reinforcement-learning", f"- {family}"]
    if library == "diffusers":
        front += ["- text-to-image", *(["- lora"] if fmt == "diffusers lora" else [])]
    if base_model:
        front.append(f"base_model: {base_model}")
    lines = [
        *front,
        "---",
        "",
        f"# {run_name}",
        "",
        f"A `{family}` policy RL-fine-tuned with mmrl {_version()}, exported as **{fmt}**.",
        "",
    ]
    if results and iteration is not None:
        results = {k: v for k, v in results.items() if isinstance(v, dict) and v.get("iteration", 0) <= iteration}
    if iteration is not None and not any(r.get("iteration") == iteration for r in (results or {}).values()):
        lines += [f"This checkpoint (RL iteration {iteration}) was not evaluated when it was trained.", ""]
    if results:
        lines += [
            "## Held-out evaluation",
            "",
            "| evaluation | success | return | episodes | RL iterations |",
            "|---|---|---|---|---|",
        ]
        for name, row in results.items():
            lines.append(
                f"| {name} | {row.get('success_rate', float('nan')):.4f} "
                f"| {row.get('return', float('nan')):.4f} "
                f"| {row.get('episodes', '')} | {row.get('iteration', '')} |"
            )
        lines.append("")
    lines += ["## Training config", "", "```yaml", config_yaml.rstrip(), "```", ""]
    return "\n".join(lines)


ADAPTER_FORMATS = ("peft adapter", "diffusers lora")  # what --adapter (merge=False) writes for a LoRA run


def _iteration(checkpoint: Path) -> int | None:
    """The RL iteration checkpoint folder ``checkpoint`` was saved at (its ``COMPLETE`` marker)."""
    from mmrl.trainer import checkpoint as ckpt

    try:
        return int(json.loads((Path(checkpoint) / ckpt.MARKER).read_text())["iteration"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _version() -> str:
    from mmrl.version import __version__

    return __version__


def check_target(to: Path, force: bool = False) -> None:
    """Refuse, before anything is read or written, an export target that would lose work: a file,
    any folder inside a run's checkpoints (or a checkpoint folder), or a non-empty folder unless
    ``force`` (then files of the same names are replaced)."""
    from mmrl.errors import UserError
    from mmrl.trainer import checkpoint as ckpt

    to = Path(to)
    if to.exists() and not to.is_dir():
        raise UserError(f"--to {to} is a file, not a folder: give a new or empty folder to export into")
    for folder in (to.resolve(), *to.resolve().parents):
        inside = folder.name == "checkpoints" and any(folder.glob("*iter_*"))
        if inside or (folder / ckpt.MARKER).exists() or (folder / ckpt.STATE).exists():
            raise UserError(
                f"--to {to} is inside a run's checkpoints ({folder}): exporting there would overwrite a "
                "checkpoint's files; give a folder outside the run's checkpoints/"
            )
    if to.is_dir() and any(to.iterdir()) and not force:
        raise UserError(
            f"--to {to} is a folder that is not empty: give a new or empty folder, or add --force to write "
            "into it (files of the same names are replaced)"
        )


def _disk_full_or(exc: BaseException, to: Path, path: Path) -> BaseException:
    """The one line for a full disk while exporting checkpoint ``path`` to ``to``, else ``exc`` itself."""
    from mmrl.errors import UserError
    from mmrl.utils.durable import disk_full

    if not disk_full(exc, to):
        return exc
    return UserError(
        f"no space left on the device of {to} while exporting {path.name}; the run and its checkpoints are "
        f"untouched, {to} holds a partial export: free some space and run the same command with --force"
    )


def export(
    run_or_checkpoint,
    to,
    merge: bool = True,
    push_to_hub: str | None = None,
    private: bool = True,
    force: bool = False,
) -> Path:
    """Export the newest complete checkpoint of a run folder (or the checkpoint folder given) to
    ``to`` (new or empty, or any folder outside a run's checkpoints with ``force``); with
    ``push_to_hub`` (``user/repo``) upload the folder too. Returns ``to``."""
    from mmrl.api import policy_from_checkpoint
    from mmrl.trainer.checkpoint import recorded_config
    from mmrl.trainer.evaluation import resolve_checkpoint, run_folder_of

    check_target(Path(to), force)
    target = Path(run_or_checkpoint)
    path = resolve_checkpoint(str(target), target)
    config = recorded_config(path)
    policy = policy_from_checkpoint(path)
    to = Path(to)
    try:
        fmt = policy.export_pretrained(to, merge=merge)
    except Exception as exc:  # OSError, safetensors' SafetensorError, torch's RuntimeError, ...
        raise _disk_full_or(exc, to, path) from None
    if not merge and fmt not in ADAPTER_FORMATS:  # --adapter: said, not silently ignored
        print(f"note: --adapter wrote the whole model ({fmt}): {target} trained no LoRA adapter (a full fine-tune)")
    run_dir = run_folder_of(path)
    results = json.loads((run_dir / "results.json").read_text()) if (run_dir / "results.json").exists() else None
    spec = policy.build_spec
    base = spec["config"].get("model") or spec["config"].get("pretrained")
    # a hub id only (not a local folder, not mmrl's tiny test models)
    base = base if isinstance(base, str) and not base.startswith("tiny") and not Path(base).exists() else None
    card = model_card(
        run_dir.name,
        spec["type"],
        fmt,
        yaml.safe_dump(config, sort_keys=False, default_flow_style=False),
        results,
        base,
        _iteration(path),
    )
    try:
        (to / "README.md").write_text(card)
    except OSError as exc:
        raise _disk_full_or(exc, to, path) from None
    if push_to_hub:
        from huggingface_hub import HfApi

        api = HfApi()
        api.create_repo(push_to_hub, private=private, exist_ok=True)
        api.upload_folder(
            folder_path=str(to), repo_id=push_to_hub, commit_message=f"mmrl export of {run_dir.name} ({path.name})"
        )
    return to
