"""CLIP language-goal rewards: the formulas on hand-built embeddings, the rewards on a tiny open_clip
model against hand-computed similarities, the contract checker, and episode-level scoring."""

import math

import pytest
import torch

from rewards import Reward, check_reward
from rewards.clip_goal import (
    CLIPContrastGoal,
    CLIPCosine,
    CLIPGoalBaseline,
    contrast_goal_reward,
    goal_baseline_reward,
    score_episode,
)

GEN = torch.Generator().manual_seed(0)
IMAGES = torch.randint(0, 256, (3, 32, 32, 3), dtype=torch.uint8, generator=GEN)
PROMPTS = ["pick up the red cube", "open the drawer", "push the blue block"]
MEAN = [0.48145466, 0.4578275, 0.40821073]
STD = [0.26862954, 0.26130258, 0.27577711]
NEG = "a robot that failed to {prompt}"


# ----------------------------------------------------------------------------- contrast goal (VLM-RL CLG)
def test_contrast_goal_reward_hand_values():
    sim_pos = torch.tensor([0.30, 0.30, 0.30, 0.30, 0.30])
    sim_neg = torch.tensor([0.25, 0.30, 0.315, 0.36, 0.3225])
    # d = sim_neg - sim_pos = [-0.05, 0, 0.015, 0.06, 0.0225] -> clip to [0, 0.03] -> 1 - d / 0.03
    want = torch.tensor([1.0, 1.0, 0.5, 0.0, 0.25])
    assert torch.allclose(contrast_goal_reward(sim_pos, sim_neg), want, atol=1e-5)
    assert torch.allclose(
        contrast_goal_reward(sim_pos, sim_neg, raw=True), torch.tensor([0.05, 0.0, -0.015, -0.06, -0.0225]), atol=1e-6
    )
    # window [0.01, 0.05]: d = 0.03 -> 1 - (0.03 - 0.01) / 0.04 = 0.5 ; d = 0 -> 1 ; d = 0.06 -> 0
    out = contrast_goal_reward(torch.tensor([0.2, 0.2, 0.2]), torch.tensor([0.23, 0.2, 0.26]), t_min=0.01, t_max=0.05)
    assert torch.allclose(out, torch.tensor([0.5, 1.0, 0.0]), atol=1e-5)
    with pytest.raises(ValueError, match="t_max"):
        contrast_goal_reward(sim_pos, sim_neg, t_min=0.1, t_max=0.1)


# ----------------------------------------------------------------------------- goal-baseline (VLM-RM)
E1, E2, E3 = torch.eye(3)


def test_goal_baseline_reward_hand_values():
    g, b = E1, E2  # direction g - b = (1, -1, 0) / sqrt(2)
    s = E3.unsqueeze(0)  # s - g = (-1, 0, 1); its projection on the direction = (-0.5, 0.5, 0)
    assert goal_baseline_reward(s, g, b, 0.0).item() == pytest.approx(0.0, abs=1e-6)  # 1 - 0.5 * 2 = cos(s, g)
    assert goal_baseline_reward(s, g, b, 1.0).item() == pytest.approx(0.75, abs=1e-6)  # 1 - 0.5 * 0.5
    # alpha = 0.5: 0.5 * (-0.5, 0.5, 0) + 0.5 * (-1, 0, 1) = (-0.75, 0.25, 0.5), |.|^2 = 0.875
    assert goal_baseline_reward(s, g, b, 0.5).item() == pytest.approx(1 - 0.4375, abs=1e-6)
    # s = (0.6, 0.8, 0): s - g = (-0.4, 0.8, 0), projection = (-0.6, 0.6, 0), |.|^2 = 0.72
    s2 = torch.tensor([[0.6, 0.8, 0.0]])
    assert goal_baseline_reward(s2, g, b, 1.0).item() == pytest.approx(1 - 0.36, abs=1e-6)
    # inputs are normalised first; s == g gives the maximum 1 for any alpha; batched rows are independent
    both = goal_baseline_reward(torch.stack([3 * E3, 2 * E1]), 5 * g, 0.5 * b, 1.0)
    assert torch.allclose(both, torch.tensor([0.75, 1.0]), atol=1e-6)


def test_goal_baseline_matches_the_dense_projection_of_the_reference_code():
    torch.manual_seed(0)
    s, g, b = torch.randn(4, 8), torch.randn(8), torch.randn(8)
    sn, gn, bn = (x / x.norm(dim=-1, keepdim=True) for x in (s, g, b))
    d = (gn - bn).unsqueeze(0)
    for alpha in (0.0, 0.3, 1.0):
        proj = alpha * (d.T @ d) / d.norm() ** 2 + (1 - alpha) * torch.eye(8)
        want = 1 - (((sn - gn) @ proj).norm(dim=-1) ** 2) / 2
        assert torch.allclose(goal_baseline_reward(s, g, b, alpha), want, atol=1e-5)


def test_goal_baseline_degenerate_direction_and_bad_alpha():
    s = E3.unsqueeze(0)
    # g == b: P = 0, so R = 1 - 0.5 * (1 - alpha)^2 * |s - g|^2 = 1 - 0.5 * 0.25 * 2 at alpha 0.5
    assert goal_baseline_reward(s, E1, E1, 0.5).item() == pytest.approx(0.75, abs=1e-6)
    with pytest.raises(ValueError, match="alpha"):
        goal_baseline_reward(s, E1, E2, 1.5)


# ----------------------------------------------------------------------------- the rewards on a tiny model
def _hand(model, name, images, texts):
    import open_clip

    from rewards.clip_score import clip_pixels

    with torch.no_grad():
        img = model.encode_image(clip_pixels(images, 32, (32, 32), MEAN, STD))
        txt = model.encode_text(open_clip.get_tokenizer(name)(texts))
    return img / img.norm(dim=-1, keepdim=True), txt / txt.norm(dim=-1, keepdim=True)


def test_contrast_goal_is_the_formula_on_hand_similarities(tiny_oc):
    model, name = tiny_oc
    img, pos = _hand(model, name, IMAGES, PROMPTS)
    _, neg = _hand(model, name, IMAGES, [NEG.format(prompt=p) for p in PROMPTS])
    sim_pos, sim_neg = (img * pos).sum(-1), (img * neg).sum(-1)
    wide = CLIPContrastGoal(model=model, model_name=name, negative=NEG, t_min=-2.0, t_max=2.0, device="cpu")
    assert torch.allclose(wide(IMAGES, PROMPTS), 1 - (sim_neg - sim_pos + 2) / 4, atol=1e-5)
    raw = CLIPContrastGoal(model=model, model_name=name, negative=NEG, raw=True, device="cpu")
    assert torch.allclose(raw(IMAGES, PROMPTS), sim_pos - sim_neg, atol=1e-5)
    default = CLIPContrastGoal(model=model, model_name=name, negative=NEG, device="cpu")
    assert torch.allclose(default(IMAGES, PROMPTS), contrast_goal_reward(sim_pos, sim_neg), atol=1e-4)


def test_contrast_goal_meta_overrides_and_missing_negative(tiny_oc):
    model, name = tiny_oc
    meta = [{"positive_goal": "the cube is lifted", "negative_goal": "the cube fell"}] * 3
    img, pos = _hand(model, name, IMAGES, ["the cube is lifted"] * 3)
    _, neg = _hand(model, name, IMAGES, ["the cube fell"] * 3)
    reward = CLIPContrastGoal(model=model, model_name=name, raw=True, device="cpu")  # no negative template
    assert torch.allclose(reward(IMAGES, PROMPTS, meta), ((img * pos) - (img * neg)).sum(-1), atol=1e-5)
    with pytest.raises(ValueError, match="negative"):
        reward(IMAGES, PROMPTS)
    with pytest.raises(ValueError, match="t_max"):
        CLIPContrastGoal(model=model, model_name=name, t_min=0.5, t_max=0.1, device="cpu")


def test_goal_baseline_reward_on_the_model(tiny_oc):
    model, name = tiny_oc
    img, goal = _hand(model, name, IMAGES, PROMPTS)
    _, base = _hand(model, name, IMAGES, ["a robot arm"] * 3)
    reward = CLIPGoalBaseline(model=model, model_name=name, alpha=0.7, device="cpu")
    assert torch.allclose(reward(IMAGES, PROMPTS), goal_baseline_reward(img, goal, base, 0.7), atol=1e-5)
    # alpha = 0 is the plain cosine to the goal
    flat = CLIPGoalBaseline(model=model, model_name=name, alpha=0.0, device="cpu")
    assert torch.allclose(flat(IMAGES, PROMPTS), (img * goal).sum(-1), atol=1e-5)
    with pytest.raises(ValueError, match="alpha"):
        CLIPGoalBaseline(model=model, model_name=name, alpha=-0.1, device="cpu")


def test_clip_cosine_is_clip_score(tiny_oc):
    from rewards.clip_score import CLIPScore

    model, name = tiny_oc
    img, txt = _hand(model, name, IMAGES, PROMPTS)
    cos = CLIPCosine(model=model, model_name=name, device="cpu")(IMAGES, PROMPTS)
    assert torch.allclose(cos, (img * txt).sum(-1), atol=1e-5)
    assert torch.allclose(cos, CLIPScore(model=model, model_name=name, device="cpu")(IMAGES, PROMPTS), atol=1e-6)


@pytest.mark.parametrize("name", ["clip_contrast_goal", "clip_goal_baseline", "clip_cosine"])
def test_goal_rewards_pass_the_checker(name, tiny_oc):
    from mmrl.registry import REWARDS

    model, model_name = tiny_oc
    extra = {"clip_contrast_goal": {"negative": NEG}}.get(name, {})
    passed = check_reward(lambda: REWARDS.build(name, model=model, model_name=model_name, device="cpu", **extra))
    assert passed[-1] == "rejects_bad_input" and "batch_invariance" in passed


# ----------------------------------------------------------------------------- episodes
class MeanPixel(Reward):
    name = "mean_pixel"

    def score(self, images, prompts, meta):
        return images.float().mean(dim=(1, 2, 3))


def test_score_episode_hand_values():
    frames = torch.zeros(2, 3, 8, 8, 3, dtype=torch.uint8)
    for t, v in enumerate((10, 20, 60)):
        frames[0, t] = v
        frames[1, t] = 2 * v
    assert torch.allclose(score_episode(MeanPixel(), frames, ["a", "b"], mode="final"), torch.tensor([60.0, 120.0]))
    assert torch.allclose(score_episode(MeanPixel(), frames, ["a", "b"], mode="mean"), torch.tensor([30.0, 60.0]))
    with pytest.raises(ValueError, match="mode"):
        score_episode(MeanPixel(), frames, ["a", "b"], mode="max")
    with pytest.raises(ValueError, match=r"\[B, T, H, W, 3\]"):
        score_episode(MeanPixel(), frames[:, 0], ["a", "b"])
    with pytest.raises(ValueError, match="prompts"):
        score_episode(MeanPixel(), frames, ["a"])


def test_clip_goal_score_episode(tiny_oc):
    model, name = tiny_oc
    reward = CLIPContrastGoal(model=model, model_name=name, negative=NEG, raw=True, device="cpu")
    frames = torch.randint(0, 256, (2, 4, 32, 32, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    prompts = PROMPTS[:2]
    per_frame = torch.stack([reward(frames[:, t], prompts) for t in range(4)], dim=1)
    final = reward.score_episode(frames, prompts, mode="final")
    mean = reward.score_episode(frames, prompts, mode="mean")
    assert final.dtype == torch.float32 and final.shape == (2,)
    assert torch.allclose(final, per_frame[:, -1], atol=1e-6)
    assert torch.allclose(mean, per_frame.mean(dim=1), atol=1e-6)
    assert not math.isclose(mean[0].item(), final[0].item(), abs_tol=1e-7)
