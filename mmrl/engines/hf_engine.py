"""Hugging Face ``generate`` as a rollout engine (CPU and GPU), see `mmrl.engines.base`.

The engine runs a transformers image-text model with its processor: requests are processed in one
left-padded batch, sampled with ``model.generate`` (``do_sample`` with temperature / top-p / top-k,
greedy at temperature 0), and each sampled token's log-prob is read from the raw logits generate
returns: ``log_softmax(logits / temperature)`` (before top-k / top-p truncation), the quantity the
trainer recomputes. Sampling is seeded from ``sampling.seed`` under `torch.random.fork_rng`, so the
global RNG is untouched and a rollout is reproducible.

The model may be the trainer's own module (collocated, the default: nothing to sync) or a copy on
another device (disaggregated: `load_weights` copies the trainer's tensors in).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from mmrl.engines.base import Generation, GenRequest, RolloutEngine, SamplingConfig


class HFEngine(RolloutEngine):
    name = "hf"

    def __init__(self, model, processor, shares_trainer_weights: bool = True):
        self.model, self.processor = model, processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.shares_trainer_weights = shares_trainer_weights
        self.stop_ids = stop_token_ids(model, self.tokenizer)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def encode(self, requests: list[GenRequest]) -> dict[str, torch.Tensor]:
        """Left-padded processor outputs for a batch of requests, on the model's device."""
        enc = self.processor(
            text=[r.text for r in requests], return_tensors="pt", padding=True, padding_side="left", **media(requests)
        )
        dtype = next(self.model.parameters()).dtype
        return {
            k: v.to(self.device, dtype=dtype if v.is_floating_point() else None)
            for k, v in enc.items()
            if isinstance(v, torch.Tensor)
        }

    @torch.no_grad()
    def generate(self, requests: list[GenRequest], sampling: SamplingConfig) -> list[Generation]:
        if not requests:
            return []
        enc = self.encode(requests)
        greedy = sampling.temperature == 0
        kw = dict(
            max_new_tokens=sampling.max_new_tokens,
            num_return_sequences=sampling.n,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.stop_ids,
            do_sample=not greedy,
        )
        banned = list(sampling.banned_token_ids)
        if banned:
            kw["suppress_tokens"] = banned
        if not greedy:
            kw.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or None)
        else:
            kw.update(temperature=None, top_p=None, top_k=None)
        was_training = self.model.training
        self.model.eval()
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            out = self.model.generate(**enc, **kw)
        self.model.train(was_training)
        plen = enc["input_ids"].shape[1]
        tokens = out.sequences[:, plen:]  # [R*n, T]
        logits = torch.stack(out.logits, 1).float()  # [R*n, T, V] raw
        if banned:  # the distribution actually sampled from
            logits[..., banned] = float("-inf")
        scale = 1.0 if greedy else sampling.temperature
        logp = (logits / scale).log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)
        gens = []
        for row in range(tokens.shape[0]):
            ids = tokens[row].tolist()
            end = next((i for i, t in enumerate(ids) if t in self.stop_ids), None)
            n_keep = len(ids) if end is None else end + 1
            ids = ids[:n_keep]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            gens.append(
                Generation(
                    row // sampling.n, ids, logp[row, :n_keep].tolist(), text, "length" if end is None else "stop"
                )
            )
        return gens

    def load_weights(self, named_tensors: Iterable) -> None:
        if self.shares_trainer_weights:
            return  # the trainer's module is the engine's: already up to date
        own = self.model.state_dict()
        unknown = []
        with torch.no_grad():
            for name, tensor in named_tensors:  # one at a time: a stream holds one tensor beyond the models
                if name in own:
                    own[name].copy_(tensor)
                else:
                    unknown.append(name)
        if unknown:
            raise KeyError(f"weights not in the engine's model: {sorted(unknown)[:5]}")


def media(requests: list[GenRequest]) -> dict:
    """The processor's image and video arguments for a batch of requests: ``images`` and ``videos``
    nested per request, ``video_metadata`` flat in placeholder order (the frames are
    already chosen, `mmrl.video`, so the processor must not sample again: ``do_sample_frames=False``)."""
    kw: dict = {}
    if any(r.images for r in requests):
        kw["images"] = [r.images for r in requests]
    clips = [c for r in requests for c in r.videos]
    if clips:
        kw.update(
            # nested per request, as `images`: SmolVLM's processor counts a request's videos so
            videos=[[c.frames.numpy() for c in r.videos] for r in requests],
            video_metadata=[c.metadata() for c in clips],
            do_sample_frames=False,
        )
    return kw


def stop_token_ids(model, tokenizer) -> list[int]:
    """Token ids that end a completion: the generation config's eos ids, the tokenizer's eos and
    the chat template's end-of-turn token when the tokenizer has one."""
    ids: list[int] = []
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for x in (gen_eos if isinstance(gen_eos, list) else [gen_eos]) + [tokenizer.eos_token_id]:
        if x is not None and int(x) not in ids:
            ids.append(int(x))
    for name in ("<end_of_utterance>", "<|im_end|>", "<end_of_turn>", "<|eot_id|>"):
        tid = tokenizer.convert_tokens_to_ids(name) if name in tokenizer.get_vocab() else None
        if tid is not None and tid not in ids:
            ids.append(int(tid))
    if not ids:
        raise ValueError("the tokenizer has no end-of-sequence token: set tokenizer.eos_token")
    return ids
