"""SemanticRewardSim: the contract checker with a tiny random open_clip, rewards written at the right
steps (hand-checked with a stub image reward: the mean pixel value of the frame), success passed
through, synthesis modes, goal meta from the instruction, and loading the pretrained tiny CLIP by
name."""

import pytest
import torch

from mmrl.registry import SIMULATORS
from mmrl.reward import Reward
from mmrl.checks.simulator import check_simulator
from simulators.reach import ReachSim
from simulators.semantic import SemanticRewardSim

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


def make(n=4, **kw):
    kw.setdefault("reward", MeanPixel())
    kw.setdefault("base_kwargs", BASE)
    return SemanticRewardSim(num_envs=n, base="reach", **kw)


def twin(n=4, **base):
    """The wrapped simulator alone, built as the wrapper builds it."""
    return ReachSim(num_envs=n, seed=0, **{**BASE, **base})


def test_registered():
    assert SIMULATORS.get("semantic") is SemanticRewardSim


@pytest.mark.parametrize("timing,mode", [("episode_end", "final"), ("step", "final"), ("episode_end", "mean")])
def test_passes_the_checker_with_a_tiny_open_clip(timing, mode):
    from mmrl.tiny.tiny_models import tiny_open_clip
    from rewards.clip_goal import CLIPContrastGoal

    reward = CLIPContrastGoal(model=tiny_open_clip(seed=0), positive=None, negative=None, t_min=-0.1, t_max=0.1)
    meta = {"positive_goal": "the gripper is on the {color} target",
            "negative_goal": "the gripper is far from the {color} target"}

    def factory():
        return make(4, reward=reward, timing=timing, episode_mode=mode, goal_meta=meta, instruction_pattern=PATTERN)

    passed = check_simulator(factory, verbose=False)
    assert {"state_roundtrip", "chunk_mid_episode_end", "truncation", "auto_reset"} <= set(passed)
    assert passed.action_bounds == "clipped"


def test_built_by_name_from_the_registry():
    from mmrl.tiny.tiny_models import register_tiny_open_clip

    name = register_tiny_open_clip()
    rng = torch.get_rng_state()
    sim = SIMULATORS.build("semantic", num_envs=2, seed=0, base_kwargs=BASE, reward="clip_cosine",
                           reward_kwargs={"model_name": name, "pretrained": None}, timing="step")
    assert torch.equal(torch.get_rng_state(), rng)  # building the reward model leaves the global RNG alone
    sim.reset(0)
    res = sim.step(torch.zeros(2, 2))
    assert res.reward.shape == (2,) and torch.isfinite(res.reward).all()
    assert sim.image_shape == (32, 32, 3) and sim.state_dim == 2 and sim.action_dim == 2


def test_episode_end_final_writes_the_last_frame_score_to_the_final_step():
    sim, ref = make(4), twin(4)
    sim.reset(7)
    ref.reset(7)
    gen = torch.Generator().manual_seed(0)
    seen_done = 0
    for _ in range(12):  # > max_episode_steps: every env ends at least once
        a = torch.rand(4, 3, 2, generator=gen) * 2 - 1
        res, want = sim.step_chunk(a), ref.step_chunk(a)
        assert torch.equal(res.success, want.success) and torch.equal(res.terminated, want.terminated)
        assert torch.equal(res.truncated, want.truncated) and torch.equal(res.obs.image, want.obs.image)
        done = want.done
        expect = torch.zeros(4)
        if done.any():
            expect[done] = mean_pixel(want.final_obs.image[done])
            seen_done += int(done.sum())
        assert torch.allclose(res.reward, expect, atol=1e-6)  # 0 before the end, the final frame's score at it
        assert torch.allclose(res.info["semantic_reward"], expect, atol=1e-6)
        assert torch.allclose(res.info["base_reward"], want.reward)
    assert seen_done >= 4


def test_episode_end_scores_all_ending_envs_in_one_batch_with_their_instructions():
    reward = MeanPixel()
    sim, ref = make(6, reward=reward), twin(6)
    sim.reset(3)
    obs = ref.reset(3)
    ins = list(obs.instruction)
    a = torch.ones(6, 1, 2)
    for _ in range(BASE["max_episode_steps"] + 1):
        res = sim.step_chunk(a)
        if res.done.any():
            break
    size, prompts, _ = reward.calls[-1]
    rows = res.done.nonzero().flatten().tolist()
    assert len(reward.calls) == 1 and size == len(rows)  # one batch, only at the end
    assert prompts == [ins[i] for i in rows]  # the finished episodes' instructions, not the next ones'


def test_episode_end_mean_averages_the_frames_of_the_episode():
    sim, ref = make(3, episode_mode="mean"), twin(3)
    sim.reset(11)
    ref.reset(11)
    gen = torch.Generator().manual_seed(1)
    frames = [[] for _ in range(3)]
    checked = 0
    for _ in range(25):
        a = torch.rand(3, 1, 2, generator=gen) * 2 - 1
        res, want = sim.step(a[:, 0]), ref.step(a[:, 0])
        img = want.obs.image.clone()
        if want.done.any():
            img[want.done] = want.final_obs.image[want.done]
        for i in range(3):
            frames[i].append(mean_pixel(img[i: i + 1])[0])
            if want.done[i]:
                assert res.reward[i].item() == pytest.approx(torch.stack(frames[i]).mean().item(), abs=1e-6)
                frames[i] = []
                checked += 1
            else:
                assert res.reward[i].item() == 0.0
    assert checked >= 3


def test_step_timing_scores_every_step_frame_within_a_chunk():
    sim, ref = make(4, timing="step"), twin(4)
    sim.reset(5)
    ref.reset(5)
    gen = torch.Generator().manual_seed(2)
    for _ in range(6):
        a = torch.rand(4, 3, 2, generator=gen) * 2 - 1
        snap = ref.get_state()
        alive, expect = torch.ones(4, dtype=torch.bool), torch.zeros(4)
        for i in range(3):  # the reference: one step at a time, frames of the envs still in their episode
            r = ref.step(a[:, i])
            img = r.obs.image.clone()
            if r.done.any():
                img[r.done] = r.final_obs.image[r.done]
            expect += torch.where(alive, mean_pixel(img), torch.zeros(4))
            alive &= ~r.done
        ref.set_state(snap)
        want = ref.step_chunk(a)
        res = sim.step_chunk(a)
        assert torch.allclose(res.reward, expect, atol=1e-5)
        assert torch.equal(res.success, want.success) and torch.equal(res.done, want.done)


def test_success_passes_through_and_never_enters_the_semantic_reward():
    sim = make(8, reward=MeanPixel())
    sim.reset(0)
    total_success = 0
    for _ in range(10):
        res = sim.step_chunk(sim.base.expert_chunk(4))
        total_success += int(res.success.sum())
        done = res.done
        if done.any():  # the reward is the frame score, whatever success says
            assert torch.allclose(res.reward[done], mean_pixel(res.final_obs.image[done]), atol=1e-6)
    assert total_success >= 8  # the expert succeeds, and the wrapper reports it


@pytest.mark.parametrize("synthesis,failure,expected", [
    # semantic s = mean pixel, base reward b = 1 on success, success flag; hand-computed per row
    ({"mode": "weighted", "weights": {"semantic": 2.0, "base": 0.5}}, None, lambda s, b, ok, tr: 2 * s + 0.5 * b),
    ({"mode": "weighted", "weights": {"semantic": 1.0, "step_cost": 0.25}}, None, lambda s, b, ok, tr: s - 0.25),
    ({"mode": "gated", "gate": "success"}, None, lambda s, b, ok, tr: s * ok),
    ({"mode": "weighted", "weights": {"semantic": 1.0}, "failure_penalty": -3.0}, "truncated",
     lambda s, b, ok, tr: torch.where(tr.bool(), torch.full_like(s, -3.0), s)),
])
def test_synthesis_modes(synthesis, failure, expected):
    fast = {"max_episode_steps": 3, "max_speed": 0.4}  # the expert reaches near discs only: success and time-outs
    sim = make(8, timing="step", synthesis=synthesis, failure_term=failure, base_kwargs=fast)
    ref = twin(8, **fast)
    sim.reset(0)
    ref.reset(0)
    seen = torch.zeros(2)
    for t in range(6):
        a = ref.expert_action()
        res, want = sim.step(a), ref.step(a)
        seen += torch.stack([want.success.sum(), want.truncated.sum()])
        img = want.obs.image.clone()
        if want.done.any():
            img[want.done] = want.final_obs.image[want.done]
        s = mean_pixel(img)
        want_r = expected(s, want.reward, want.success.float(), want.truncated.float())
        assert torch.allclose(res.reward, want_r, atol=1e-6), (t, res.reward, want_r)
        assert torch.equal(res.success, want.success)
    assert (seen > 0).all()


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="timing"):
        make(timing="sometimes")
    with pytest.raises(ValueError, match="episode_mode"):
        make(episode_mode="median")
    with pytest.raises(ValueError, match="unknown term"):
        make(synthesis={"mode": "weighted", "weights": {"semantic": 1.0, "speed": 1.0}})
    with pytest.raises(ValueError, match="unknown synthesis mode"):
        make(synthesis={"mode": "product"})
    sim = make(2, goal_meta={"positive_goal": "on the {colour} target"}, instruction_pattern=PATTERN)
    with pytest.raises(ValueError, match="colour"):
        sim.meta_for(["reach the red target"])


def test_goal_meta_from_the_instruction():
    reward = MeanPixel()
    sim = make(3, reward=reward, timing="step", instruction_pattern=PATTERN,
               goal_meta={"positive_goal": "the gripper is on the {color} target", "negative_goal": "not {instruction}"})
    obs = sim.reset(0)
    sim.step(torch.zeros(3, 2))
    _, prompts, meta = reward.calls[-1]
    assert prompts == obs.instruction
    for text, m in zip(prompts, meta):
        color = text.split()[2]
        assert m == {"positive_goal": f"the gripper is on the {color} target", "negative_goal": f"not {text}"}
    with pytest.raises(ValueError, match="does not match"):
        make(2, goal_meta={"g": "{color}"}, instruction_pattern="(?P<color>magenta)").meta_for(["reach the red target"])


def test_tiny_clip_training_saves_a_loadable_model(tmp_path):
    """The pretrained tiny CLIP loads by name as configs load it and scores like the built model;
    its dataset and pretraining are tested in tests/rewards/test_reach_clip_pretraining.py."""
    from mmrl.data import load_dataset
    from rewards.clip_goal import CLIPContrastGoal
    from rewards.train_tiny_clip import goal_meta, goal_reward_stats, load_model, train_tiny_clip

    pairs = load_dataset("reach_clip", num_samples=64, seed=0)
    _, info = train_tiny_clip(pairs, tmp_path / "clip", steps=3, batch_size=16, log_every=0)
    assert info["steps"] == 3
    frames = load_dataset("reach_clip", num_samples=64, seed=1, labelled=True)
    model, tok = load_model(tmp_path / "clip")
    reward = CLIPContrastGoal(model=model, tokenizer=tok, positive=None, negative=None, t_min=-0.1, t_max=0.1)
    stats = goal_reward_stats(reward, frames)
    assert stats["n"] == 64 and -1 <= stats["corr_success"] <= 1
    by_name = CLIPContrastGoal(model_name=f"local-dir:{tmp_path / 'clip'}", pretrained=None, positive=None,
                               negative=None, t_min=-0.1, t_max=0.1)  # how configs load it
    meta = goal_meta(frames["instruction"][:4])
    assert torch.allclose(by_name(frames["image"][:4], frames["instruction"][:4], meta),
                          reward(frames["image"][:4], frames["instruction"][:4], meta))
