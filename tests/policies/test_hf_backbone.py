"""HFImageTextBackbone on a tiny random-weight Idefics3 (SmolVLM) saved and reloaded offline."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("PIL")

from mmrl.policies.hf_backbone import HFImageTextBackbone, images_to_pil
from mmrl.tiny.tiny_models import IMAGE_SEQ_LEN, IMAGE_SIZE, tiny_image_text_model
from mmrl.utils.compat import patch_torchvision

INSTRUCTIONS = ["pick up the red cube", "push", "open the green drawer to the left"]


@pytest.fixture(scope="module")
def saved_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_idefics3")
    tiny_image_text_model(path)
    return path


@pytest.fixture(scope="module")
def backbone(saved_dir):
    return HFImageTextBackbone.from_pretrained(saved_dir)


def _images(*lead: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (*lead, IMAGE_SIZE, IMAGE_SIZE, 3), dtype=torch.uint8, generator=g)


def test_from_pretrained_forward_shapes(backbone):
    assert type(backbone.model).__name__ == "Idefics3ForConditionalGeneration"
    assert backbone.out_dim == backbone.model.config.text_config.hidden_size == 64
    prefix, mask = backbone(_images(3), INSTRUCTIONS)
    assert prefix.dtype == torch.float32 and mask.dtype == torch.bool
    assert prefix.shape[:2] == mask.shape and prefix.shape[0] == 3 and prefix.shape[2] == backbone.out_dim
    assert torch.isfinite(prefix).all()
    lengths = mask.sum(1)
    assert lengths.max() == mask.shape[1] and len(set(lengths.tolist())) == 3  # padded to the longest
    assert all(mask[i, :n].all() and not mask[i, n:].any() for i, n in enumerate(lengths.tolist()))  # right pad


def test_prompt_uses_chat_template(backbone):
    prompt = backbone.build_prompt("push", 2)
    assert prompt == "<|im_start|>User:<image><image>push<end_of_utterance>\nAssistant:"
    ids = backbone.encode_inputs(_images(1), ["push"])["input_ids"][0]
    assert (ids == backbone.model.config.image_token_id).sum() == IMAGE_SEQ_LEN


def test_gradients_flow_when_trainable(backbone):
    backbone.zero_grad(set_to_none=True)
    prefix, mask = backbone(_images(3), INSTRUCTIONS)
    (prefix * mask.unsqueeze(-1)).pow(2).mean().backward()
    grads = {n: p.grad for n, p in backbone.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert any("vision_model" in n for n in grads), "no gradient reached the vision tower"
    assert any("text_model" in n for n in grads), "no gradient reached the language model"
    backbone.zero_grad(set_to_none=True)


def test_frozen_has_no_gradients_and_stays_eval(saved_dir):
    frozen = HFImageTextBackbone.from_pretrained(saved_dir, freeze=True)
    assert not any(p.requires_grad for p in frozen.parameters())
    frozen.train()
    assert frozen.training and not frozen.model.training
    prefix, mask = frozen(_images(3), INSTRUCTIONS)
    assert not prefix.requires_grad and prefix.grad_fn is None
    assert torch.isfinite(prefix).all()


def test_two_cameras(backbone):
    one, _ = backbone(_images(3), INSTRUCTIONS)
    prefix, mask = backbone(_images(3, 2), INSTRUCTIONS)
    assert prefix.shape[0] == 3 and prefix.shape[2] == backbone.out_dim and torch.isfinite(prefix).all()
    # each extra camera adds its image tokens plus the two <fake_token_around_image> and <global-img>
    assert prefix.shape[1] == one.shape[1] + IMAGE_SEQ_LEN + 3
    # swapping the cameras changes the features (both views are seen)
    swapped, _ = backbone(_images(3, 2).flip(1), INSTRUCTIONS)
    assert not torch.allclose(swapped, prefix)


def test_instructions_change_prefix_and_batch_is_independent(backbone):
    same = _images(1).expand(2, -1, -1, -1)
    with torch.no_grad():
        prefix, mask = backbone(same, ["pick up the red cube", "pick up the blue cube"])
        n = int(mask[0].sum())
        assert not torch.allclose(prefix[0, :n], prefix[1, :n])
        # right padding keeps a sample's features independent of its batch mates
        alone, alone_mask = backbone(_images(3)[1:2], INSTRUCTIONS[1:2])
        batched, _ = backbone(_images(3), INSTRUCTIONS)
    k = int(alone_mask.sum())
    torch.testing.assert_close(alone[0, :k], batched[1, :k], atol=1e-5, rtol=1e-4)


def test_constructor_with_built_model_and_truncation():
    model, processor = tiny_image_text_model(seed=1)
    bb = HFImageTextBackbone(model, processor, max_length=4, use_last_hidden=False)
    long = "pick up the red cube and place it onto the red plate to the left of the bowl"
    _, mask_long = bb(_images(1), [long])
    _, mask_short = bb(_images(1), [bb._truncate(long)])
    assert mask_long.shape == mask_short.shape  # cut to max_length tokens, image tokens intact
    assert len(bb.tokenizer(bb._truncate(long), add_special_tokens=False)["input_ids"]) <= 4
    prefix, _ = bb(_images(2), ["push", "pull"])  # penultimate layer
    assert prefix.shape[-1] == bb.out_dim and torch.isfinite(prefix).all()


def test_rejects_non_uint8_images():
    with pytest.raises(TypeError, match="uint8"):
        images_to_pil(torch.rand(1, IMAGE_SIZE, IMAGE_SIZE, 3))
    assert len(images_to_pil(_images(2, 3))[1]) == 3


def test_patch_torchvision_is_idempotent():
    state = patch_torchvision()
    assert state in {"absent", "ok", "patched", "failed"}
    assert patch_torchvision() == state
    if importlib.util.find_spec("torchvision") is None:
        assert state == "absent"


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None, reason="torchvision is not installed")
def test_patch_torchvision_makes_torchvision_importable():
    code = (
        "from mmrl.utils.compat import patch_torchvision\n"
        "state = patch_torchvision()\n"
        "import torchvision.transforms.v2, transformers.image_utils\n"
        "print(state)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] in {"ok", "patched"}


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None, reason="torchvision is not installed")
def test_the_import_hook_fixes_torchvision_in_a_process_mmrl_does_not_patch():
    """What `scripts/setup_vllm.sh`'s .pth line does in vLLM's own processes: with the hook installed
    (and no `patch_torchvision` call), transformers' Qwen2-VL video processor, which needs
    torchvision, builds; where torchvision's ops load by themselves the hook defines nothing."""
    code = (
        "import sys\n"
        "from mmrl.utils import torchvision_hook\n"
        "if sys.argv[1] == 'hook':\n"
        "    torchvision_hook.install()\n"
        "from transformers import Qwen2VLVideoProcessor\n"
        "Qwen2VLVideoProcessor()\n"
        "from mmrl.utils import compat\n"
        "print(sorted(compat._DEFINED), any(isinstance(f, torchvision_hook.TorchvisionHook) for f in sys.meta_path))\n"
    )
    hooked = subprocess.run([sys.executable, "-c", code, "hook"], capture_output=True, text=True, timeout=120)
    assert hooked.returncode == 0, hooked.stderr[-2000:]
    defined, left = hooked.stdout.strip().splitlines()[-1].rsplit(" ", 1)
    assert left == "False"  # the hook acts once, then leaves sys.meta_path
    bare = subprocess.run([sys.executable, "-c", code, "bare"], capture_output=True, text=True, timeout=120)
    if defined == "[]":  # this torchvision's compiled ops load: nothing to fix, and it imports without the hook
        assert bare.returncode == 0, bare.stderr[-2000:]
    else:  # the CUDA build on CPU torch: the schemas were defined, and without the hook the import fails
        assert defined == "['nms', 'qnms']", defined
        assert bare.returncode != 0 and "Qwen2VLVideoProcessor" in bare.stderr, bare.stderr[-2000:]
