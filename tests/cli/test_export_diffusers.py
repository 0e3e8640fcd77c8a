"""Issue 19, diffusers generators: `mmrl export RUN --to DIR` of an SD3 / FLUX run writes what diffusers
loads. A LoRA run exports the whole pipeline with the LoRA fused (``<Pipeline>.from_pretrained(DIR)``)
or, with ``--adapter``, ``pytorch_lora_weights.safetensors`` (``pipe.load_lora_weights(DIR)`` on the
base pipeline); a full fine-tune exports the pipeline. Each loaded transformer gives the trained
policy's output on the same inputs, and the upstream pipeline samples the image mmrl's ODE sampler
does from the same latents; the base pipeline does not (the runs train with a large step so the
adapter is far from a no-op). Offline: tiny random-weight pipelines, 1-iteration runs."""

from __future__ import annotations

import pytest
import torch

from mmrl.utils.compat import patch_torchvision

patch_torchvision()  # peft imports transformers models, which import torchvision
pytest.importorskip("diffusers", reason="the SD3 / FLUX generators need diffusers (mmrl[diffusion])")
pytest.importorskip("peft", reason="LoRA needs peft")

from mmrl.cli import main  # noqa: E402
from mmrl.experiment import build_trainer  # noqa: E402
from mmrl.export import model_card  # noqa: E402
from mmrl.flow import sample, time_grid  # noqa: E402
from tests.trainer.test_diffusion_training import cfg as trainer_cfg  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = ["a red circle on the left", "two blue squares"]
#: the tiny SD3 pipeline has no T5; diffusers asks for such absent components to be named
NO_T5 = {"sd3": dict(text_encoder_3=None, tokenizer_3=None), "flux": {}}
PIPELINE = {"sd3": "StableDiffusion3Pipeline", "flux": "FluxPipeline"}


def _run(tmp_path_factory, family: str, *extra: str):
    from mmrl.tiny.tiny_diffusers import tiny_flux_pipeline, tiny_sd3_pipeline

    base = (tiny_sd3_pipeline if family == "sd3" else tiny_flux_pipeline)(tmp_path_factory.mktemp(family))
    out = tmp_path_factory.mktemp("run")
    trainer = build_trainer(
        trainer_cfg(
            out,
            f"policy.model={base}",
            "trainer.iterations=1",
            "trainer.video_episodes=0",
            "trainer.lr=1e-2",
            # random weights draw nothing the shapes reward scores; JPEG size varies per image
            "sim.kwargs={dataset: shapes_prompts, image_size: 16}",
            "reward={type: jpeg_compressibility}",
            *extra,
        )
    )
    trainer.run()
    return base, out / "d", trainer.policy.eval()


@pytest.fixture(scope="module", params=["sd3", "flux"])
def lora_run(request, tmp_path_factory):
    return request.param, *_run(tmp_path_factory, request.param, "policy.lora_rank=4", "policy.lora_alpha=8")


def _pipeline(family: str, folder, lora=None):
    import diffusers

    pipe = getattr(diffusers, PIPELINE[family]).from_pretrained(folder, **NO_T5[family])
    if lora is not None:
        pipe.load_lora_weights(lora)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _transformer_call(policy):
    """The keyword arguments mmrl's generator passes its transformer for one velocity (packed latents
    and position ids for FLUX, 1000 t for SD3), and the policy transformer's output on them."""
    gen, seen = policy.gen, {}
    hook = gen.transformer.register_forward_pre_hook(lambda m, a, kw: seen.update(kw), with_kwargs=True)
    x = torch.randn(2, *gen.sample_shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        gen(x, torch.tensor([0.7, 0.4]), gen.encode(PROMPTS))
        hook.remove()
        return seen, gen.transformer(**seen)[0]


def _images(family: str, policy, pipe):
    """mmrl's ODE sample (decoded to [0, 1]) and the upstream pipeline's image from the same noise,
    on the pipeline's own time grid, without classifier-free guidance."""
    from mmrl.policies.flux import pack_latents

    gen, steps = policy.gen, 4
    noise = torch.randn(2, *gen.sample_shape, generator=torch.Generator().manual_seed(0))
    grid = time_grid(steps, gen.default_shift if family == "flux" else pipe.scheduler.config.shift)
    kw = dict(
        prompt=PROMPTS,
        num_inference_steps=steps,
        height=16,
        width=16,
        output_type="pt",
        max_sequence_length=gen.max_sequence_length,
    )
    if family == "flux":  # its distilled guidance input (3.5); the pipeline shifts its own grid
        kw.update(latents=pack_latents(noise), guidance_scale=gen.guidance)
    else:  # SD3: guidance 1 is no CFG; the scheduler's default grid stops at 1e-3, so give mmrl's
        kw.update(latents=noise, guidance_scale=1.0, sigmas=grid[:-1].tolist())
    with torch.no_grad():
        x0 = sample(policy.model_fn(gen.encode(PROMPTS), None, 1.0), noise, grid, "ode").x0
        return (gen.decode(x0) + 1) / 2, pipe(**kw).images


def test_a_lora_run_exports_a_fused_pipeline_and_a_diffusers_lora(lora_run, tmp_path):
    from safetensors import safe_open

    from mmrl.trainer import checkpoint

    family, base, run, policy = lora_run
    kwargs, want = _transformer_call(policy)
    # the checkpoint holds the LoRA; the frozen base transformer is rebuilt from the pipeline's files
    # by `mmrl export`, as by a resume (the VAE and text encoders are never in a checkpoint)
    left = checkpoint.source_of(checkpoint.latest_path(run))
    assert left and all("transformer" in k and "lora" not in k for k in left)

    assert main(["export", str(run), "--to", str(tmp_path / "merged")]) == 0
    merged = _pipeline(family, tmp_path / "merged")
    assert type(merged.transformer).__name__ in ("SD3Transformer2DModel", "FluxTransformer2DModel")
    assert not any("lora" in k for k in merged.transformer.state_dict())  # fused: a plain transformer
    with torch.no_grad():
        assert torch.allclose(merged.transformer(**kwargs)[0], want, atol=1e-5)
    card = (tmp_path / "merged" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: diffusers\n") and "**diffusers**" in card
    assert "base_model" not in card  # a local folder is no hub id

    assert main(["export", str(run), "--to", str(tmp_path / "lora"), "--adapter"]) == 0
    files = sorted(p.name for p in (tmp_path / "lora").iterdir())
    assert files == ["README.md", "pytorch_lora_weights.safetensors"]  # the adapter alone, not the base
    with safe_open(str(tmp_path / "lora" / "pytorch_lora_weights.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert keys and all(
        k.startswith("transformer.") and (".lora_A.weight" in k or ".lora_B.weight" in k) for k in keys
    )  # diffusers' naming: prefixed, no peft adapter name
    adapted = _pipeline(family, base, lora=tmp_path / "lora")
    plain = _pipeline(family, base)
    with torch.no_grad():
        assert torch.allclose(adapted.transformer(**kwargs)[0], want, atol=1e-6)
        assert (plain.transformer(**kwargs)[0] - want).abs().max() > 1e-2  # the export is not the base
    assert "library_name: diffusers" in (tmp_path / "lora" / "README.md").read_text()

    # the upstream pipelines sample the image mmrl samples; the base pipeline another
    for pipe in (merged, adapted):
        mine, theirs = _images(family, policy, pipe)
        assert mine.shape == theirs.shape == (2, 3, 16, 16) and torch.allclose(mine, theirs, atol=1e-5)
    assert (_images(family, policy, plain)[1] - mine).abs().max() > 1e-3


def test_a_full_fine_tune_exports_the_pipeline(tmp_path_factory, tmp_path):
    base, run, policy = _run(tmp_path_factory, "sd3", "policy.finetune=full")
    kwargs, want = _transformer_call(policy)
    for flag in ([], ["--adapter"]):  # no adapter to keep apart: the pipeline either way
        to = tmp_path / ("x" + "".join(flag))
        assert main(["export", str(run), "--to", str(to), *flag]) == 0
        with torch.no_grad():
            assert torch.allclose(_pipeline("sd3", to).transformer(**kwargs)[0], want, atol=1e-6)
    with torch.no_grad():
        assert (_pipeline("sd3", base).transformer(**kwargs)[0] - want).abs().max() > 1e-2


def test_the_card_names_diffusers_and_a_hub_base_model():
    card = model_card(
        "r", "diffusion", "diffusers lora", "policy: {}\n", None, "stabilityai/stable-diffusion-3.5-medium"
    )
    assert card.startswith("---\nlibrary_name: diffusers\n")
    assert "base_model: stabilityai/stable-diffusion-3.5-medium\n" in card and "- lora\n" in card
