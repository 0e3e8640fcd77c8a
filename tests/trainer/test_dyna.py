"""The Dyna loop (`mmrl.dyna`) end to end on a tiny reach task, and its accounting: every step taken
in the real simulator outside evaluation is counted, and the world model learns from no real step
that was not counted (a loop that trains on real episodes it does not count fails here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from mmrl.config import ConfigError
from mmrl.dyna import Dyna, load_dyna_config

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from world_model import SMOKE_DYNA, SMOKE_POLICY, SMOKE_WORLD


def settings(tmp_path, **kw):
    return load_dyna_config(
        "configs/dyna/reach.yaml",
        policy_overrides=SMOKE_POLICY,
        world_model_overrides=SMOKE_WORLD,
        output_dir=str(tmp_path / "dyna"),
        **{**SMOKE_DYNA, **kw},
    )


class Meter:
    """Counts, independently of the loop, the steps of every real simulator built for training
    (`mmrl.experiment.build_sim` of a ``reach`` simulator without ``evaluation``): per environment,
    the steps of its episode since the last reset until that episode ends (an episode's steps)."""

    def __init__(self, monkeypatch):
        import mmrl.experiment as experiment

        self.steps = 0
        build = experiment.build_sim

        def counted_build(cfg, num_envs, seed, evaluation=False, task=None):
            sim = build(cfg, num_envs, seed, evaluation=evaluation, task=task)
            if not evaluation and cfg.sim.type == "reach":  # the real one (imagination is world_model)
                self.watch(sim)
            return sim

        monkeypatch.setattr(experiment, "build_sim", counted_build)

    def watch(self, sim) -> None:
        reset, step_chunk = sim.reset, sim.step_chunk
        fresh = torch.ones(sim.num_envs, dtype=torch.bool)

        def counted_reset(seed=None):
            fresh.fill_(True)
            return reset(seed)

        def counted_step_chunk(actions, trace=False):
            res = step_chunk(actions, trace=trace)
            self.steps += int((res.info["num_steps"].cpu() * fresh).sum())
            fresh.mul_(~res.done.cpu())
            return res

        sim.reset, sim.step_chunk = counted_reset, counted_step_chunk


def check_counted(dyna: Dyna, meter: Meter) -> None:
    """The loop's count is the meter's, and the real rows it learned from are exactly those steps."""
    assert dyna.real_env_steps == meter.steps, f"loop counted {dyna.real_env_steps}, the simulator ran {meter.steps}"
    assert dyna.logged is not None and len(dyna.logged["episode"]) == meter.steps
    trained_on = torch.load(dyna.starts_file, weights_only=True)  # what the last refresh trained on
    assert len(trained_on["episode"]) == len(dyna.demos["episode"]) + meter.steps


def test_dyna_loop_counts_every_real_step(tmp_path, monkeypatch):
    meter = Meter(monkeypatch)
    dyna = Dyna(settings(tmp_path), log=lambda line: None)
    out = dyna.run()
    check_counted(dyna, meter)
    assert meter.steps > 0 and out["real_env_steps"] == meter.steps
    rows = [json.loads(line) for line in (tmp_path / "dyna" / "dyna.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    assert rows[0]["real_env_steps"] < rows[1]["real_env_steps"] == meter.steps
    for r in rows:
        assert 0 <= r["real_success"] <= 1 and 0 <= r["imagined_success"] <= 1
        assert r["reward_gap"] == pytest.approx(r["imagined_success"] - r["real_success"], abs=1e-3)
        assert r["world_model_frame_mae"] >= 0 and r["copy_frame_mae"] >= 0
    # the policy trained in imagination: its run folder went on for one iteration a round
    state = json.loads((tmp_path / "dyna" / "policy" / "results.json").read_text())
    assert state["final"]["iteration"] == 2


def test_a_loop_that_learns_from_uncounted_real_steps_fails_the_check(tmp_path, monkeypatch):
    from mmrl.episodes import join_episodes, record_episodes

    class Sneaky(Dyna):
        def collect(self, round_):  # a second batch of real episodes, joined but not counted
            recs = super().collect(round_)
            sim = self.real_sim(2)
            extra = record_episodes(self.policy(), sim, [7, 8], torch.Generator().manual_seed(0))
            self.logged = join_episodes(self.logged, extra)
            return recs

    meter = Meter(monkeypatch)
    sneaky = Sneaky(settings(tmp_path, rounds=1), log=lambda line: None)
    sneaky.run()
    with pytest.raises(AssertionError, match="loop counted"):
        check_counted(sneaky, meter)


def test_settings_are_checked_before_any_work(tmp_path):
    with pytest.raises(ConfigError, match="unknown Dyna settings"):
        load_dyna_config("configs/dyna/reach.yaml", real_episode=3)
    with pytest.raises(ConfigError, match="level"):
        load_dyna_config("configs/dyna/reach.yaml", level=1.5)


def dyna_command(out: Path) -> list[str]:
    """``python -m mmrl.dyna`` on the smoke's settings, into ``out``."""
    sets = {
        "policy_overrides": SMOKE_POLICY,
        "world_model_overrides": SMOKE_WORLD,
        **SMOKE_DYNA,
        "output_dir": str(out),
    }
    return [sys.executable, "-m", "mmrl.dyna", "configs/dyna/reach.yaml"] + [
        a for k, v in sets.items() for a in ("--set", f"{k}={json.dumps(v)}")
    ]


def run_dyna_process(out: Path, fault: str | None = None):
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "MMRL_FAULT"}
    env.update(TQDM_DISABLE="1", **({"MMRL_FAULT": fault} if fault else {}))
    root = Path(__file__).resolve().parents[2]
    return subprocess.run(dyna_command(out), cwd=root, env=env, capture_output=True, text=True, timeout=600)


def without_wall(x):
    """``x`` without its ``wall_s`` entries (at any depth): seconds differ from run to run."""
    if isinstance(x, list):
        return [without_wall(v) for v in x]
    return {k: without_wall(v) for k, v in x.items() if k != "wall_s"} if isinstance(x, dict) else x


@pytest.mark.xdist_group("dyna_resume")
def test_a_killed_loop_resumes_as_if_never_killed(tmp_path):
    """SIGKILL after round 1's work but before its state is saved (resume redoes round 1: the policy's
    run folder holds a checkpoint of that round, which must not be trained on), then right after
    round 1 is saved; the same command then finishes. Rows, summary and the policy's final weights are
    those of an uninterrupted run."""
    ref = run_dyna_process(tmp_path / "ref")
    assert ref.returncode == 0, ref.stderr[-3000:]
    out = tmp_path / "killed"
    for fault in ("dyna.before_save:2", "dyna.after_save:1"):  # save 1 is the start's (round 0)
        killed = run_dyna_process(out, fault)
        assert killed.returncode == -9, f"{fault}: exit {killed.returncode}\n{killed.stderr[-3000:]}"
    done = run_dyna_process(out)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "dyna: resumed after round 1" in done.stdout
    summary, reference = (json.loads(p.stdout.strip().splitlines()[-1]) for p in (done, ref))
    assert without_wall(summary["rounds"]) == without_wall(reference["rounds"])
    assert summary["real_env_steps"] == reference["real_env_steps"] > 0
    rows = [json.loads(line) for line in (out / "dyna.jsonl").read_text().splitlines()]
    assert without_wall(rows) == without_wall(reference["rounds"])  # each round once
    from safetensors.torch import load_file  # (its header's key order varies from write to write)

    final = [
        load_file(sorted((d / "policy" / "checkpoints").glob("iter_*"))[-1] / "model.safetensors")
        for d in (out, tmp_path / "ref")
    ]
    assert final[0].keys() == final[1].keys() and all(torch.equal(final[0][k], final[1][k]) for k in final[0])
