"""Image rewards on the frames a robot simulator renders, in the trainer's reward stage (``frame``
kind): the simulator's step trace, rewards written at the right steps (hand-checked with a stub
image reward, the mean pixel value of the frame), success passed through, the combinations with the
simulator's terms, goal meta from the instruction, and the whole path through the trainer with a
tiny open_clip, in process and behind sim workers."""

from __future__ import annotations

import pytest
import torch

from mmrl.algorithms.reward_synthesis import RewardSynthesis
from mmrl.config import ConfigError
from mmrl.experiment import build_trainer, load_experiment
from mmrl.reward import Reward
from mmrl.trainer.reward_stage import FrameScoring, RewardStage
from simulators.reach import ReachSim

BASE = {"max_episode_steps": 10}
PATTERN = "(?P<color>red|green|blue|yellow|purple|cyan|orange|pink)"


class MeanPixel(Reward):
    """Stub image reward: mean pixel value / 255 of each frame; records what it was asked."""

    name = "mean_pixel"
    kind = "image"

    def __init__(self):
        self.calls = []

    def score(self, images, prompts, meta):
        self.calls.append((images.shape[0], list(prompts), list(meta)))
        return images.float().mean(dim=(1, 2, 3)) / 255.0


def mean_pixel(img: torch.Tensor) -> torch.Tensor:
    return img.float().mean(dim=(-1, -2, -3)) / 255.0


def stage(model=None, combine=None, failure_term=None, **frames) -> RewardStage:
    return RewardStage(
        model or MeanPixel(),
        "frame",
        combine=combine or RewardSynthesis(weights={"model": 1.0}),
        failure_term=failure_term,
        frames=FrameScoring(**frames),
    )


def twin(n=4, **kw) -> ReachSim:
    return ReachSim(num_envs=n, seed=0, **{**BASE, **kw})


def scored(st: RewardStage, sim: ReachSim, obs, actions, episodes=None):
    """One decision as the collectors make it: a traced step, then the stage (every env recorded)."""
    res = sim.step_chunk(actions, trace=True)
    return st(res, obs, actions, torch.ones(sim.num_envs, dtype=torch.bool), episodes)


def final_frames(res) -> torch.Tensor:
    img = res.obs.image.clone()
    if res.done.any():
        img[res.done] = res.final_obs.image[res.done]
    return img


def test_the_step_trace_is_what_one_step_at_a_time_shows():
    sim, ref = twin(4), twin(4)
    sim.reset(3)
    ref.reset(3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        a = torch.rand(4, 3, 2, generator=gen) * 2 - 1
        res = sim.step_chunk(a, trace=True)
        tr = res.info["trace"]
        alive = torch.ones(4, dtype=torch.bool)
        for k in range(tr["active"].shape[1]):
            r = ref.step(a[:, k])
            assert torch.equal(tr["active"][:, k], alive)
            assert torch.equal(tr["image"][alive, k], final_frames(r)[alive])
            assert torch.equal(tr["reward"][alive, k], r.reward[alive])
            alive &= ~r.done
        assert torch.equal(res.obs.image, r.obs.image) if alive.any() else True
        assert torch.equal(tr["active"].sum(1), res.info["num_steps"])


def test_episode_end_final_writes_the_last_frame_score_to_the_final_step():
    st, sim, ref = stage(), twin(4), twin(4)
    obs = sim.reset(7)
    ref.reset(7)
    gen = torch.Generator().manual_seed(0)
    seen_done = 0
    for _ in range(12):  # > max_episode_steps: every env ends at least once
        a = torch.rand(4, 3, 2, generator=gen) * 2 - 1
        res, want = scored(st, sim, obs, a), ref.step_chunk(a)
        assert torch.equal(res.success, want.success) and torch.equal(res.done, want.done)
        assert torch.equal(res.obs.image, want.obs.image)
        expect = torch.zeros(4)
        if want.done.any():
            expect[want.done] = mean_pixel(want.final_obs.image[want.done])
            seen_done += int(want.done.sum())
        assert torch.allclose(res.reward, expect, atol=1e-6)  # 0 before the end, the final frame's score at it
        obs = res.obs
    assert seen_done >= 4


def test_episode_end_scores_the_ending_envs_with_their_instructions():
    model = MeanPixel()
    st, sim = stage(model), twin(6)
    obs = sim.reset(3)
    ins = list(obs.instruction)
    a = torch.ones(6, 1, 2)
    for _ in range(BASE["max_episode_steps"] + 1):
        res = scored(st, sim, obs, a)
        if res.done.any():
            break
    size, prompts, _ = model.calls[-1]
    rows = res.done.nonzero().flatten().tolist()
    assert len(model.calls) == 1 and size == len(rows)  # one batch, only at the end
    assert prompts == [ins[i] for i in rows]  # the finished episodes' instructions, not the next ones'


def test_episode_end_mean_averages_the_frames_of_the_episode():
    st, sim, ref = stage(episode_mode="mean"), twin(3), twin(3)
    episodes = st.episode_scores(3)
    obs = sim.reset(11)
    ref.reset(11)
    gen = torch.Generator().manual_seed(1)
    frames = [[] for _ in range(3)]
    checked = 0
    for _ in range(25):
        a = torch.rand(3, 1, 2, generator=gen) * 2 - 1
        res, want = scored(st, sim, obs, a, episodes), ref.step(a[:, 0])
        img = final_frames(want)
        for i in range(3):
            frames[i].append(mean_pixel(img[i : i + 1])[0])
            if want.done[i]:
                assert res.reward[i].item() == pytest.approx(torch.stack(frames[i]).mean().item(), abs=1e-6)
                frames[i] = []
                checked += 1
            else:
                assert res.reward[i].item() == 0.0
        obs = res.obs
    assert checked >= 3
    assert st.episode_scores(2) is not None and stage().episode_scores(2) is None  # only mean mode keeps state


def test_potential_shaping_pays_each_frame_its_change_since_the_previous_one():
    """Each step earns its frame's score minus the episode's previous frame's (0 for an episode's
    first frame), across decisions and through resets: over an episode the payments sum to the
    last frame's score minus the first's, whatever route it took (the shaping cannot pay lingering)."""
    st, sim, ref = stage(timing="step", shaping="potential"), twin(3), twin(3)
    episodes = st.episode_scores(3)
    obs = sim.reset(11)
    ref.reset(11)
    gen = torch.Generator().manual_seed(1)
    frames: list[list[float]] = [[] for _ in range(3)]
    paid = [0.0] * 3
    ended = 0
    for _ in range(25):
        a = torch.rand(3, 1, 2, generator=gen) * 2 - 1
        res, want = scored(st, sim, obs, a, episodes), ref.step(a[:, 0])
        img = final_frames(want)
        for i in range(3):
            now = mean_pixel(img[i : i + 1])[0].item()
            expect = now - frames[i][-1] if frames[i] else 0.0
            assert res.reward[i].item() == pytest.approx(expect, abs=1e-6)
            frames[i].append(now)
            paid[i] += res.reward[i].item()
            if want.done[i]:
                assert paid[i] == pytest.approx(frames[i][-1] - frames[i][0], abs=1e-5)
                frames[i], paid[i] = [], 0.0
                ended += 1
        obs = res.obs
    assert ended >= 3
    # the running potential is the collector's state: saved and restored with its episodes
    saved = episodes.state_dict()
    again = st.episode_scores(3)
    again.load_state_dict(saved)
    assert torch.equal(again.last, episodes.last) and torch.equal(again.count, episodes.count)


def test_potential_shaping_needs_step_timing(tmp_path):
    with pytest.raises(ValueError, match="needs timing 'step'"):
        FrameScoring(shaping="potential")
    with pytest.raises(ConfigError, match="set timing: step"):
        clip_cfg(tmp_path, "reward.frames={shaping: potential}")


def test_step_timing_scores_every_step_frame_within_a_chunk():
    st, sim, ref = stage(timing="step"), twin(4), twin(4)
    obs = sim.reset(5)
    ref.reset(5)
    gen = torch.Generator().manual_seed(2)
    for _ in range(6):
        a = torch.rand(4, 3, 2, generator=gen) * 2 - 1
        snap = ref.get_state()
        alive, expect = torch.ones(4, dtype=torch.bool), torch.zeros(4)
        for i in range(3):  # the reference: one step at a time, frames of the envs still in their episode
            r = ref.step(a[:, i])
            expect += torch.where(alive, mean_pixel(final_frames(r)), torch.zeros(4))
            alive &= ~r.done
        ref.set_state(snap)
        want = ref.step_chunk(a)
        res = scored(st, sim, obs, a)
        assert torch.allclose(res.reward, expect, atol=1e-5)
        assert torch.equal(res.success, want.success) and torch.equal(res.done, want.done)
        obs = res.obs


def test_only_the_recorded_envs_are_scored():
    model = MeanPixel()
    st, sim = stage(model, timing="step"), twin(4)
    obs = sim.reset(0)
    res = sim.step_chunk(torch.zeros(4, 2, 2), trace=True)
    st(res, obs, None, torch.tensor([True, False, True, False]))
    assert [c[0] for c in model.calls] == [2, 2]  # two envs per step, the two the collector records


def test_success_passes_through_and_never_enters_the_frame_reward():
    st, sim = stage(), twin(8)
    obs = sim.reset(0)
    total_success = 0
    for _ in range(10):
        res = scored(st, sim, obs, sim.expert_chunk(4))
        total_success += int(res.success.sum())
        if res.done.any():  # the reward is the frame score, whatever success says
            assert torch.allclose(res.reward[res.done], mean_pixel(res.final_obs.image[res.done]), atol=1e-6)
        obs = res.obs
    assert total_success >= 8  # the expert succeeds, and the stage leaves it as the simulator reports it


@pytest.mark.parametrize(
    "combine,failure,expected",
    [
        # score s = mean pixel, task reward b = 1 on success, success flag; hand-computed per row
        ({"weights": {"model": 2.0, "task": 0.5}}, None, lambda s, b, ok, tr: 2 * s + 0.5 * b),
        ({"weights": {"model": 1.0, "step_cost": 0.25}}, None, lambda s, b, ok, tr: s - 0.25),
        ({"weights": {"model": 1.0, "task": 1.0}}, None, lambda s, b, ok, tr: s + b),  # the default combination
        ({"mode": "gated", "gate": "success"}, None, lambda s, b, ok, tr: s * ok),
        (
            {"weights": {"model": 1.0}, "failure_penalty": -3.0},
            "truncated",
            lambda s, b, ok, tr: torch.where(tr.bool(), torch.full_like(s, -3.0), s),
        ),
    ],
)
def test_combinations_with_the_simulator_terms(combine, failure, expected):
    fast = {"max_episode_steps": 3, "max_speed": 0.4}  # the expert reaches near discs only: success and time-outs
    st = stage(combine=RewardSynthesis(**combine), failure_term=failure, timing="step")
    sim, ref = twin(8, **fast), twin(8, **fast)
    obs = sim.reset(0)
    ref.reset(0)
    seen = torch.zeros(2)
    for t in range(6):
        a = ref.expert_action()
        res, want = scored(st, sim, obs, a[:, None]), ref.step(a)
        seen += torch.stack([want.success.sum(), want.truncated.sum()])
        s = mean_pixel(final_frames(want))
        want_r = expected(s, want.reward, want.success.float(), want.truncated.float())
        assert torch.allclose(res.reward, want_r, atol=1e-6), (t, res.reward, want_r)
        assert torch.equal(res.success, want.success)
        obs = res.obs
    assert (seen > 0).all()


def test_goal_meta_from_the_instruction():
    model = MeanPixel()
    st, sim = (
        stage(
            model,
            timing="step",
            instruction_pattern=PATTERN,
            goal_meta={"positive_goal": "the gripper is on the {color} target", "negative_goal": "not {instruction}"},
        ),
        twin(3),
    )
    obs = sim.reset(0)
    scored(st, sim, obs, torch.zeros(3, 1, 2))
    _, prompts, meta = model.calls[-1]
    assert prompts == obs.instruction
    for text, m in zip(prompts, meta):
        color = text.split()[2]
        assert m == {"positive_goal": f"the gripper is on the {color} target", "negative_goal": f"not {text}"}
    with pytest.raises(ValueError, match="does not match"):
        FrameScoring(goal_meta={"g": "{color}"}, instruction_pattern="(?P<color>magenta)").meta_for(
            ["reach the red target"]
        )
    with pytest.raises(ValueError, match="colour"):
        FrameScoring(goal_meta={"g": "on the {colour} target"}, instruction_pattern=PATTERN).meta_for(
            ["reach the red target"]
        )


def test_a_simulator_without_a_trace_is_named():
    from mmrl.reward import RewardError

    class NoTrace(ReachSim):  # a step_chunk override that drops the trace argument
        def step_chunk(self, actions):
            return super().step_chunk(actions)

    with pytest.raises(ValueError, match="NoTrace.step_chunk takes no trace="):  # when the trainer is built
        stage().check_simulator(NoTrace(num_envs=2, **BASE))
    stage().check_simulator(twin(2))
    sim = twin(2)
    obs = sim.reset(0)
    with pytest.raises(RewardError, match="returned no step trace: its step_chunk must take trace=True"):
        stage()(sim.step_chunk(torch.zeros(2, 1, 2)), obs, None, torch.ones(2, dtype=torch.bool))


# ---- through the config and the trainer ------------------------------------------------------
def clip_cfg(tmp_path, *extra):
    from mmrl.tiny.tiny_models import register_tiny_open_clip

    name = register_tiny_open_clip()
    return load_experiment(
        None,
        [
            f"run.output_dir={tmp_path}",
            "run.name=r",
            "sim.num_envs=4",
            "sim.eval_num_envs=4",
            "sim.kwargs={image_size: 16, max_episode_steps: 8}",
            f"reward={{type: clip_cosine, kwargs: {{model_name: {name}, pretrained: null}}, "
            "combine: {weights: {model: 1.0}}}",
            "policy.backbone=tiny",
            "policy.chunk_size=4",
            "policy.num_steps=2",
            "algorithm.minibatch_size=8",
            "algorithm.epochs=1",
            "trainer.iterations=1",
            "trainer.eval_episodes=4",
            "trainer.video_episodes=0",
            "warm_start.dataset=null",
            "run.threads=1",
            *extra,
        ],
    )


def test_bad_frame_settings_fail_at_load_with_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="'reward.frames.timing' = 'sometimes' is not one of: episode_end, step"):
        clip_cfg(tmp_path, "reward.frames={timing: sometimes}")
    with pytest.raises(ConfigError, match=r"names unknown term\(s\) \['speed'\]"):
        clip_cfg(tmp_path, "reward.combine={weights: {model: 1.0, speed: 1.0}}")
    with pytest.raises(ConfigError, match="reward.combine.mode"):
        clip_cfg(tmp_path, "reward.combine.mode=product")
    with pytest.raises(ConfigError, match="success_threshold' applies to single-turn rewards"):
        clip_cfg(tmp_path, "reward.success_threshold=0.5")
    with pytest.raises(ConfigError, match="instruction_pattern"):
        clip_cfg(tmp_path, "reward.frames={instruction_pattern: '(?P<color'}")


def test_a_clip_reward_trains_the_quickstart_policy_in_process_and_behind_sim_workers(tmp_path):
    """The stage scores the frames the simulator returns, wherever it runs: a sim worker returns the
    same step traces, so the disaggregated run collects the same rewards; the model is built once
    (training and evaluation share it) and leaves the global RNG alone."""
    from mmrl.trainer import reward_stage

    got = {}
    for mode in ("collocated", "disaggregated"):
        reward_stage._MODELS.clear()
        trainer = build_trainer(clip_cfg(tmp_path / mode, f"placement.mode={mode}", "reward.frames={timing: step}"))
        assert len(reward_stage._MODELS) == 1  # one model for the run
        try:
            trainer.policy.eval()
            batch, info = trainer.collector.collect(trainer.policy, 0, torch.Generator().manual_seed(0))
        finally:
            trainer.close()
        got[mode] = batch["rewards"]
        rng = torch.get_rng_state()
        same = reward_stage.reward_model(trainer.cfg.reward.type, dict(trainer.cfg.reward.kwargs))
        assert same is trainer.reward_stage.model  # built once per process (mmrl eval reuses it)
        reward_stage._MODELS.clear()
        assert reward_stage.reward_model(trainer.cfg.reward.type, dict(trainer.cfg.reward.kwargs)) is not same
        assert torch.equal(torch.get_rng_state(), rng)  # building a model leaves the global RNG alone
    assert got["collocated"].abs().sum() > 0 and torch.isfinite(got["collocated"]).all()
    assert torch.equal(got["collocated"], got["disaggregated"])
    results = build_trainer(clip_cfg(tmp_path / "run")).run()  # the whole loop: RL iteration, evaluations, logs
    assert results["final"]["iteration"] == 1


def test_potential_shaping_collects_the_same_rewards_in_every_placement(tmp_path):
    """The running score lives in the collector's per-env state, which the in-process collector, the
    sim workers and the pipelined stages each keep: the same shaped rewards behind sim workers as in
    process, and they are the score's changes (a step earns a difference, so they are not all of one
    sign); the pipelined stages (whose rollouts differ by design) shape theirs too."""
    from mmrl.trainer import reward_stage

    got = {}
    for mode, stages in (("collocated", 1), ("disaggregated", 1), ("hybrid", 2)):
        reward_stage._MODELS.clear()
        cfg = clip_cfg(
            tmp_path / mode,
            f"placement.mode={mode}",
            f"placement.stages={stages}",
            "reward.frames={timing: step, shaping: potential}",
        )
        trainer = build_trainer(cfg)
        try:
            trainer.policy.eval()
            batch, _ = trainer.collector.collect(trainer.policy, 0, torch.Generator().manual_seed(0))
        finally:
            trainer.close()
        got[mode] = batch["rewards"]
    for r in got.values():
        assert (r > 0).any() and (r < 0).any() and torch.isfinite(r).all() and r.abs().max() < 1
    assert torch.equal(got["collocated"], got["disaggregated"])
