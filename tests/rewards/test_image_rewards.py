"""Image rewards: hand-computed values on tiny random-weight real models, and the contract checker
over every registered reward."""

import importlib.util
import io

import pytest
import torch
from PIL import Image

from mmrl.registry import REWARDS
from rewards import WeightedSum, check_reward
from rewards.jpeg import JpegCompressibility, JpegIncompressibility, jpeg_size_kb

GEN = torch.Generator().manual_seed(0)
NOISE = torch.randint(0, 256, (2, 32, 32, 3), dtype=torch.uint8, generator=GEN)
FLAT = torch.full((1, 32, 32, 3), 128, dtype=torch.uint8)
PROMPTS = ["a red cube", "a photo of a dog"]
MEAN = torch.tensor([0.48145466, 0.4578275, 0.40821073])
STD = torch.tensor([0.26862954, 0.26130258, 0.27577711])


def _hand_cos(a, b):
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))


# ----------------------------------------------------------------------------- JPEG
def test_jpeg_size_is_the_pil_file_size():
    img = NOISE[0].numpy()
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=95)
    assert jpeg_size_kb(img) == len(buf.getvalue()) / 1000


def test_jpeg_flat_image_compresses_better_than_noise():
    images = torch.cat([FLAT, NOISE[:1]])
    comp = JpegCompressibility()(images, ["a", "b"])
    incomp = JpegIncompressibility()(images, ["a", "b"])
    assert comp[0] > comp[1] and incomp[0] < incomp[1]
    assert torch.equal(comp, -incomp)
    assert incomp[0].item() == pytest.approx(jpeg_size_kb(FLAT[0].numpy()), abs=1e-6)
    assert JpegIncompressibility(quality=10)(NOISE[:1], ["a"]) < incomp[1]
    with pytest.raises(ValueError, match="quality"):
        JpegCompressibility(quality=0)


def test_weighted_sum_is_the_hand_computed_combination():
    size = torch.tensor([jpeg_size_kb(a.numpy()) for a in NOISE])
    ws = WeightedSum({"c": JpegCompressibility(), "i": JpegIncompressibility()}, weights=[2.0, 0.5])
    out = ws(NOISE, PROMPTS)
    assert torch.allclose(out, 2.0 * -size + 0.5 * size, atol=1e-5)
    parts = ws.parts(NOISE, PROMPTS)
    assert set(parts) == {"c", "i"} and torch.allclose(parts["i"], size, atol=1e-5)


# ----------------------------------------------------------------------------- preprocessing
def test_clip_pixels_normalises_without_resizing_at_the_model_size():
    from rewards.clip_score import clip_pixels

    out = clip_pixels(NOISE, 32, (32, 32), MEAN.tolist(), STD.tolist())
    want = (NOISE.permute(0, 3, 1, 2).float() / 255 - MEAN.view(1, 3, 1, 1)) / STD.view(1, 3, 1, 1)
    assert out.shape == (2, 3, 32, 32) and torch.allclose(out, want, atol=1e-6)


@pytest.mark.parametrize("hw", [(16, 16), (48, 48), (24, 40), (64, 20)])
def test_clip_pixels_resizes_and_crops_any_size(hw):
    from rewards.clip_score import clip_pixels

    flat = torch.full((1, *hw, 3), 51, dtype=torch.uint8)  # 51 / 255 = 0.2 everywhere
    out = clip_pixels(flat, 32, (32, 32), MEAN.tolist(), STD.tolist())
    assert out.shape == (1, 3, 32, 32)
    assert torch.allclose(out, ((0.2 - MEAN) / STD).view(1, 3, 1, 1).expand_as(out), atol=1e-5)


def test_pickscore_pixels_match_the_hf_processor(tiny_hf_clip):
    from rewards.clip_score import clip_pixels
    from rewards.pickscore import image_spec

    _, processor = tiny_hf_clip
    ours = clip_pixels(NOISE, *image_spec(processor.image_processor))
    theirs = processor.image_processor([Image.fromarray(a.numpy()) for a in NOISE], return_tensors="pt")
    assert torch.allclose(ours, theirs["pixel_values"], atol=1e-5)


# ----------------------------------------------------------------------------- CLIP score
def test_clip_score_is_the_hand_cosine(tiny_oc):
    import open_clip

    from rewards.clip_score import CLIPScore, clip_pixels

    model, name = tiny_oc
    reward = CLIPScore(model=model, model_name=name, device="cpu")
    with torch.no_grad():
        img = model.encode_image(clip_pixels(NOISE, 32, (32, 32), MEAN.tolist(), STD.tolist()))
        txt = model.encode_text(open_clip.get_tokenizer(name)(PROMPTS))
    want = _hand_cos(img, txt)
    assert torch.allclose(reward(NOISE, PROMPTS), want, atol=1e-5)
    scaled = CLIPScore(model=model, model_name=name, scale=100.0, device="cpu")(NOISE, PROMPTS)
    assert torch.allclose(scaled, 100 * want, atol=1e-3)


def test_clip_score_loads_a_local_checkpoint(tiny_oc, tmp_path):
    from rewards.clip_score import CLIPScore

    model, name = tiny_oc
    torch.save(model.state_dict(), tmp_path / "tiny.pt")
    loaded = CLIPScore(model_name=name, pretrained=str(tmp_path / "tiny.pt"), device="cpu")
    built = CLIPScore(model=model, model_name=name, device="cpu")
    assert torch.allclose(loaded(NOISE, PROMPTS), built(NOISE, PROMPTS), atol=1e-6)


# ----------------------------------------------------------------------------- PickScore
def test_pickscore_is_logit_scale_times_cosine(tiny_hf_clip):
    from rewards.pickscore import PickScore

    model, processor = tiny_hf_clip
    reward = PickScore(model=model, processor=processor, device="cpu")
    pixels = processor.image_processor([Image.fromarray(a.numpy()) for a in NOISE], return_tensors="pt")
    text = processor.tokenizer(PROMPTS, padding=True, return_tensors="pt")  # padding to the longest
    with torch.no_grad():
        img = model.get_image_features(**pixels).pooler_output
        txt = model.get_text_features(**text).pooler_output
        want = model.logit_scale.exp() * _hand_cos(img, txt)
    assert torch.allclose(reward(NOISE, PROMPTS), want, atol=1e-4)


def test_pickscore_loads_from_a_folder(tiny_hf_clip, tmp_path):
    from mmrl.tiny.tiny_models import tiny_clip_model
    from rewards.pickscore import PickScore

    model, processor = tiny_clip_model(tmp_dir=tmp_path, seed=0)
    loaded = PickScore(model=str(tmp_path), processor=str(tmp_path), device="cpu")
    built = PickScore(model=model, processor=processor, device="cpu")
    assert torch.allclose(loaded(NOISE, PROMPTS), built(NOISE, PROMPTS), atol=1e-5)


# ----------------------------------------------------------------------------- aesthetic
def test_aesthetic_mlp_has_the_published_layout():
    from rewards.aesthetic import AestheticMLP

    state = AestheticMLP(768).state_dict()
    shapes = {k: tuple(v.shape) for k, v in state.items() if k.endswith("weight")}
    assert shapes == {
        "layers.0.weight": (1024, 768),
        "layers.2.weight": (128, 1024),
        "layers.4.weight": (64, 128),
        "layers.6.weight": (16, 64),
        "layers.7.weight": (1, 16),
    }
    assert sum(v.numel() for v in state.values()) == 927_969  # 768*1024+1024 + 1024*128+128 + ... + 16+1


def test_l2_normalize_keeps_zero_rows():
    from rewards.aesthetic import l2_normalize

    out = l2_normalize(torch.tensor([[3.0, 4.0], [0.0, 0.0]]))
    assert torch.allclose(out, torch.tensor([[0.6, 0.8], [0.0, 0.0]]))


def test_aesthetic_is_the_mlp_of_the_normalised_embedding(tiny_oc, tmp_path):
    from rewards.aesthetic import AestheticMLP, AestheticScore
    from rewards.clip_score import clip_pixels

    model, _ = tiny_oc
    torch.manual_seed(0)
    mlp = AestheticMLP(32).eval()
    torch.save(mlp.state_dict(), tmp_path / "aesthetic.pth")
    reward = AestheticScore(model=model, weights=str(tmp_path / "aesthetic.pth"), device="cpu")
    with torch.no_grad():
        emb = model.encode_image(clip_pixels(NOISE, 32, (32, 32), MEAN.tolist(), STD.tolist()))
        want = mlp(emb / emb.norm(dim=-1, keepdim=True)).squeeze(-1)
    assert torch.allclose(reward(NOISE, PROMPTS), want, atol=1e-5)


# ----------------------------------------------------------------------------- checker over the registry
def _has(module):
    return importlib.util.find_spec(module) is not None


@pytest.fixture(scope="module")
def jpeg_server():
    from rewards.http import RewardServer

    server = RewardServer(JpegCompressibility()).start()
    yield server
    server.close()


def _factories(tiny_oc, tiny_hf_clip, server):
    from rewards.aesthetic import AestheticMLP
    from rewards.success_detector import SuccessNet

    oc, oc_name = tiny_oc
    hf_model, hf_proc = tiny_hf_clip
    return {
        "clip_score": lambda: REWARDS.build("clip_score", model=oc, model_name=oc_name, device="cpu"),
        "pickscore": lambda: REWARDS.build("pickscore", model=hf_model, processor=hf_proc, device="cpu"),
        "aesthetic": lambda: REWARDS.build("aesthetic", model=oc, mlp=AestheticMLP(32), device="cpu"),
        "jpeg_compressibility": lambda: REWARDS.build("jpeg_compressibility"),
        "jpeg_incompressibility": lambda: REWARDS.build("jpeg_incompressibility", quality=80),
        "ocr": lambda: REWARDS.build("ocr", det_limit_side_len=64),  # small detector input: fast on 32 px
        "weighted_sum": lambda: REWARDS.build(
            "weighted_sum", {"a": JpegCompressibility(), "b": JpegIncompressibility()}, weights=[1.0, 0.25]
        ),
        "http": lambda: REWARDS.build("http", url=server.url),
        "clip_contrast_goal": lambda: REWARDS.build(
            "clip_contrast_goal", model=oc, model_name=oc_name, negative="a robot that failed to {prompt}", device="cpu"
        ),
        "clip_goal_baseline": lambda: REWARDS.build("clip_goal_baseline", model=oc, model_name=oc_name, device="cpu"),
        "clip_cosine": lambda: REWARDS.build("clip_cosine", model=oc, model_name=oc_name, device="cpu"),
        "vlm_judge": lambda: REWARDS.build(
            "vlm_judge", generate_fn=lambda ims, qs: ["yes" if i.getpixel((0, 0))[0] > 127 else "no" for i in ims]
        ),
        "success_detector": lambda: REWARDS.build("success_detector", model=SuccessNet(image_size=32, ch=8, dim=16)),
        # video rewards that wrap an image reward: the CLIP text-video score over frames, a judged frame strip
        "frame_score": lambda: REWARDS.build(
            "frame_score", reward=REWARDS.build("clip_score", model=oc, model_name=oc_name, device="cpu"), frames=2
        ),
        "frame_judge": lambda: REWARDS.build(
            "frame_judge",
            judge_kwargs={"generate_fn": lambda ims, qs: ["yes" if i.getpixel((0, 0))[0] > 127 else "no" for i in ims]},
        ),
    }


BUILTIN = [
    "clip_score",
    "pickscore",
    "aesthetic",
    "jpeg_compressibility",
    "jpeg_incompressibility",
    "ocr",
    "weighted_sum",
    "http",
    "clip_contrast_goal",
    "clip_goal_baseline",
    "clip_cosine",
    "vlm_judge",
]
# every reward registered by this package: the built-ins above need tiny models injected; any other
# one (added later) is built with its defaults and checked with its own `example_prompts` if it has them
REGISTERED = sorted(set(BUILTIN) | {n for n in REWARDS.names() if str(REWARDS._entries[n].spec).startswith("rewards.")})


def test_builtin_rewards_are_registered():
    assert set(BUILTIN) <= set(REWARDS.names())


@pytest.mark.parametrize("name", REGISTERED)
def test_registered_reward_passes_the_checker(name, tiny_oc, tiny_hf_clip, jpeg_server):
    if name == "ocr" and not _has("rapidocr_onnxruntime"):
        pytest.skip(
            "OCR engine not installed here (pip install rapidocr-onnxruntime); tests/rewards/test_ocr.py "
            "checks the reward with a pure-python engine"
        )
    factory = _factories(tiny_oc, tiny_hf_clip, jpeg_server).get(name, lambda: REWARDS.build(name))
    kind = getattr(factory(), "kind", "image")  # the built reward says (a WeightedSum sets it per instance)
    passed = check_reward(factory, kind=kind)
    assert passed[-1] == "rejects_bad_input" and "batch_invariance" in passed


def test_registered_rewards_describe_themselves():
    described = dict(REWARDS.describe())
    assert all(described[n] for n in BUILTIN)
