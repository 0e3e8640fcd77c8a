"""The evaluation protocol of the embedded diffusion demo (configs/diffusion_shapes_*.yaml), through
the trainer's own evaluation and warm start: every held-out prompt is evaluated equally often, and
the generator's pretraining captions never include a held-out prompt."""

from __future__ import annotations

import json
from collections import Counter

import pytest

import mmrl.data
from mmrl.experiment import build_trainer, load_experiment
from rewards.shapes import parse_prompt

CONFIGS = [
    "configs/diffusion_shapes_flow_grpo.yaml",
    "configs/diffusion_shapes_awm.yaml",
    "configs/diffusion_shapes_nft.yaml",
]
TINY = [
    "run.threads=1",
    "policy.width=16",
    "policy.num_steps=2",
    "policy.eval_num_steps=2",
    "trainer.video_episodes=0",
    "trainer.resume=false",
]


def canonical(objects: list[dict]) -> tuple:
    """Objects, order-free (a color_attr pair reads the same in both word orders)."""
    return tuple(sorted(json.dumps(o, sort_keys=True) for o in objects))


def demo(path: str, tmp_path, *extra):
    return build_trainer(load_experiment(path, [f"run.output_dir={tmp_path}", "run.name=p", *TINY, *extra]))


class Recorder:
    """The simulator's reward model, recording every prompt it scores."""

    def __init__(self, reward):
        self.reward, self.prompts = reward, []
        self.kind, self.name = reward.kind, reward.name

    def __call__(self, images, prompts, meta=None):
        self.prompts += list(prompts)
        return self.reward(images, prompts, meta)


@pytest.mark.parametrize("path", CONFIGS)
def test_every_held_out_prompt_is_evaluated_equally_often(tmp_path, path):
    trainer = demo(path, tmp_path, "warm_start.dataset=null")
    recorder = trainer.reward_stage.model = Recorder(trainer.reward_stage.model)
    res = trainer.evaluate("start")
    held_out = trainer.eval_sim.prompts
    assert len(held_out) == len(set(held_out)) == 42
    counts = Counter(recorder.prompts)
    k = trainer.cfg.trainer.eval_episodes // len(held_out)
    assert k >= 1 and res["episodes"] == len(recorder.prompts) == k * len(held_out)
    assert counts == {p: k for p in held_out}, counts.most_common(3)
    assert trainer.eval_sim.evaluation_rounds(trainer.cfg.trainer.eval_episodes) == k
    assert not set(held_out) & set(trainer.sim.prompts)  # training deals the train prompts only


@pytest.mark.parametrize("path", CONFIGS)
def test_pretraining_captions_exclude_every_held_out_prompt(tmp_path, path, monkeypatch):
    seen = []

    def recording_load(name, **kwargs):
        data = real_load(name, **kwargs)
        seen.append(data)
        return data

    trainer = demo(path, tmp_path, "warm_start.num_episodes=2000", "warm_start.steps=1")
    real_load = mmrl.data.load_dataset
    monkeypatch.setattr(mmrl.data, "load_dataset", recording_load)
    trainer.warm_start()
    (data,) = seen  # the one dataset the generator is pretrained on
    held_out = {canonical(parse_prompt(p)["objects"]) for p in trainer.eval_sim.prompts}
    captions = {canonical(parse_prompt(p)["objects"]) for p in data["prompt"]}
    drawn = {canonical(m.get("drawn", m["objects"])) for m in data["meta"]}  # what the images show
    assert len(data["prompt"]) == 2000 and sum(m["noisy"] for m in data["meta"]) > 500  # noisy captions in
    assert len(captions) > 100 and not captions & held_out
    assert drawn and not drawn & held_out
    assert not set(data["prompt"]) & set(trainer.eval_sim.prompts)  # the exact strings too
