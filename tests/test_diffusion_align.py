"""benchmarks/diffusion_align.py's time-to-reward arithmetic (issue 34): the common level is one that
every method which improved reaches, a method that never rose above the pretrained reward never
reaches it (no 0 s at a level equal to the start), and the crossing is interpolated."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("diffusion_align")


def points(*rewards):
    return [{"rl_seconds": 10.0 * i, "train_episodes": 100 * i, "reward": r} for i, r in enumerate(rewards)]


def test_the_level_is_one_every_improving_method_reaches(bench):
    grpo, nft = points(0.2, 0.3, 0.4), points(0.2, 0.5, 0.35)
    level = bench.common_level(0.2, [0.4, 0.5], 0.8)
    assert level == pytest.approx(0.2 + 0.8 * 0.2)
    assert bench.time_to(grpo, level, "rl_seconds") == pytest.approx(10 + 10 * (0.36 - 0.3) / 0.1)
    assert bench.time_to(nft, level, "rl_seconds") == pytest.approx(10 * 0.16 / 0.3)


def test_a_method_that_never_improves_never_reaches_the_level(bench):
    grpo, collapsed = points(0.27, 0.3, 0.35), points(0.27, 0.13, 0.09)
    level = bench.common_level(0.27, [0.35, 0.27], 0.8)
    assert level == pytest.approx(0.27 + 0.8 * 0.08)  # set by the method that rose, not the collapsed one
    assert bench.time_to(grpo, level, "rl_seconds") is not None
    assert bench.time_to(collapsed, level, "rl_seconds") is None
    assert bench.common_level(0.27, [0.27, 0.2], 0.8) == float("inf")  # none rose: nobody reaches it
    assert bench.time_to(grpo, float("inf"), "rl_seconds") is None


def test_validation_runs_evaluate_on_validation_prompts_kept_out_of_training(bench):
    """--validation's overrides: the evaluation simulator deals the 42 validation prompts, the
    training simulator and the pretraining data none of them, and the held-out prompts stay unused."""
    from mmrl.data import builder_module, load_dataset
    from mmrl.experiment import build_sim, load_experiment

    cfg = load_experiment(ROOT / bench.IMAGES.configs["nft"], list(bench.IMAGES.validation))
    shapes = builder_module("shapes")
    val, held = (set(shapes.prompt_pool(s, 0.2, 0.2)) for s in ("validation", "eval"))
    evaluation = build_sim(cfg, 4, 0, evaluation=True)
    assert set(evaluation.prompts) == val and len(val) == 42
    train = build_sim(cfg, 4, 0)
    assert not set(train.prompts) & (val | held)
    data = load_dataset(cfg.warm_start.dataset, num_episodes=400, **cfg.warm_start.kwargs)
    assert not set(data["prompt"]) & (val | held)
    plain = load_experiment(ROOT / bench.IMAGES.configs["nft"])  # the reported runs: the held-out prompts
    assert set(build_sim(plain, 4, 0, evaluation=True).prompts) == held


def test_the_time_to_flow_grpos_final_reward_is_a_fraction_of_its_run(bench):
    grpo = points(0.2, 0.3, 0.4)  # its whole run: 20 s, final reward 0.4
    fast, never = points(0.2, 0.45, 0.5), points(0.2, 0.3, 0.35)
    assert bench.fraction_to_final(fast, grpo) == pytest.approx(10 * (0.2 / 0.25) / 20, abs=1e-3)
    assert bench.fraction_to_final(grpo, grpo) == 1.0
    assert bench.fraction_to_final(never, grpo) is None


def test_a_pretrained_generator_is_reused_only_under_the_same_pretraining_settings(bench, tmp_path, monkeypatch):
    """--reuse-pretrained loads the seed's saved generator (no pretraining) while the pretraining
    settings are unchanged; an RL setting (the rollout's SDE window too) does not change the key, a
    warm-start one does."""
    import argparse

    import mmrl.experiment

    args = argparse.Namespace(output_dir=str(tmp_path), reuse_pretrained=True)
    common = [f"run.output_dir={tmp_path}", "trainer.resume=false", "trainer.iterations=2", *bench.SMOKE]
    first, _, reused = bench.pretrain(0, common, args, bench.IMAGES)
    (saved,) = (tmp_path / "pretrained").glob("seed0-*.safetensors")
    real = mmrl.experiment.build_trainer
    monkeypatch.setattr(mmrl.experiment, "build_trainer", lambda cfg: pytest.fail("pretrained again"))
    rl = ["trainer.iterations=9", "policy.stochastic=window", "policy.window=[0,2]", "policy.shared_noise=true"]
    again, seconds, reused_now = bench.pretrain(0, [*common, *rl], args, bench.IMAGES)
    assert not reused and reused_now and seconds >= 0 and again.keys() == first.keys()
    assert all(torch.equal(again[k], first[k]) for k in first)
    monkeypatch.setattr(mmrl.experiment, "build_trainer", real)
    bench.pretrain(0, [*common, "warm_start.steps=2"], args, bench.IMAGES)  # another key: pretrained
    assert len(list((tmp_path / "pretrained").glob("seed0-*.safetensors"))) == 2 and saved.is_file()


def test_video_validation_runs_keep_the_validation_prompts_out_of_pretraining_and_training(load_benchmark):
    """video_align.py --validation: the evaluation deals moving_shapes' 12 validation prompts, which
    neither the RL prompts nor the pretraining clips' captions or drawn clips hold, and the held-out
    prompts stay unused; without it the reported runs keep all 48 train prompts."""
    from mmrl.data import builder_module, load_dataset
    from mmrl.experiment import build_sim, load_experiment

    videos = load_benchmark("video_align").VIDEOS
    cfg = load_experiment(ROOT / videos.configs["nft"], list(videos.validation))
    shapes = builder_module("moving_shapes")
    val, held = set(shapes.prompt_pool("validation", 0.2)), set(shapes.prompt_pool("eval"))
    assert len(val) == 12 and not val & held
    evaluation = build_sim(cfg, 4, 0, evaluation=True)
    assert set(evaluation.prompts) == val
    train = build_sim(cfg, 4, 0)
    assert set(train.prompts) == set(shapes.prompt_pool("train", 0.2)) and not set(train.prompts) & (val | held)
    data = load_dataset(cfg.warm_start.dataset, num_episodes=300, **cfg.warm_start.kwargs)
    drawn = {shapes.describe(*(m.get("drawn", m)[k] for k in ("color", "shape", "direction"))) for m in data["meta"]}
    assert not (set(data["prompt"]) | drawn) & (val | held)
    plain = load_experiment(ROOT / videos.configs["nft"])
    assert set(build_sim(plain, 4, 0, evaluation=True).prompts) == held
    assert len(set(build_sim(plain, 4, 0).prompts)) == 48


def test_a_killed_benchmark_goes_on_from_its_runs_under_resume(bench, tmp_path):
    """--resume reuses the seed's pretrained generator and continues each run from its newest
    checkpoint: a run killed after iteration 2 of 3 (its last checkpoint gone) keeps its first points,
    RL seconds included (which a run redone from the start would not), ends where the whole run ended,
    and a finished run is read back unchanged."""
    import argparse
    import shutil

    from mmrl.trainer import checkpoint

    def args(resume):
        return argparse.Namespace(
            output_dir=str(tmp_path),
            resume=resume,
            reuse_pretrained=False,
            iterations=3,
            eval_every=1,
            set=[*bench.SMOKE, *bench.IMAGES.one_eval, "trainer.video_episodes=0"],
            method_set=[],
            methods=["flow_grpo", "nft"],
            level_frac=0.8,
            split="held-out",
        )

    whole, _ = bench.run_seed(0, args(False), bench.IMAGES)
    for m in ("flow_grpo", "nft"):  # the kill: the run's newest checkpoint never written
        shutil.rmtree(checkpoint.latest_path(tmp_path / "seed0" / m))
    resumed, _ = bench.run_seed(0, args(True), bench.IMAGES)
    assert resumed["pretrain_reused"] and not whole["pretrain_reused"]
    for m in ("flow_grpo", "nft"):
        assert [p["iteration"] for p in resumed["curves"][m]] == [0, 1, 2, 3]
        assert resumed["curves"][m][:3] == whole["curves"][m][:3]
        assert resumed[f"{m}_reward"] == whole[f"{m}_reward"]
    again, _ = bench.run_seed(0, args(True), bench.IMAGES)
    assert again["curves"] == resumed["curves"]
