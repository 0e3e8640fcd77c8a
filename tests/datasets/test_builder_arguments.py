"""Dataset builders declare their arguments; a misspelt one is an error, never silently dropped.

`mmrl.data.load_dataset` checks every argument against the builder's signature, `warm_start.kwargs`
is checked when the experiment config loads (before any work), and the trainer offers its context
(seed, num_episodes, num_samples, chunk_size, sim_kwargs) only to builders that declare it.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path

import pytest

from mmrl.config import ConfigError
from mmrl.data import DATASETS_DIR, builder_module, dataset_arguments, declared_kwargs, load_dataset
from mmrl.experiment import load_experiment
from mmrl.registry import DATASETS

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
BUILT_IN = sorted(p.parent.name for p in DATASETS_DIR.glob("*/builder.py"))


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_builder_declares_its_arguments(name):
    params = inspect.signature(builder_module(name).build).parameters.values()
    assert not [p.name for p in params if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL)], (
        f"datasets/{name}/builder.py: build() must name every argument (no **kwargs / *args)"
    )
    assert dataset_arguments(name) == {p.name for p in params}


def test_unknown_argument_is_one_line_error_naming_the_valid_ones(monkeypatch):
    called, real = [], builder_module("shapes_prompts").build

    @functools.wraps(real)  # the same signature
    def spy(**kwargs):
        called.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(builder_module("shapes_prompts"), "build", spy)
    with pytest.raises(ConfigError) as exc:
        load_dataset("shapes_prompts", split="eval", tag=["single"])
    msg = str(exc.value)
    assert msg.startswith("dataset 'shapes_prompts' has no argument 'tag'. Valid: eval_fraction, split, tags")
    assert "did you mean 'tags'" in msg and "\n" not in msg
    assert not called  # refused before the builder ran


def test_declared_arguments_pass():
    d = load_dataset("shapes_vqa", num_samples=2, split="eval", seed=1, image_size=16, tasks=["count"])
    assert len(d["prompt"]) == 2


def test_context_is_offered_only_where_declared():
    offered = dict(num_episodes=3, num_samples=3, seed=7, chunk_size=4, sim_kwargs={"image_size": 16})
    assert declared_kwargs("reach_demos", **offered) == {
        k: offered[k] for k in ("num_episodes", "seed", "chunk_size", "sim_kwargs")
    }
    assert declared_kwargs("shapes_vqa", **offered) == {"num_samples": 3, "seed": 7}
    assert declared_kwargs("shapes_prompts", **offered) == {}


@pytest.fixture
def register():
    added = []

    def add(name, fn):
        DATASETS.register(name, fn)
        added.append(name)

    yield add
    for name in added:
        DATASETS._entries.pop(name, None)


def test_third_party_datasets(register):
    def strict(path, limit: int = 1):
        return {"prompt": [path] * limit}

    def loose(**kwargs):
        return {"prompt": sorted(kwargs)}

    register("_test_strict", strict)
    register("_test_loose", loose)
    assert dataset_arguments("_test_strict") == {"path", "limit"}
    with pytest.raises(ConfigError, match="dataset '_test_strict' has no argument 'limt'. Valid: limit, path"):
        load_dataset("_test_strict", path="p", limt=2)
    assert load_dataset("_test_strict", path="p", limit=2) == {"prompt": ["p", "p"]}
    # **kwargs: its arguments cannot be known; everything is passed (the builder decides)
    assert dataset_arguments("_test_loose") is None
    assert declared_kwargs("_test_loose", seed=1, chunk_size=2) == {"seed": 1, "chunk_size": 2}
    assert load_dataset("_test_loose", anything=1) == {"prompt": ["anything"]}


def test_misspelt_warm_start_kwarg_fails_at_config_load():
    with pytest.raises(ConfigError) as exc:
        load_experiment(CONFIGS / "vlm_quickstart.yaml", ["warm_start.kwargs.num_sample=10"])
    msg = str(exc.value)
    assert "warm_start" in msg and "has no argument 'num_sample'" in msg
    assert "Valid: " in msg and "num_samples" in msg and "tasks" in msg
    load_experiment(CONFIGS / "vlm_quickstart.yaml", ["warm_start.kwargs.num_samples=10"])  # the right name loads


def test_unknown_warm_start_dataset_fails_at_config_load():
    with pytest.raises(ConfigError, match="'dataset' = 'reach_demo' is not a registered dataset: .*reach_demos"):
        load_experiment(CONFIGS / "quickstart.yaml", ["warm_start.dataset=reach_demo"])
