"""Vision-language model policy for reasoning RL (GRPO family): image(s) / video(s) + question -> text answer.

    question images (any size, pixel budget applied by the dataset), videos, question text
      -> videos decoded once per iteration, frames chosen (`mmrl.video`: policy.video_fps,
         video_max_frames, video_max_pixels)
      -> chat template (optional system prompt; one placeholder per video, then per image, then the text)
      -> rollout engine (`mmrl.engines`: Hugging Face ``generate`` or vLLM) samples a completion
      -> the completion's text goes back to the trainer, whose reward stage scores it
         (`mmrl.trainer.reward_stage`; the `qa` simulator holds the questions and their answers)

Models: any transformers ``AutoModelForImageTextToText`` checkpoint by hub id or local path
(Qwen2.5-VL / Qwen3-VL, SmolVLM, Gemma 3, ...), or ``model: tiny``: a tiny random-weight SmolVLM
(`mmrl.tiny.tiny_models`, real Idefics3 classes, offline-trained tokenizer) for the embedded
demo and tests, or ``model: tiny-qwen2.5-vl`` (`mmrl.tiny.tiny_qwen_vl`, images and videos).
Fine-tuning: ``full`` or ``lora`` (peft, on every linear layer of the language model; the vision
tower gets no adapter unless ``lora_vision``); ``freeze_vision`` freezes the vision encoder in full
fine-tuning.

Log-probs. ``logp`` is per completion token, ``[B, max_new_tokens]`` with ``logp_mask`` marking
the real tokens (the stop token included): ``log_softmax(logits / temperature)`` at the token,
teacher-forced in one forward pass over [prompt, completion]. Rollout log-probs: the engine's
(``recompute_logp: false``, the default for the in-process HF engine, whose weights are the
trainer's) or recomputed by this forward pass before the update (``true``, the default with vLLM);
then ``engine_logp`` is kept beside ``old_logp``, ``rollout_stats`` reports their mismatch
(mean |diff| and max) and ``tis_cap`` = C adds truncated importance-sampling weights
``min(exp(old_logp - engine_logp), C)`` (``is_weight``) that the PPO loss multiplies in.

Videos. A question's videos (``Observation.videos``: file paths, frames, or undecoded
``datasets.Video`` values, see `mmrl.video`) are decoded once per iteration (`mmrl.video.ClipCache`:
a GRPO group shares its question's clip), their frames chosen and fitted to the pixel budget, then
given to the processor's own video path (``videos=`` with ``{"type": "video"}`` in the chat
template), so the model's own video positions are used (Qwen2.5-VL: ``pixel_values_videos``,
``video_grid_thw``, ``second_per_grid_ts`` and ``mm_token_type_ids`` for its 3D rope). A processor
without a video path (Idefics3 / SmolVLM v1) gets the chosen frames as images, in order.

Multi-turn episodes (tools). An observation with ``messages`` (`mmrl.simulator.Observation`, set
by `simulators.tool_env`) is a conversation so far: system / user messages, this policy's earlier
turns, tool results (``role: "tool"``, text or images). Each decision renders it with
``processor.apply_chat_template(messages, tools=<the observation's tool schemas>,
add_generation_prompt=True)`` (the policy's ``system_prompt`` first where it has none; ``prompt``
applies to single-turn questions only), its image items in order as images (videos as clips), and
samples one assistant turn. Everything before the turn is prompt: ``logp_mask`` covers the
turn's own tokens, never the tool results or earlier turns, which are cached per turn like any
prompt (ratio 1 before the first update). An earlier turn re-enters the next prompt as its text,
tokenized again (as TRL and verl do; a non-canonical BPE split of it may tokenize differently).
The warm start (SFT) takes such turns too: a row with ``messages`` (the conversation before the
turn) and ``tools`` is rendered by `chat_request`, as the rollout renders it, and its ``solution``
(a tool call or an answer) is teacher-forced (`warm_start_batch`).

Replay. A rollout keeps each sample's processor outputs (prompt token ids, the per-token modality
ids, pixel values and video tensors, grids) in a per-iteration cache keyed by the batch's ``uid``;
`evaluate` collates them (left-padded prompts, pixel tensors concatenated on dim 0, zero-padded
where image sizes differ) so images and videos are processed once per iteration; `sync_rollout`
(after each update) clears the cache and the decoded clips and releases the engine's multi-modal
caches, so memory stays bounded.

Reference for the KL term (``reference``): ``adapter`` (LoRA switched off) or ``copy`` (a frozen
copy of the weights after the warm start); rollouts then carry ``ref_logp``.

Prompt lengths are checked when the experiment is built (`check_simulator`): a question whose
processed prompt exceeds ``max_prompt_tokens`` fails with its index and token counts, instead of
being truncated through its image tokens.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from mmrl.batch import Batch
from mmrl.capabilities import Capabilities
from mmrl.config import ConfigError
from mmrl.engines.base import GenRequest, RolloutEngine, SamplingConfig
from mmrl.policies.base import Decision, Evaluation, HFModel, Policy, PolicyConfig
from mmrl.policies.token_vla import VISION_TOWER_NAMES, freeze_vision_tower
from mmrl.simulator import Completions
from mmrl.utils.rows import rows_generator

MM_SKIP = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids")
#: processor outputs kept per prompt token (left-padded with the prompt, zero over the completion)
PER_TOKEN = ("prompt_ids", "mm_token_type_ids")
#: ``policy.model`` names built here (random weights, offline) -> (module, builder)
TINY_MODELS = {
    "tiny": ("mmrl.tiny.tiny_models", "tiny_image_text_model"),
    "tiny-qwen2.5-vl": ("mmrl.tiny.tiny_qwen_vl", "tiny_qwen_vl_model"),
    "tiny-smolvlm2": ("mmrl.tiny.tiny_smolvlm2", "tiny_smolvlm2_model"),
}
#: the `TINY_MODELS` built otherwise for ``engine: vllm``: text heads of 32, what vLLM's CPU attention takes
VLLM_TINY_MODELS = {
    "tiny": ("mmrl.tiny.tiny_vllm", "tiny_vllm_image_text_model"),
    "tiny-qwen2.5-vl": ("mmrl.tiny.tiny_vllm", "tiny_vllm_qwen_vl_model"),
}


@dataclass
class VLMConfig(PolicyConfig):
    """Configuration of `VLMPolicy` (the ``policy`` section of an experiment)."""

    type: str = "vlm"
    model: str = "Qwen/Qwen2.5-VL-3B-Instruct"  # hub id / local path, or a `TINY_MODELS` name (built here)
    trust_remote_code: bool = False  # let transformers run the checkpoint's own modelling code
    # the model's weights dtype (auto: the checkpoint's)
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    # rollout engine: hf (transformers generate) or vllm (needs .venv-vllm or the vllm wheel)
    engine: Literal["hf", "vllm"] = "hf"
    engine_kwargs: dict = field(default_factory=dict)  # e.g. vLLM gpu_memory_utilization, max_model_len
    system_prompt: str | None = None  # a system message before every conversation (null: none)
    prompt: str = "{question}"  # the user turn's text around the question ({question})
    max_prompt_tokens: int = 2048  # processed prompt (image tokens included); longer ones fail at load
    max_new_tokens: int = 64  # tokens generated per model turn at most
    temperature: float = 1.0  # rollout sampling temperature (log-probs use the same one)
    top_p: float = 1.0  # nucleus sampling in rollouts (1 = off)
    top_k: int = 0  # 0 = off
    eval_temperature: float = 0.0  # 0 = greedy evaluation
    # full: every weight trains; lora: adapters on the language model (lora_vision: also the vision tower)
    finetune: Literal["full", "lora"] = "full"
    lora_rank: int = 16  # LoRA rank (finetune: lora)
    lora_alpha: int = 32  # LoRA scale alpha (the update is scaled by alpha / rank)
    lora_dropout: float = 0.0  # dropout on the LoRA inputs
    lora_vision: bool = False  # adapters on the vision tower too
    freeze_vision: bool = False  # full fine-tuning: keep the vision encoder fixed
    reference: Literal["none", "adapter", "copy"] = "none"  # KL reference (algorithm.kl_coef > 0)
    recompute_logp: bool | None = None  # None: False with the HF engine, True with vLLM
    tis_cap: float | None = None  # truncated importance sampling cap (with recompute_logp)
    gradient_checkpointing: bool = False  # recompute activations in backward: less memory, more time
    tiny_seed: int = 0  # seed of a tiny model built here (model: a TINY_MODELS name) and of the vLLM engine
    video_fps: float | None = 2.0  # frames per second sampled from a question's video; null: every frame
    video_max_frames: int = 16  # at most this many frames per video (evenly spaced)
    video_max_pixels: int | None = None  # per-frame pixel budget before the processor (aspect kept)
    video_frames_fps: float = 2.0  # the rate of a video given as a list of frames

    def video_options(self):
        from mmrl.video import VideoOptions

        return VideoOptions(self.video_fps, self.video_max_frames, self.video_max_pixels, self.video_frames_fps)

    def validate(self) -> None:
        if "{question}" not in self.prompt:
            raise ConfigError("'prompt' must contain the placeholder {question}")
        if self.max_new_tokens < 1 or self.max_prompt_tokens < 1:
            raise ConfigError("'max_new_tokens' and 'max_prompt_tokens' must be >= 1")
        if self.temperature <= 0:
            raise ConfigError(f"'temperature' must be > 0 for RL rollouts, got {self.temperature}")
        if self.reference == "adapter" and self.finetune != "lora":
            raise ConfigError("'reference: adapter' needs finetune: lora; use reference: copy for full fine-tuning")
        if self.tis_cap is not None and self.tis_cap <= 0:
            raise ConfigError(f"'tis_cap' must be > 0 or null, got {self.tis_cap}")
        try:
            self.video_options()
        except ValueError as e:
            raise ConfigError(f"policy.video_{e}") from None


class VLMPolicy(Policy[VLMConfig]):
    """A transformers image-text LM answering questions; see the module docstring."""

    config_class = VLMConfig

    @classmethod
    def capabilities(cls, cfg: VLMConfig) -> Capabilities:
        """Answers (`Completions`), one log-prob per token, a KL reference with ``reference``; no
        critic, no background rollout (its engine belongs to the trained model)."""
        return Capabilities(
            action_type="text",
            logp="token",
            critic=False,
            kl_reference="logp" if cfg.reference != "none" else None,
            asynchronous=False,
            fixes={
                "critic": "the VLM policy has no critic: use a group estimator (algorithm.advantage: grpo, "
                "dr_grpo, rloo, ...) with group_size >= 2",
                "likelihood_free": "the VLM policy has no likelihood-free loss: use algorithm.objective=ppo",
                "kl_reference": "set policy.reference=adapter (LoRA) or copy",
                "asynchronous": "its rollout engine (HF or vLLM) and the per-iteration processor cache belong "
                "to the trained policy, not to a background copy: set trainer.async_staleness=0",
            },
        )

    def __init__(
        self,
        cfg: VLMConfig,
        action_dim: int,
        state_dim: int | None = None,
        model: HFModel | None = None,
        processor=None,
    ):
        super().__init__()
        if (model is None) != (processor is None):
            raise ValueError("pass both model and processor, or neither (then cfg.model is loaded)")
        if model is None:
            model, processor = load_vlm(cfg)
        self.cfg, self.processor = cfg, processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        if cfg.freeze_vision:
            freeze_vision_tower(model)
        if cfg.finetune == "lora":
            model = add_lora(model, cfg)
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        contiguous_head_inputs(model)
        self.model = model
        self.ref_model = None
        if cfg.reference == "copy":  # refreshed after the warm start; a submodule so checkpoints keep it
            self.ref_model = copy.deepcopy(model).requires_grad_(False).eval()
        self.logp_shape = (cfg.max_new_tokens,)
        self.recompute = cfg.recompute_logp if cfg.recompute_logp is not None else cfg.engine == "vllm"
        if cfg.tis_cap is not None and not self.recompute:
            raise ConfigError("'tis_cap' needs recompute_logp: true (the engine's log-probs are the old ones)")
        self._engine: RolloutEngine | None = None  # made on first use (`engine`)
        self._cache: dict[int, dict] = {}
        from mmrl.video import ClipCache

        self._clips = ClipCache(cfg.video_options())  # decoded videos of this iteration
        self.video_path = getattr(processor, "video_processor", None) is not None  # else frames go as images
        self._next_uid = 0
        self._sft: dict | None = None
        self._stats: dict[str, float] = {}
        from mmrl.engines.hf_engine import stop_token_ids

        self.stop_id = stop_token_ids(self._lm(), self.tokenizer)[-1]  # end of turn (SFT targets end so)
        self.banned_ids = image_placeholder_ids(self.tokenizer)  # never sampled, masked in log-probs too

    def rebuilds_frozen_weights(self) -> bool:
        return True  # from_pretrained, or the tiny model seeded by policy.tiny_seed

    def export_pretrained(self, folder, merge: bool = True) -> str:
        """A transformers folder (``AutoModelForImageTextToText.from_pretrained`` loads it) with the
        processor; a LoRA run with ``merge=False``: the peft adapter alone
        (``PeftModel.from_pretrained(base, folder)``) plus the processor."""
        from pathlib import Path

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        model = self.model
        if hasattr(model, "get_base_model") and merge:
            model = copy.deepcopy(model).merge_and_unload()
        model.save_pretrained(str(folder))
        self.processor.save_pretrained(str(folder))
        return "peft adapter" if hasattr(model, "get_base_model") else "transformers"

    # ---- model plumbing ---------------------------------------------------------------------
    def _lm(self, model: HFModel | None = None) -> HFModel:
        model = self.model if model is None else model
        return model.get_base_model() if hasattr(model, "get_base_model") else model

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def engine(self):
        if self._engine is None:
            if self.cfg.engine == "hf":
                from mmrl.engines.hf_engine import HFEngine

                self._engine = HFEngine(self._lm(), self.processor)
            else:
                from mmrl.engines.vllm_engine import VLLMEngine

                kw = {"max_model_len": self.cfg.max_prompt_tokens + self.cfg.max_new_tokens, **self.cfg.engine_kwargs}
                path = self._export_dir()
                self._engine = VLLMEngine(path, seed=self.cfg.tiny_seed, **kw)
                if path == self.cfg.model:  # the checkpoint on disk, not the current (warm-started) weights
                    self._push_weights()
        return self._engine

    def _export_dir(self) -> str:
        """A local folder vLLM can load: the configured path, or the current weights saved."""
        from pathlib import Path

        if self.cfg.model not in TINY_MODELS and Path(self.cfg.model).exists() and self.cfg.finetune == "full":
            return self.cfg.model
        folder = tempfile.mkdtemp(prefix="mmrl_vllm_")
        lm = self._lm()
        state = merged_state_dict(self.model)
        lm.save_pretrained(folder, state_dict=state)
        self.processor.save_pretrained(folder)
        return folder

    def _push_weights(self) -> None:
        if self._engine is not None and self.cfg.engine != "hf":
            self._engine.load_weights(stream_weights(self.model))  # tensor by tensor, gathered from shards

    def question_text(self, question: str, num_images: int, num_videos: int = 0) -> str:
        text = self.cfg.prompt.format(question=question)
        messages = []
        if self.cfg.system_prompt:
            messages.append({"role": "system", "content": [{"type": "text", "text": self.cfg.system_prompt}]})
        content = [{"type": "video"} for _ in range(num_videos)] + [{"type": "image"} for _ in range(num_images)]
        messages.append({"role": "user", "content": content + [{"type": "text", "text": text}]})
        if getattr(self.processor, "chat_template", None):
            return self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        image = getattr(self.processor, "image_token", None) or "<image>"
        video = getattr(self.processor, "video_token", None) or "<video>"
        return video * num_videos + image * num_images + text

    def requests(
        self,
        questions: list[str],
        images: list[list[torch.Tensor]],
        videos: list[list] | None = None,
        messages: list[list[dict]] | None = None,
        tools: list[list[dict]] | None = None,
    ) -> list[GenRequest]:
        """One `GenRequest` per question: images as PIL, videos (sources, `mmrl.video`) decoded once
        per iteration into clips; with a processor that has no video path, a clip's frames are
        images, placed before the question's own images. Where ``messages`` (per question, a
        conversation) is given, the request is `chat_request` of it and ``tools`` (JSON schemas)."""
        from PIL import Image

        out = []
        for i, (q, imgs, vids) in enumerate(zip(questions, images, videos or [[]] * len(questions))):
            if messages is not None and messages[i] is not None:
                out.append(self.chat_request(messages[i], tools[i] if tools is not None else None))
                continue
            clips = [self._clips.get(v) for v in vids]
            if not self.video_path:
                imgs = [f for c in clips for f in c.frames] + list(imgs)
                clips = []
            pil = [Image.fromarray(im.cpu().numpy()) for im in imgs]
            out.append(GenRequest(self.question_text(q, len(pil), len(clips)), pil, clips))
        return out

    def chat_request(self, messages: list[dict], tools: list[dict] | None = None) -> GenRequest:
        """The request of a conversation (`mmrl.simulator.Observation.messages`): rendered by the chat
        template with ``tools`` (JSON schemas) and the generation prompt, after this policy's
        ``system_prompt`` where the conversation has no system message; its image items (uint8
        ``[H, W, 3]`` tensors or arrays, PIL images) become the request's images and its video items
        (`mmrl.video` sources) its clips, in order (frames as images without a video path)."""
        from PIL import Image

        from mmrl.tools import as_image

        if not getattr(self.processor, "chat_template", None):
            raise ValueError(
                f"multi-turn episodes need a chat template, and the processor of {self.cfg.model} has none"
            )
        if self.cfg.system_prompt and (not messages or messages[0]["role"] != "system"):
            messages = [{"role": "system", "content": [{"type": "text", "text": self.cfg.system_prompt}]}, *messages]
        rendered, images, clips = [], [], []
        for m in messages:
            if isinstance(m["content"], str):
                rendered.append(m)
                continue
            items: list[dict] = []
            for c in m["content"]:
                kind = c.get("type")
                if kind == "image":
                    im = as_image(c.get("image"))
                    if im is None:
                        raise ValueError(
                            f"a {m['role']} message's image item holds {type(c.get('image')).__name__}: give a "
                            "uint8 [H, W, 3] tensor / array or a PIL image"
                        )
                    images.append(Image.fromarray(im.numpy()))
                    items.append({"type": "image"})
                elif kind == "video":
                    clip = self._clips.get(c["video"])
                    if self.video_path:
                        clips.append(clip)
                        items.append({"type": "video"})
                    else:
                        images += [Image.fromarray(f.numpy()) for f in clip.frames]
                        items += [{"type": "image"} for _ in clip.frames]
                else:
                    items.append(c)
            rendered.append({**m, "content": items})
        text = self.processor.apply_chat_template(
            rendered, tools=tools or None, add_generation_prompt=True, tokenize=False
        )
        return GenRequest(text, images, clips)

    def encode_one(self, req: GenRequest) -> dict:
        """Processor outputs of one request: ``prompt_ids`` [Lp], ``mm_token_type_ids`` [Lp] where the
        processor gives them (0 text, 1 image, 2 video: Qwen-VL's 3D rope reads them) and the pixel
        / video tensors (e.g. ``pixel_values_videos`` [patches, D], ``video_grid_thw`` [V, 3],
        ``second_per_grid_ts`` [V])."""
        from mmrl.engines.hf_engine import media

        enc = self.processor(text=[req.text], return_tensors="pt", **media([req]))
        out = {"prompt_ids": enc["input_ids"][0]}
        if isinstance(enc.get("mm_token_type_ids"), torch.Tensor):
            out["mm_token_type_ids"] = enc["mm_token_type_ids"][0]
        out.update({k: v for k, v in enc.items() if k not in MM_SKIP and isinstance(v, torch.Tensor)})
        return out

    def encode_unique(self, reqs: list[GenRequest]) -> list[dict]:
        """`encode_one` per request, once per distinct (text, images, clips) -- a GRPO group shares one."""
        done: dict = {}
        out = []
        for r in reqs:
            key = (r.text, tuple(im.tobytes() for im in r.images), tuple(id(c) for c in r.videos))
            if key not in done:
                done[key] = self.encode_one(r)
            out.append(done[key])
        return out

    @staticmethod
    def _obs_images(obs) -> list[list[torch.Tensor]]:
        if obs.images is not None:
            return [list(x) for x in obs.images]
        img = obs.image
        return [list(img[i]) if img.dim() == 5 else [img[i]] for i in range(img.shape[0])]

    @staticmethod
    def _obs_videos(obs) -> list[list]:
        return [list(v) for v in obs.videos] if obs.videos is not None else [[] for _ in obs.instruction]

    # ---- forward over [prompt, completion] ----------------------------------------------------
    def _forward_logp(
        self,
        entries: list[dict],
        completion: torch.Tensor,
        mask: torch.Tensor,
        model: HFModel | None = None,
        entropy: bool = False,
    ):
        """Teacher-forced ``log_softmax(logits / T)`` of ``completion`` [B, L] -> ([B, L], entropy)."""
        lm = self._lm(model)
        dev = self.device
        plen = max(int(e["prompt_ids"].shape[0]) for e in entries)
        pad = self.tokenizer.pad_token_id or 0
        prompt = torch.full((len(entries), plen), pad, dtype=torch.long)
        pmask = torch.zeros(len(entries), plen, dtype=torch.long)
        types = torch.zeros(len(entries), plen + completion.shape[1], dtype=torch.long)  # completion: text
        for i, e in enumerate(entries):  # left padding
            n = e["prompt_ids"].shape[0]
            prompt[i, plen - n :], pmask[i, plen - n :] = e["prompt_ids"], 1
            if "mm_token_type_ids" in e:
                types[i, plen - n : plen] = e["mm_token_type_ids"]
        ids = torch.cat([prompt, completion.cpu()], 1).to(dev)
        attn = torch.cat([pmask, mask.cpu().long()], 1).to(dev)
        kw = collate_pixels(entries, dev, next(lm.parameters()).dtype)
        base = lm.model
        if not hasattr(base, "get_rope_index"):  # 1-D rotary positions: count real tokens only
            kw["position_ids"] = (attn.cumsum(-1) - 1).clamp(min=0)
        elif any("mm_token_type_ids" in e for e in entries):  # the model's 3D positions (Qwen-VL) read them
            kw["mm_token_type_ids"] = types.to(dev)
        hidden = base(input_ids=ids, attention_mask=attn, return_dict=True, **kw).last_hidden_state
        pred = hidden[:, plen - 1 : plen - 1 + completion.shape[1]]
        logits = lm.get_output_embeddings()(pred).float() / self.cfg.temperature
        if self.banned_ids:  # the sampling distribution: image placeholders are never sampled
            logits[..., self.banned_ids] = float("-inf")
        logp_all = logits.log_softmax(-1)
        logp = logp_all.gather(-1, completion.to(dev)[..., None]).squeeze(-1)
        ent = None
        if entropy:
            m = mask.to(dev).float()
            # banned tokens have logp -inf and p 0: clamping keeps p * logp (and its gradient) 0 there,
            # where torch.where's untaken branch 0 * -inf would put NaN into the backward pass
            plogp = logp_all.exp() * logp_all.clamp(min=torch.finfo(logp_all.dtype).min)
            ent = (-plogp.sum(-1) * m).sum() / m.sum().clamp(min=1)
        return logp, ent

    # ---- the policy contract ------------------------------------------------------------------
    @torch.no_grad()
    def rollout(self, obs, generator: torch.Generator | None = None, mode: str = "train") -> Decision:
        train = mode == "train"
        reqs = self.requests(
            list(obs.instruction), self._obs_images(obs), self._obs_videos(obs), obs.messages, obs.tools
        )
        g = rows_generator(generator)  # with N ranks: one of its own per rank (mmrl.utils.rows)
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=g, device=g.device)) if g is not None else None
        sampling = SamplingConfig(
            n=1,
            temperature=self.cfg.temperature if train else self.cfg.eval_temperature,
            top_p=self.cfg.top_p,
            top_k=self.cfg.top_k,
            max_new_tokens=self.cfg.max_new_tokens,
            seed=seed,
            banned_token_ids=tuple(self.banned_ids),
        )
        gens = sorted(self.engine().generate(reqs, sampling), key=lambda g: g.request_index)  # one per request
        b, width = len(reqs), self.cfg.max_new_tokens
        completion, mask = pad_right([g.token_ids for g in gens], width, self.tokenizer.pad_token_id or 0)
        engine_logp, _ = pad_right([g.logprobs for g in gens], width, 0.0, torch.float32)
        answers = Completions([g.text for g in gens], mask.sum(1).tolist())
        batch = Batch(completion=completion, completion_mask=mask, old_logp=engine_logp)
        if not train:
            return Decision(batch, answers)
        entries = self.encode_unique(reqs)
        uids = list(range(self._next_uid, self._next_uid + b))
        self._next_uid += b
        self._cache.update(zip(uids, entries))
        batch["uid"] = torch.tensor(uids, dtype=torch.long)
        if self.recompute:
            old, _ = self._forward_logp(entries, completion, mask)
            old = old.cpu() * mask
            diff = (old - engine_logp).abs()[mask]
            self._stats = {
                "logp_mismatch_mean": float(diff.mean()) if diff.numel() else 0.0,
                "logp_mismatch_max": float(diff.max()) if diff.numel() else 0.0,
            }
            batch["engine_logp"], batch["old_logp"] = engine_logp, old
            if self.cfg.tis_cap is not None:
                batch["is_weight"] = torch.exp(old - engine_logp).clamp(max=self.cfg.tis_cap) * mask
        if self.cfg.reference != "none":
            batch["ref_logp"] = self.reference_logp(entries, completion, mask).cpu() * mask
        return Decision(batch, answers)

    def reference_logp(self, entries, completion, mask) -> torch.Tensor:
        if self.cfg.reference == "adapter":
            with self.model.disable_adapter():
                return self._forward_logp(entries, completion, mask)[0]
        return self._forward_logp(entries, completion, mask, model=self.ref_model)[0]

    def evaluate(self, batch: Batch) -> Evaluation:
        uids = batch["uid"].tolist()
        missing = [u for u in uids if u not in self._cache]
        if missing:
            raise RuntimeError(
                f"VLM rollout cache has no entry for uids {missing[:4]}: evaluate() must run on "
                "the current iteration's rollouts (the cache is cleared by sync_rollout)"
            )
        mask = batch["completion_mask"].to(self.device)
        logp, ent = self._forward_logp([self._cache[u] for u in uids], batch["completion"], mask, entropy=True)
        return Evaluation(logp=logp, entropy=ent, logp_mask=mask)

    def rollout_stats(self) -> dict[str, float]:
        return dict(self._stats)

    def sync_rollout(self) -> None:
        """After an update: clear the rollout cache and the decoded videos, push weights to an
        out-of-process engine and release its multi-modal caches."""
        self._cache.clear()
        self._clips.clear()
        self._push_weights()
        if self._engine is not None:
            self._engine.release_cache()

    def after_warm_start(self) -> None:
        self._clips.clear()  # the warm start's decoded videos
        if self.ref_model is not None:
            self.ref_model.load_state_dict(self.model.state_dict())
        self._push_weights()

    # ---- supervised warm start (SFT) ----------------------------------------------------------
    def warm_start_batch(self, data: dict) -> Batch:
        """Keep a VLM dataset for `supervised_loss`; rows are indices. Single-turn rows: ``prompt``,
        ``images``, optional ``videos``, ``solution`` (or the meta answers). Conversation rows (turns
        of multi-turn episodes): ``messages`` (per row, the conversation before the target turn, as
        `mmrl.simulator.Observation.messages` holds it, images inline) and ``tools`` (per row, the
        tool schemas, or None), ``solution`` the target turn (a ``<tool_call>...</tool_call>`` or an
        answer); a row whose ``messages`` is None is single-turn."""
        convo = data.get("messages")
        needed = ("prompt", "images") if convo is None else ()
        for key in needed:
            if key not in data:
                raise ValueError(
                    f"VLM warm start needs a dataset with '{key}' (and 'solution' or meta answers), "
                    "or conversation rows: 'messages' (and 'tools')"
                )
        sol = list(data.get("solution") or [str(m["answer"]) for m in data["meta"]])
        n = len(sol)
        messages = list(convo) if convo is not None else [None] * n
        tools = list(data.get("tools") or [None] * n)
        if len(messages) != n or len(tools) != n:
            raise ValueError(f"VLM warm start: {n} solutions but {len(messages)} messages and {len(tools)} tools rows")
        self._sft = {
            "prompt": list(data.get("prompt") or [""] * n),
            "images": list(data.get("images") or [[] for _ in range(n)]),
            "videos": list(data.get("videos") or [[] for _ in range(n)]),
            "messages": messages,
            "tools": tools,
            "solution": sol,
        }
        return Batch(index=torch.arange(n))

    def supervised_loss(self, batch: Batch) -> torch.Tensor:
        """Mean cross-entropy [B] of the solution tokens (then the end-of-turn token), after the
        prompt the rollout would give the row (`requests`: a conversation row through `chat_request`
        with its tools, as at that turn of an episode)."""
        rows = batch["index"].tolist()
        d = self._sft
        assert d is not None, "warm_start_batch keeps the dataset whose rows supervised_loss takes"
        pick = lambda key: [d[key][i] for i in rows]  # noqa: E731
        reqs = self.requests(pick("prompt"), pick("images"), pick("videos"), pick("messages"), pick("tools"))
        targets = [
            self.tokenizer(d["solution"][i], add_special_tokens=False)["input_ids"] + [self.stop_id] for i in rows
        ]
        completion, mask = pad_right(targets, max(len(t) for t in targets), self.tokenizer.pad_token_id or 0)
        logp, _ = self._forward_logp(self.encode_unique(reqs), completion, mask)
        m = mask.to(logp.device).float()
        return -(logp * m).sum(1) / m.sum(1)

    # ---- load-time checks ---------------------------------------------------------------------
    def check_simulator(self, sim) -> None:
        """Fail if any question of ``sim`` (a `QASim`) exceeds ``max_prompt_tokens`` once processed, or,
        for a conversation with tools (`simulators.tool_env`), if the chat template drops them."""
        from tqdm import tqdm

        limit = self.cfg.max_prompt_tokens
        media_ids = [getattr(self.processor, k, None) for k in ("image_token_id", "video_token_id")]
        media_ids = [t for t in media_ids if t is not None]
        items = range(len(sim.prompts))
        for i in tqdm(items, desc="checking prompt lengths", disable=len(items) < 20000):
            rec = sim.record(i)
            chat = [rec["messages"]] if rec.get("messages") is not None else None
            req = self.requests([rec["prompt"]], [rec["images"]], [rec.get("videos", [])], chat, [rec.get("tools")])[0]
            tools = [t["function"] for t in rec.get("tools") or []]  # rendered: its docstring's summary is there
            dropped = [t["name"] for t in tools if t.get("description", t["name"]) not in req.text]
            if dropped:
                raise ValueError(
                    f"the chat template of policy.model {self.cfg.model!r} ignores tools=: tool(s) {dropped} are not "
                    "in the rendered prompt, so the model would never learn they exist. Fix: use a model whose chat "
                    "template renders tools (Qwen2.5 / Qwen3-VL style <tools>...</tools>), or give its processor one"
                )
            ids = self.encode_one(req)["prompt_ids"]
            if ids.shape[0] > limit:
                n_img = int(sum((ids == t).sum() for t in media_ids)) if media_ids else "?"
                raise ValueError(
                    f"question {i} of '{sim.dataset_name}' ({sim.split}) needs {ids.shape[0]} prompt tokens "
                    f"({n_img} of them image / video tokens) > policy.max_prompt_tokens={limit}; truncating it "
                    f"would cut image tokens. Fix: raise policy.max_prompt_tokens or lower the dataset's max_pixels "
                    f"(videos: policy.video_max_frames / video_fps / video_max_pixels) "
                    f"(question: {rec['prompt'][:60]!r})"
                )
        self._clips.clear()


# ---- loading, LoRA, weights -----------------------------------------------------------------
def load_vlm(cfg: VLMConfig):
    """``AutoModelForImageTextToText`` + ``AutoProcessor`` from ``cfg.model`` (or a `TINY_MODELS` one)."""
    from mmrl.utils.compat import patch_torchvision

    patch_torchvision()
    if cfg.model in TINY_MODELS:
        import importlib

        tiny = VLLM_TINY_MODELS if cfg.engine == "vllm" and cfg.model in VLLM_TINY_MODELS else TINY_MODELS
        module, builder = tiny[cfg.model]
        return getattr(importlib.import_module(module), builder)(seed=cfg.tiny_seed)
    from transformers import AutoModelForImageTextToText, AutoProcessor

    dtype = cfg.dtype if cfg.dtype == "auto" else getattr(torch, cfg.dtype)
    model = AutoModelForImageTextToText.from_pretrained(cfg.model, dtype=dtype, trust_remote_code=cfg.trust_remote_code)
    processor = AutoProcessor.from_pretrained(cfg.model, trust_remote_code=cfg.trust_remote_code)
    return model, processor


def image_placeholder_ids(tokenizer) -> list[int]:
    """Ids of the special tokens that stand for image content (``<image>``, ``<|image_pad|>``,
    ``<fake_token_around_image>``, ``<row_1_col_1>``, ``<|vision_start|>``, ...): a completion must
    not contain one, or the recomputation would try to put image features there."""
    words = ("image", "img", "vision", "video", "<row_")
    special = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return sorted(int(i) for i, tok in special.items() if any(w in str(tok).lower() for w in words))


def lora_targets(model: nn.Module, vision: bool = False) -> list[str]:
    """Names of the linear layers that get LoRA adapters: all of the language model (and the
    projector), not the output head, and not the vision tower unless ``vision``."""
    names = []
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.Linear) or name.split(".")[-1] == "lm_head":
            continue
        if not vision and any(part in VISION_TOWER_NAMES for part in name.split(".")):
            continue
        names.append(name)
    if not names:
        raise ValueError(f"no linear layers for LoRA in {type(model).__name__}")
    return names


def contiguous_head_inputs(model: nn.Module) -> None:
    """Make the output head's input contiguous before its matmul. transformers slices the hidden states
    it keeps logits for (``logits_to_keep``: the generated tokens, the last one at a prefill), and on
    the CPU torch's bf16 linear on that strided slice takes a slow path: the last rows of 4 prompts
    through Qwen2.5-VL-3B's 151936-row head took 20 s strided, 0.05 s contiguous (torch 2.13, 2
    cores). The copy is of the kept rows only; on a GPU it is as cheap."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if isinstance(head, nn.Module):
        head.register_forward_pre_hook(lambda _m, args: (args[0].contiguous(), *args[1:]))


def add_lora(model: HFModel, cfg: VLMConfig) -> HFModel:
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=lora_targets(model, cfg.lora_vision),
    )
    return get_peft_model(model, config)


@torch.no_grad()
def merged_state_dict(model: HFModel) -> dict[str, torch.Tensor]:
    """HF-named weights with LoRA merged in (what a rollout engine loads); the model is unchanged."""
    return dict(stream_weights(model))


def stream_weights(model: HFModel) -> Iterator[tuple[str, torch.Tensor]]:
    """The HF-named weights a rollout engine loads, LoRA merged in, one tensor at a time, so that a
    weight sync holds one tensor beyond the model and the engine, never a second model:

    * a LoRA layer's weight is its base weight plus the adapter's delta, computed as peft's
      ``merge_and_unload`` computes and adds it (`get_delta_weight`), the model untouched;
    * a sharded tensor (FSDP2's `DTensor`) is gathered whole when its turn comes: every rank must
      run the loop, in the same order, as for any collective.

    LoRA variants that merge otherwise (DoRA, a LoRA bias, several active adapters, trained copies of
    whole modules: ``modules_to_save``) go through a
    merged copy of the model (`merge_and_unload` on a deep copy), which a sharded model refuses."""
    if not hasattr(model, "get_base_model"):
        for key, value in model.state_dict().items():
            yield key, _whole(value.detach())
        return
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    layers: dict[str, Any] = {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}
    saved_copies = any("modules_to_save" in name for name, _ in base.named_modules())
    if saved_copies or not all(_plain_lora(m) for m in layers.values()):
        if any(_is_sharded(p) for p in model.parameters()):
            raise NotImplementedError(
                "streaming the merged weights of a sharded model supports plain LoRA (one adapter, no DoRA, no "
                "LoRA bias): use those, or trainer.engine.backend=torch / deepspeed"
            )
        for key, value in copy.deepcopy(model).merge_and_unload().state_dict().items():
            yield key, value.detach()
        return
    for key, value in base.state_dict().items():
        if ".lora_" in key:  # the adapter's own tensors: merged into their base weight below
            continue
        owner, found, leaf = key.partition(".base_layer.")
        tensor = _whole(value.detach())
        if found and leaf == "weight" and owner in layers:
            layer = layers[owner]
            (adapter,) = layer.active_adapters
            with torch.no_grad():
                tensor = tensor + _whole(layer.get_delta_weight(adapter)).to(tensor.dtype)
        yield key.replace(".base_layer.", "."), tensor


def _plain_lora(layer) -> bool:
    """Whether peft merges ``layer`` as base weight + `get_delta_weight` (one adapter, no DoRA, no bias)."""
    adapters = list(layer.active_adapters)
    if len(adapters) != 1 or layer.merged:
        return False
    (a,) = adapters
    return not getattr(layer, "use_dora", {}).get(a, False) and not getattr(layer, "lora_bias", {}).get(a, False)


def _is_sharded(t) -> bool:
    return type(t).__name__ == "DTensor" or type(getattr(t, "data", None)).__name__ == "DTensor"


def _whole(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a sharded `DTensor` gathered whole (collective)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def pad_right(
    rows: list[list], width: int, fill=0, dtype: torch.dtype = torch.long
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged rows -> (``[B, width]``, each row followed by ``fill``; bool mask of the real entries)."""
    out = torch.full((len(rows), width), fill, dtype=dtype)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=dtype)
        mask[i, : len(row)] = True
    return out, mask


def collate_pixels(entries: list[dict], device, dtype) -> dict[str, torch.Tensor]:
    """Per-sample processor tensors -> one batch: concatenated on dim 0, zero-padded on the other
    dims where sizes differ (Idefics3's pixel mask marks the padding; Qwen-VL's flat patches, grids
    and ``second_per_grid_ts`` concatenate as they are). A key some samples lack (a video question
    beside image questions) takes the parts of those that have it, in batch order, as Qwen-VL's flat
    layout expects; the `PER_TOKEN` keys are the caller's."""
    out = {}
    keys = [k for e in entries for k in e if k not in PER_TOKEN]
    for key in dict.fromkeys(keys):
        parts = [e[key] for e in entries if key in e]
        shape = [max(p.shape[d] for p in parts) for d in range(1, parts[0].dim())]
        padded = []
        for p in parts:
            pad = []
            for d in reversed(range(1, p.dim())):
                pad += [0, shape[d - 1] - p.shape[d]]
            padded.append(F.pad(p, pad) if any(pad) else p)
        x = torch.cat(padded, 0).to(device)
        out[key] = x.to(dtype) if x.is_floating_point() else x
    return out


__all__ = [
    "VLMConfig",
    "VLMPolicy",
    "load_vlm",
    "lora_targets",
    "merged_state_dict",
    "stream_weights",
    "collate_pixels",
    "TINY_MODELS",
]
