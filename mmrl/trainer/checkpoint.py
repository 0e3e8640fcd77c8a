"""Checkpoints: the policy's weights in safetensors; optimizer, RNG states and counters beside them.

Layout: ``OUT/checkpoints/iter_000010/{model.safetensors, state.pt, config.yaml, COMPLETE}``, and
``OUT/checkpoints/latest`` naming the newest one (for people and tools; resume does not trust it).
``model.safetensors`` holds the policy's state dict (tied weights written once; the build spec that
`mmrl.load_policy` rebuilds the policy from is in its metadata), so the weights load without
unpickling anything (`read_weights`, ``safetensors.torch.load_file``). ``state.pt`` holds what only
resuming needs: the optimizer, the torch / numpy / python RNG states, the counters, the trainer's
other state (episodes in progress, whose simulator snapshots are arbitrary Python objects).

Frozen pretrained weights are not written (as TRL / peft checkpoints hold a LoRA run's adapter
alone): the parameters without gradient that are still, untouched, the tensors the policy was built
with (`mark_source`, `unchanged_source`; a KL reference refreshed after the warm start is written)
are left to the policy's source, and ``model.safetensors``'s metadata keeps a fingerprint of each.
Loading rebuilds the policy from its config, which reloads them, and checks the fingerprints
(`load_into`): a base model whose files changed since is refused, naming the weights. A tiny VLM's
LoRA checkpoint holds its 35,840 trained weights of 190,464 (a 7B model's, the adapter instead of
14 GB of bf16 base weights).

Durability: no kill at any instant and no power loss leaves a run without its newest complete
checkpoint. A checkpoint is written to a temporary folder, every file and the folder fsynced, and
``COMPLETE`` (the sha256 and size of each file) written last; then it is renamed into place.
Saving an iteration a second time (the final save after a periodic one) first renames the old
folder to ``.iter_N.replaced`` and deletes it only after the new one is in place, so the iteration
exists, complete, at every instant. Old checkpoints are deleted only after the new one is durable,
and only ones of earlier iterations. Resume (`load_latest`) scans the folder, takes the newest
checkpoint that verifies, says which, and falls back past a corrupt one naming it; it also cuts
``metrics.jsonl`` back to its length at that save (recorded in ``state.pt``), so rows logged after
the save, such as an evaluation between two saves of one iteration, are logged once when redone.
``COMPLETE`` also records the config the checkpoint was trained with (`recorded_config`), and the
sha256 of ``config.yaml``, which is a copy for people to read: an edited or broken ``config.yaml`` is
said and never trusted, and never blocks a resume whose weights are intact.
Every step of a save is a named fault point (`mmrl.utils.faults`) that tests kill the process at.

With N ranks rank 0 writes the checkpoint; an engine whose ranks each hold their own part of the
optimizer state (`TrainEngine.write_own_state`) has every rank write it into the temporary folder
(`begin`) before rank 0's `save`, after a barrier, lists those files under ``COMPLETE`` with the
rest: no checkpoint is complete without every rank's part. DeepSpeed ZeRO on N ranks writes
``optimizer.rankNNNNN.pt`` (`write_shard`); FSDP2 ``optimizer/`` in `torch.distributed.checkpoint`'s
format (a ``.distcp`` file per rank and ``.metadata``), which loads at any world size.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from mmrl import distributed
from mmrl.trainer.logging import cut_log, log_size
from mmrl.utils import jsonio
from mmrl.utils.durable import fsync_path
from mmrl.utils.faults import fault_point
from mmrl.utils.weights import SPEC, fingerprint, load_weights, read_metadata, same_fingerprint, save_weights

MARKER = "COMPLETE"
WEIGHTS = "model.safetensors"
CONFIG = "config.yaml"
STATE = "state.pt"
SHARD = "optimizer.rank{:05d}.pt"  # a rank's own optimizer partition (DeepSpeed ZeRO on N ranks)
NONTENSOR = "mmrl.nontensor"  # model.safetensors metadata: names of the state dict's entries in state.pt
SOURCE = "mmrl.from_source"  # model.safetensors metadata: {key: fingerprint} of the weights not written
_NAME = re.compile(r"^\.?iter_(\d+)(\.replaced)?$")


class CheckpointError(RuntimeError):
    """No checkpoint in the run folder could be loaded; the message names each one and why."""


def _sha256(file: Path) -> str:
    h = hashlib.sha256()
    with open(file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def staging(out_dir: Path, iteration: int) -> Path:
    """The temporary folder checkpoint ``iter_<iteration>`` is written in before it is complete."""
    return Path(out_dir) / "checkpoints" / f".iter_{iteration:06d}.tmp"


def begin(out_dir: Path, iteration: int) -> Path:
    """Make checkpoint ``iteration``'s temporary folder, empty (rank 0, before the ranks write their
    `write_shard` files into it and `save` completes it)."""
    tmp = staging(out_dir, iteration)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    fault_point("ckpt.after_tmp_mkdir", tmp)
    return tmp


def write_shard(folder: Path, rank: int, shard: dict) -> None:
    """Rank ``rank``'s own part of the optimizer state (DeepSpeed ZeRO's partition) into a
    checkpoint's temporary ``folder``, durably; rank 0's `save` then lists it under ``COMPLETE``."""
    file = Path(folder) / SHARD.format(rank)
    torch.save(shard, file)
    fault_point("ckpt.mid_shard", file)
    fsync_path(file)


def read_shard(folder: Path, rank: int) -> dict:
    """Rank ``rank``'s file of checkpoint ``folder`` (written by `write_shard`)."""
    file = Path(folder) / SHARD.format(rank)
    return _reading(file, lambda: torch.load(file, map_location="cpu", weights_only=False))


def save(
    out_dir: Path, cfg, policy, optimizer, state, keep: int = 2, extra: dict | None = None, own: list | None = None
) -> Path:
    """Write checkpoint ``iter_<state.iteration>`` durably; ``extra`` holds the trainer's other
    resumable state (e.g. the episodes in progress of fixed-length rollouts, the reward scaler).
    ``own``: None, or the files (relative paths) the ranks wrote into the folder `begin` made
    (`TrainEngine.write_own_state`), all of them complete (the caller's barrier); the marker lists
    and checks them with the rest. Keeps the ``keep`` newest iterations."""
    from mmrl.config import save_config, to_dict

    root = Path(out_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"iter_{state.iteration:06d}"
    final, tmp, replaced = root / name, staging(out_dir, state.iteration), root / f".{name}.replaced"
    if own is None:
        begin(out_dir, state.iteration)
    own = list(own or ())
    missing = [f for f in own if not (tmp / f).exists()]
    if missing:  # a rank that did not write its part: never a COMPLETE checkpoint without it
        raise RuntimeError(f"checkpoint {name}: {', '.join(missing)} missing from {tmp} (a rank did not write it)")
    # frozen pretrained weights as built: rebuilt from the source on load, not written (not under
    # ZeRO-3, whose parameter tensors are shards)
    source = {} if optimizer.partitions_params else unchanged_source(policy)
    weights = optimizer.module_state_dict(exclude=source)  # a copy (ZeRO-3: gathered), without the frozen weights
    spec = (extra or {}).get("policy_spec")
    metadata = {SPEC: jsonio.dumps(spec)} if spec else {}
    if source:
        metadata[SOURCE] = json.dumps(source)
    nontensor = [k for k, v in weights.items() if not isinstance(v, torch.Tensor)]
    if nontensor:  # kept in state.pt; read_weights then reads that too
        metadata[NONTENSOR] = json.dumps(nontensor)
    others = save_weights(weights, tmp / WEIGHTS, metadata=metadata)
    fault_point("ckpt.mid_weights", tmp / WEIGHTS)
    torch.save(
        {
            "format": 2,  # weights in model.safetensors
            "policy_others": others,  # the state dict's non-tensor entries (a module's _extra_state)
            "optimizer": optimizer.state_dict(),
            "state": asdict(state),
            "extra": extra or {},
            "log_bytes": log_size(out_dir),  # metrics.jsonl up to here is this checkpoint's past
            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
        },
        tmp / STATE,
    )
    fault_point("ckpt.mid_state", tmp / STATE)
    fault_point("ckpt.after_state", tmp / STATE)
    save_config(cfg, tmp / "config.yaml")
    fault_point("ckpt.after_config", tmp / "config.yaml")
    for f in (WEIGHTS, STATE, "config.yaml", *own):  # the ranks fsynced theirs; their folders too
        fsync_path(tmp / f)
    for sub in sorted({(tmp / f).parent for f in own} - {tmp}):
        fsync_path(sub)
    fault_point("ckpt.after_fsync", tmp)
    marker = {
        "files": {f: {"sha256": _sha256(tmp / f), "bytes": (tmp / f).stat().st_size} for f in (WEIGHTS, STATE, *own)},
        "iteration": state.iteration,
        "config": to_dict(cfg),  # what resume, eval and export trust (config.yaml is a copy to read)
        "world_size": distributed.current().world,  # the ranks that trained it: the global batch
        "config_sha256": _sha256(tmp / CONFIG),
    }
    (tmp / MARKER).write_text(json.dumps(marker))
    fault_point("ckpt.mid_marker", tmp / MARKER)
    fsync_path(tmp / MARKER)
    fsync_path(tmp)
    fault_point("ckpt.after_marker", tmp)
    if final.exists():  # saved before at this iteration: keep it complete until the new one is in place
        shutil.rmtree(replaced, ignore_errors=True)
        final.rename(replaced)
        fault_point("ckpt.after_set_aside", replaced)
    tmp.rename(final)
    fsync_path(root)
    fault_point("ckpt.after_rename", final)
    if replaced.exists():
        shutil.rmtree(replaced, ignore_errors=True)
        fault_point("ckpt.after_drop_replaced", replaced)
    (root / "latest.tmp").write_text(name)
    fsync_path(root / "latest.tmp")
    fault_point("ckpt.mid_latest", root / "latest.tmp")
    (root / "latest.tmp").replace(root / "latest")
    fsync_path(root)
    fault_point("ckpt.after_latest", root / "latest")
    older = sorted({i for i, _ in candidates(root) if i < state.iteration})
    for it in older[: max(0, len(older) - (keep - 1))]:
        for p in (root / f"iter_{it:06d}", root / f".iter_{it:06d}.replaced"):
            if p.exists():
                fault_point("ckpt.before_rotate", p)
                fault_point("ckpt.mid_rotate", p)
                shutil.rmtree(p, ignore_errors=True)
                fault_point("ckpt.after_rotate", p)
    return final


def candidates(root: Path) -> list[tuple[int, Path]]:
    """Checkpoint folders in ``root``, newest first: ``(iteration, folder)``; at equal iteration the
    folder in place before one renamed aside during its replacement."""
    found = []
    for p in Path(root).glob("*iter_*"):
        m = _NAME.match(p.name)
        if m and p.is_dir():
            found.append((int(m.group(1)), m.group(2) is None, p))
    return [(it, p) for it, _, p in sorted(found, key=lambda x: (x[0], x[1]), reverse=True)]


def verify(folder: Path) -> str | None:
    """None if ``folder`` holds a complete checkpoint (its ``COMPLETE`` marker, written last, and
    every file it lists with its size and sha256), else why not."""
    folder = Path(folder)
    if not (folder / STATE).exists():
        return f"{folder / STATE} is missing"
    marker = folder / MARKER
    if not marker.exists():
        return f"{marker} is missing (the checkpoint was never completed)"
    try:
        files = json.loads(marker.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{marker} is unreadable"
    for name, expected in files.items():
        file = folder / name
        if not file.exists():
            return f"{file} is missing"
        if file.stat().st_size != expected["bytes"] or _sha256(file) != expected["sha256"]:
            return f"{file} does not match its checksum (truncated or corrupted)"
    return None


def recorded_world_size(folder: Path) -> int:
    """The number of ranks checkpoint ``folder`` was trained on (its ``COMPLETE`` marker; 1 for a
    checkpoint of an older mmrl, which recorded none)."""
    try:
        marker = json.loads((Path(folder) / MARKER).read_text())
    except (OSError, ValueError):
        return 1
    world = marker.get("world_size", 1) if isinstance(marker, dict) else 1
    return world if isinstance(world, int) and world >= 1 else 1


def recorded_config(folder: Path, log=print) -> dict:
    """The config (a plain dict) checkpoint ``folder`` was trained with: the one its ``COMPLETE``
    marker records. Its ``config.yaml`` is a copy for people: changed or broken since the save, it
    is said (``log``) and not used. A checkpoint of an older mmrl (no recorded config) has only
    ``config.yaml``: unreadable, it raises `mmrl.errors.UserError` in one line."""
    import yaml

    from mmrl.errors import UserError

    folder = Path(folder)
    file = folder / CONFIG
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        marker = {}
    if isinstance(marker, dict) and isinstance(marker.get("config"), dict):
        if not file.is_file() or _sha256(file) != marker.get("config_sha256"):
            what = "is missing" if not file.is_file() else "was changed after the checkpoint was saved"
            log(
                f"warning: {file} {what}; it is a copy for reading, and the config recorded in "
                f"{folder / MARKER} is used (to change a value, pass it as an override: key=value)"
            )
        return marker["config"]
    try:
        data = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError) as exc:
        why = str(exc).replace("\n", " ")[:200]
        raise UserError(
            f"{file} cannot be read ({type(exc).__name__}: {why}); this checkpoint of an older mmrl records "
            "its config nowhere else: restore the file, or evaluate it with a config: mmrl eval CONFIG checkpoint=PATH"
        ) from None
    if not isinstance(data, dict):
        raise UserError(f"{file} holds {type(data).__name__}, not a config: restore the file")
    return data


def latest_path(out_dir: Path) -> Path | None:
    """The newest complete checkpoint folder of a run (None if there is none)."""
    return newest_complete(Path(out_dir) / "checkpoints")[0]


def newest_complete(root: Path) -> tuple[Path | None, list[str]]:
    """The newest checkpoint folder in ``root`` (a run's ``checkpoints/``) that verifies, or None,
    and why each newer one does not (``"iter_000004: ... does not match its checksum"``)."""
    problems: list[str] = []
    for _, path in candidates(root):
        why = verify(path)
        if why is None:
            return path, problems
        problems.append(f"{path.name}: {why}")
    return None, problems


def read(folder: Path) -> dict:
    """Everything checkpoint folder ``folder`` holds, as one dict: ``policy`` (the state dict),
    ``optimizer``, ``state``, ``extra``, ``rng``, ``log_bytes``, ``source``."""
    folder = Path(folder)
    data = _reading(folder / STATE, lambda: torch.load(folder / STATE, map_location="cpu", weights_only=False))
    if not isinstance(data, dict) or data.get("format") != 2:
        what = f"a {type(data).__name__}" if not isinstance(data, dict) else f"format {data.get('format')!r}"
        raise UnreadableFile(folder / STATE, TypeError(f"it holds {what}, not a checkpoint of format 2"))
    weights, meta = _reading(folder / WEIGHTS, lambda: load_weights(folder / WEIGHTS))
    data["policy"] = {**weights, **data.pop("policy_others", {})}
    data["source"] = json.loads(meta.get(SOURCE, "{}"))
    return data


class UnreadableFile(ValueError):
    """A checkpoint file that exists but cannot be read: ``file`` and the reader's exception ``cause``."""

    def __init__(self, file: Path, cause: Exception):
        super().__init__(f"{file}: {type(cause).__name__}: {cause}")
        self.file, self.cause = file, cause


def _reading(file: Path, load):
    try:
        return load()
    except Exception as exc:  # whatever the reader raises, say which file
        raise UnreadableFile(file, exc) from exc


def read_weights(folder: Path) -> tuple[dict, dict | None]:
    """``(state dict, build spec or None)`` of checkpoint folder ``folder``: from
    ``model.safetensors`` alone, nothing unpickled."""
    folder = Path(folder)
    weights, meta = load_weights(folder / WEIGHTS)
    if NONTENSOR in meta:  # a module's non-tensor state (rare): only state.pt holds it
        weights.update(torch.load(folder / STATE, map_location="cpu", weights_only=False)["policy_others"])
    return weights, (json.loads(meta[SPEC]) if SPEC in meta else None)


def source_of(folder: Path) -> dict:
    """``{key: fingerprint}`` of the weights checkpoint folder ``folder`` left to the policy's source
    (empty: it holds every weight)."""
    folder = Path(folder)
    if not (folder / WEIGHTS).exists():
        return {}
    return json.loads(read_metadata(folder / WEIGHTS).get(SOURCE, "{}"))


def load_into(policy, weights: dict, source: dict | None = None, where: str = "the checkpoint") -> None:
    """``policy.load_state_dict(weights)``, where the keys of ``source`` (weights a checkpoint left
    to the policy's pretrained source) keep the values the policy was built with, after checking
    those are the ones trained on (their fingerprints): a base model whose files changed since is a
    `CheckpointError` naming the keys, not a silently different policy."""
    source = source or {}
    if source:
        own = dict(policy.state_dict())
        absent = [k for k in source if k not in own]
        differ = [k for k in source if k in own and not same_fingerprint(fingerprint(own[k]), source[k])]
        if absent or differ:
            keys = absent + differ
            raise CheckpointError(
                f"{where} was trained on base weights that the policy built now does not have: "
                f"{len(keys)} of the {len(source)} weights it left to the policy's source differ "
                f"({', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''}). Fix: build the policy from the same "
                "pretrained files (policy.model / policy.pretrained, revision and dtype) it was trained from"
            )
        missing, unexpected = policy.load_state_dict(weights, strict=False)  # the source's keys keep theirs
        if set(missing) != set(source) - set(weights) or unexpected:  # as strict loading would have said
            policy.load_state_dict({**{k: own[k] for k in source}, **weights})
        return
    policy.load_state_dict(weights)


def mark_source(policy) -> None:
    """Remember which of ``policy``'s parameters hold its pretrained source as built: frozen ones
    (no gradient), by identity and in-place version. Called once the policy is built and on its
    device (`mmrl.experiment.build_policy`); `save` then leaves those still untouched out. Only
    for a policy that rebuilds them exactly (`Policy.rebuilds_frozen_weights`)."""
    marks = (
        {
            name: (p.data_ptr(), p._version, p.device)
            for name, p in policy.named_parameters(remove_duplicate=False)
            if not p.requires_grad
        }
        if policy.rebuilds_frozen_weights()
        else {}
    )
    policy.frozen_source = {"marks": marks, "fingerprints": {}}


def unchanged_source(policy) -> dict:
    """``{key: fingerprint}`` of the parameters `mark_source` recorded that are still frozen, the
    same tensors and never modified in place since (a reference refreshed with ``load_state_dict``,
    an EMA update or a move to another device all count as modified: those are written)."""
    if not policy.frozen_source or not policy.frozen_source["marks"]:
        return {}
    marked, cache = policy.frozen_source["marks"], policy.frozen_source["fingerprints"]
    keys = set(policy.state_dict(keep_vars=True))
    out = {}
    for name, p in policy.named_parameters(remove_duplicate=False):
        if (
            name in marked
            and name in keys
            and not p.requires_grad
            and marked[name] == (p.data_ptr(), p._version, p.device)
        ):
            if name not in cache:
                cache[name] = fingerprint(p)
            out[name] = cache[name]
    return out


def load_policy(path: Path, policy) -> dict:
    """Load weights from a checkpoint folder (or its state.pt); returns the saved data."""
    path = Path(path)
    data = read(path if path.is_dir() else path.parent)
    load_into(policy, data["policy"], data.get("source"), where=f"checkpoint {path}")
    return data


def load_latest(
    out_dir: Path, policy, optimizer, log=print, verified: Path | None = None, writer: bool = True
) -> tuple[dict, dict, Path] | None:
    """Restore the newest checkpoint that verifies and loads: weights, then the optimizer
    (``optimizer`` may be a callable returning it, so that an engine that copies the weights when
    built is built after they load). A corrupt or incomplete one is skipped with a warning naming
    it. ``verified``: a folder the caller verified under the run's lock (not hashed again);
    ``writer``: whether this process writes the run's log (rank 0 of N cuts it, the others only read).
    Returns ``(counters, extra, folder)`` (see `save`), None when there is no checkpoint."""
    found = candidates(Path(out_dir) / "checkpoints")
    problems = []
    for _, path in found:
        why = None if verified is not None and path == Path(verified) else verify(path)
        if why is None:
            try:
                data = read(path)
            except Exception as exc:  # any unreadable file: try the previous one
                why = f"{path} cannot be read ({type(exc).__name__}: {exc})"
        if why is not None:
            problems.append(why)
            log(f"warning: skipping checkpoint {path.name}: {why}")
            continue
        load_into(policy, data["policy"], data.get("source"), where=f"checkpoint {path}")
        (optimizer() if callable(optimizer) else optimizer).load_optimizer(data["optimizer"], path)
        torch.set_rng_state(data["rng"]["torch"])
        np.random.set_state(data["rng"]["numpy"])
        random.setstate(data["rng"]["python"])
        if writer:
            had, has = data.get("log_bytes") or 0, log_size(out_dir)
            if has < had:  # the log this checkpoint saw lost rows outside mmrl: said, never silent
                log(
                    f"warning: {Path(out_dir) / 'metrics.jsonl'} holds {has} bytes, fewer than the {had} it held "
                    f"when {path.name} was saved: rows logged before that checkpoint were deleted or cut short "
                    "outside mmrl and are gone from it; the run resumes and logs from here"
                )
            cut_log(out_dir, data.get("log_bytes"))  # rows logged after this save are redone
        return data["state"], data.get("extra", {}), path
    if found:
        raise CheckpointError(
            f"no checkpoint in {Path(out_dir) / 'checkpoints'} could be loaded: "
            + "; ".join(problems)
            + ". Fix: remove the folder to start over, or set a new run.name"
        )
    return None


def move_aside(out_dir: Path) -> Path | None:
    """A fresh start (``trainer.resume=false``) in a folder that holds a run: its checkpoints,
    results and log move to ``OUT/previous_<n>/`` so the two runs never mix. Returns that folder."""
    out_dir = Path(out_dir)
    items = [out_dir / n for n in ("checkpoints", "results.json", "metrics.jsonl", "videos") if (out_dir / n).exists()]
    if not (out_dir / "checkpoints").exists():
        return None
    n = 0
    while (out_dir / f"previous_{n}").exists():
        n += 1
    dest = out_dir / f"previous_{n}"
    dest.mkdir()
    for item in items:
        if item.name == "metrics.jsonl":  # the logger holds it open: keep a copy, it is then emptied
            shutil.copy2(item, dest / item.name)
        else:
            item.rename(dest / item.name)
    return dest
