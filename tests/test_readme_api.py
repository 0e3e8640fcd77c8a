"""The README's Python API examples (``<!-- python-api: FAMILY -->`` blocks), executed as written:
in a scratch folder (its ``configs/`` the repository's), with only tiny sizes appended to each
``mmrl.train`` call so they run in seconds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import mmrl

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = dict(re.findall(r"<!-- python-api: (\w+) -->\s*```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S))


def tiny(family: str) -> list[str]:
    if family == "vla":
        from tests.trainer.test_trainer import TINY
    elif family == "vlm":
        pytest.importorskip("transformers")
        from tests.trainer.test_vlm_training import TINY
    else:
        from tests.trainer.test_diffusion_protocol import TINY

        TINY = [*TINY, "warm_start.steps=2", "warm_start.num_episodes=64"]  # the config pretrains first
    return [*TINY, "trainer.iterations=1", "trainer.video_episodes=0"]


def test_every_family_has_an_example():
    assert set(BLOCKS) == {"vla", "vlm", "generator"}


@pytest.mark.parametrize("family", sorted(BLOCKS))
def test_the_readme_example_runs_as_written(family, tmp_path, monkeypatch):
    sizes = tiny(family)
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    monkeypatch.chdir(tmp_path)
    real, runs = mmrl.train, []

    def train(config, *overrides, **kwargs):
        results = real(config, *overrides, *sizes, **kwargs)
        runs.append(results)
        return results

    monkeypatch.setattr(mmrl, "train", train)
    scope: dict = {}
    exec(compile(BLOCKS[family], "README.md", "exec"), scope)  # the block's own asserts hold
    assert runs and runs[-1]["final"]["iteration"] == 1
    assert list((tmp_path / "runs").iterdir()), "the example trained nothing into runs/"
    if family == "vlm":
        assert scope["report"]["success_rate"] == scope["results"]["final"]["success_rate"]
