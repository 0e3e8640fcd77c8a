"""Action-token vision-language-action policy (OpenVLA / OpenVLA-OFT style), trained by PPO / GRPO.

    camera image(s) + instruction
      -> chat prompt "What action should the robot take to {instruction}?"  (processor, left padded)
      -> transformers image-text LM (AutoModelForImageTextToText)
      -> C*A action tokens, each one of ``num_bins`` reserved vocabulary tokens
      -> bins -> bin-centre actions in [-1, 1] (`ActionTokenizer`) -> env units (`ActionNormalizer`)

The policy's distribution over one action token is the LM's logits restricted to the ``num_bins``
action-bin tokens (the other vocabulary logits are masked out, i.e. never computed: the bin rows
of the LM head are applied to the hidden state), divided by ``temperature`` and optionally cut to
the ``top_k`` most likely bins (``evaluate`` keeps the taken bin in the support, so its log-prob
stays finite after updates; before one it is in the top k anyway). Rollout and ``evaluate`` use
the same function of the same logits, so recomputed log-probs equal the rollout's before an update
(ratio 1). ``logp`` is per token:
``[B, C*A]`` (``logp_shape = (C*A,)``), in the order chunk step major, action dim minor; the
trainer's ``algorithm.loss_agg`` aggregates the per-token PPO loss.

Decoding (``decoding``):

- ``"autoregressive"`` (OpenVLA): token j is sampled given the prompt and tokens 0..j-1. Rollout
  runs the prompt once and then one forward call per token with the KV cache; ``evaluate``
  teacher-forces ``[prompt, t_0 .. t_{n-2}]`` in one forward pass and reads the hidden states at
  the last prompt position and after each fed token.
- ``"parallel"`` (OpenVLA-OFT-like): ``n = C*A`` copies of one placeholder token are appended
  after the prompt and ONE forward pass predicts every action token: the hidden state at
  placeholder j gives the bin logits of token j. The placeholder is a dedicated trainable special
  token ``<action_query>`` added to the tokenizer (``placeholder_token`` names an existing token
  instead). OFT feeds all-zero "empty" embeddings; here a zero embedding (e.g. a LLaMA pad token)
  would RMS-normalise to zero, give zero queries in the first layer and hide the positions, so
  it learns far slower. The model stays causal (OFT switches to bidirectional attention, which a
  stock HF model does not expose): placeholder j attends to the prompt and placeholders 0..j.
  Identical placeholders carry only their position, so the n tokens are conditionally independent
  given the prompt and are sampled independently. Rollout and ``evaluate`` run exactly the same
  forward pass.

Vocabulary (``action_tokens``): ``"last"`` is OpenVLA's convention, the last ``num_bins`` ids of
the tokenizer's base vocabulary (``token = tokenizer.vocab_size - 1 - bin``; it refuses if that
range holds a special or added token); ``"new"`` adds ``num_bins`` special tokens ``<action_0>``,
``<action_1>``, ... to the tokenizer (kept if already there) and resizes the model's embeddings
(new rows: the old rows' per-dimension mean plus Gaussian noise of their std, drawn from the
global torch RNG, so seed first). Added tokens (``"new"``, ``<action_query>``) are added again,
identically, when a checkpoint's policy is rebuilt from ``model``. Use ``"new"`` when the last ids
are tokens the prompt needs (true for the tiny test tokenizer, whose last ids include "Assistant").

Value head (``critic``): an MLP on the hidden state of the last prompt token (detached from the
LM unless ``detach_value=False``). ``freeze_vision`` freezes the vision tower (not the projector).
Proprioceptive ``state`` is stored in the rollout batch but not fed to the model (OpenVLA does
not use it). Not implemented: LoRA (the whole LM trains, or freeze parts yourself), OFT's
continuous L1 action head and FiLM. Only models whose text decoder takes 1-D position ids are
supported as such (SmolVLM / Idefics3 is what the tests run; others are untested here);
multimodal-RoPE models (Qwen2-VL) get no explicit position ids and are untested; OpenVLA's own
remote-code checkpoint uses a different class layout and is not supported by this loader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from mmrl.batch import Batch
from mmrl.capabilities import Capabilities
from mmrl.config import ConfigError
from mmrl.policies.action_tokenizer import ActionTokenizer
from mmrl.policies.base import Decision, Evaluation, HFModel, Policy, PolicyConfig, decode_text, encode_text
from mmrl.policies.processing import ActionNormalizer, resize_images
from mmrl.utils.rows import rows_generator

PLACEHOLDER = "<action_query>"  # parallel decoding's default input token
VISION_TOWER_NAMES = ("vision_model", "vision_tower", "visual", "vision_backbone", "vision_encoder")


@dataclass
class TokenVLAConfig(PolicyConfig):
    """Configuration of `TokenVLAPolicy` (the ``policy`` section of an experiment)."""

    type: str = "token_vla"
    model: str = "HuggingFaceTB/SmolVLM-256M-Instruct"  # transformers image-text hub id or local path
    trust_remote_code: bool = False  # let transformers run the checkpoint's own modelling code
    # the model's weights dtype (auto: the checkpoint's)
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    chunk_size: int = 4
    # environment units of the action bounds, per dimension (or one value for all): the policy
    # samples in [-1, 1] and the environment gets low + (x + 1) (high - low) / 2 (e.g. a dataset's
    # 1st / 99th percentiles, as OpenVLA); null = the simulator's [-1, 1] contract
    action_low: list[float] | None = None
    action_high: list[float] | None = None
    num_bins: int = 256  # uniform bins over [-1, 1] per action dimension, one reserved token each
    action_tokens: Literal["last", "new"] = "last"  # which vocabulary ids are the action bins
    # autoregressive (OpenVLA: a token at a time) or parallel (OpenVLA-OFT-like: one forward pass)
    decoding: Literal["autoregressive", "parallel"] = "autoregressive"
    placeholder_token: str | None = None  # parallel decoding's input token (None = add <action_query>)
    temperature: float = 1.0  # divides the bin logits in rollout AND evaluate
    top_k: int | None = None  # sample among the k most likely bins (None = all)
    critic: bool = True
    detach_value: bool = True
    image_size: int = 224  # camera images are resized to this before the processor
    max_instruction_tokens: int = 64  # longer instructions are cut to this many tokens
    prompt: str = "What action should the robot take to {instruction}?"  # the text around the instruction
    freeze_vision: bool = False  # keep the vision tower fixed (not the projector)

    def validate(self) -> None:
        if self.num_bins < 2:
            raise ConfigError(f"'num_bins' must be >= 2, got {self.num_bins}")
        if self.chunk_size < 1:
            raise ConfigError(f"'chunk_size' must be >= 1, got {self.chunk_size}")
        if not self.temperature > 0:
            raise ConfigError(f"'temperature' must be > 0, got {self.temperature}")
        if self.top_k is not None and not 1 <= self.top_k <= self.num_bins:
            raise ConfigError(f"'top_k' must be null or in [1, num_bins={self.num_bins}], got {self.top_k}")
        if "{instruction}" not in self.prompt:
            raise ConfigError("'prompt' must contain the placeholder {instruction}")


class TokenVLAPolicy(Policy[TokenVLAConfig]):
    """Image-text LM emitting C*A action-bin tokens (+ value head); see the module docstring."""

    config_class = TokenVLAConfig
    bin_ids: torch.Tensor  # buffer: the vocabulary id of each action bin

    @classmethod
    def capabilities(cls, cfg: TokenVLAConfig) -> Capabilities:
        """Action chunks as bin tokens, one log-prob per token, a critic with ``critic``."""
        return Capabilities(
            logp="token",
            critic=cfg.critic,
            fixes={
                "critic": "set policy.critic=true, or use a group estimator "
                "(algorithm.advantage: grpo, rloo, ...) with group_size >= 2",
                "likelihood_free": "the token VLA has no flow-matching loss: use algorithm.objective=ppo",
                "kl_reference": "the token VLA keeps no reference model: set algorithm.kl_coef=0",
            },
        )

    @property
    def chunk_size(self) -> int:
        return self.cfg.chunk_size

    def __init__(
        self,
        cfg: TokenVLAConfig,
        action_dim: int,
        state_dim: int | None = None,
        model: HFModel | None = None,
        processor=None,
        normalizer: ActionNormalizer | None = None,
    ):
        super().__init__()
        if (model is None) != (processor is None):
            raise ValueError("pass both model and processor, or neither (then cfg.model is loaded)")
        if model is None:
            model, processor = load_model(cfg)
        self.cfg, self.action_dim, self.state_dim = cfg, action_dim, state_dim
        self.model, self.processor = model, processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        ids = setup_action_vocab(model, self.tokenizer, cfg.num_bins, cfg.action_tokens)
        self.action_tokenizer = ActionTokenizer(cfg.num_bins, token_ids=ids)
        self.register_buffer("bin_ids", torch.tensor(ids, dtype=torch.long), persistent=False)
        self.placeholder_id = self._placeholder_id() if cfg.decoding == "parallel" else None
        if cfg.freeze_vision:
            freeze_vision_tower(model)
        text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        d = int(text_config.hidden_size)
        self.value_head = nn.Sequential(nn.Linear(d, d), nn.Tanh(), nn.Linear(d, 1)) if cfg.critic else None
        self.normalizer = normalizer or ActionNormalizer.from_config(cfg.action_low, cfg.action_high)
        self.num_tokens = cfg.chunk_size * action_dim
        self.logp_shape = (self.num_tokens,)

    # ---- model plumbing ---------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.bin_ids.device

    def _base(self) -> HFModel:
        inner = getattr(self.model, "model", None)
        return inner if isinstance(inner, nn.Module) else self.model.base_model

    def _placeholder_id(self) -> int:
        name = self.cfg.placeholder_token
        if name is None:
            return add_tokens(self.model, self.tokenizer, [PLACEHOLDER])[0]
        if name not in self.tokenizer.get_vocab():
            raise ValueError(
                f"placeholder token {name!r} is not in the tokenizer. "
                "Fix: set policy.placeholder_token to an existing token, or null"
            )
        return int(self.tokenizer.convert_tokens_to_ids(name))

    def build_prompt(self, instruction: str, num_images: int) -> str:
        """Chat-template text for one sample: ``num_images`` images, then the question."""
        ids = self.tokenizer(instruction, add_special_tokens=False)["input_ids"]
        if len(ids) > self.cfg.max_instruction_tokens:
            instruction = self.tokenizer.decode(ids[: self.cfg.max_instruction_tokens])
        text = self.cfg.prompt.format(instruction=instruction)
        if getattr(self.processor, "chat_template", None):
            content = [{"type": "image"} for _ in range(num_images)] + [{"type": "text", "text": text}]
            return self.processor.apply_chat_template(
                [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
            )
        token = getattr(self.processor, "image_token", None) or "<image>"
        return token * num_images + text

    def encode_prompt(self, images: torch.Tensor, instructions: list[str]) -> dict[str, torch.Tensor]:
        """images uint8 [B, (V,) H, W, 3] + B instructions -> left-padded processor outputs."""
        from mmrl.policies.hf_backbone import images_to_pil

        images = resize_images(images.cpu(), self.cfg.image_size)
        pil = images_to_pil(images)
        if len(instructions) != len(pil):
            raise ValueError(f"{len(pil)} image samples but {len(instructions)} instructions")
        prompts = [self.build_prompt(t, len(views)) for t, views in zip(instructions, pil)]
        enc = self.processor(text=prompts, images=pil, return_tensors="pt", padding=True, padding_side="left")
        dtype = next(self.model.parameters()).dtype
        return {
            k: v.to(self.device, dtype=dtype if v.is_floating_point() else None)
            for k, v in enc.items()
            if isinstance(v, torch.Tensor)
        }

    def _run(self, enc: dict, extra: torch.Tensor | None = None, past=None, use_cache: bool = False):
        """Forward the base model on [prompt, extra tokens] (or only ``extra`` given a KV cache)."""
        mask = enc["attention_mask"]
        if extra is not None:
            mask = torch.cat([mask, torch.ones_like(extra)], 1)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # left padding: real tokens count from 0
        kw = {}
        if not hasattr(self._base(), "get_rope_index"):
            if past is None:
                kw["position_ids"] = positions
            else:
                assert extra is not None, "with a KV cache only the new tokens run"
                kw["position_ids"] = positions[:, -extra.shape[1] :]
        if past is None:
            ids = enc["input_ids"] if extra is None else torch.cat([enc["input_ids"], extra], 1)
            kw.update({k: v for k, v in enc.items() if k not in ("input_ids", "attention_mask")})
        else:
            ids = extra
        return self._base()(
            input_ids=ids, attention_mask=mask, past_key_values=past, use_cache=use_cache, return_dict=True, **kw
        )

    def bin_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states [.., D] -> float32 logits over the action bins [.., num_bins] (the LM head's
        rows of the bin tokens: the full-vocabulary logits masked to the bin slice)."""
        head = self.model.get_output_embeddings()
        w = head.weight[self.bin_ids].float()
        b = head.bias[self.bin_ids].float() if getattr(head, "bias", None) is not None else None
        return F.linear(hidden.float(), w, b)

    def _dist(self, logits: torch.Tensor, taken: torch.Tensor | None = None) -> torch.Tensor:
        """Sampling logits: temperature, then top-k (the ``taken`` bins always stay in)."""
        logits = logits / self.cfg.temperature
        k = self.cfg.top_k
        if k is not None and k < logits.shape[-1]:
            keep = logits >= logits.topk(k, dim=-1).values[..., -1:]
            if taken is not None:
                keep = keep | F.one_hot(taken, logits.shape[-1]).bool()
            logits = logits.masked_fill(~keep, float("-inf"))
        return logits

    def _values(self, last_prompt_hidden: torch.Tensor) -> torch.Tensor | None:
        if self.value_head is None:
            return None
        h = last_prompt_hidden.float()
        return self.value_head(h.detach() if self.cfg.detach_value else h).squeeze(-1)

    def _teacher_forced(self, enc: dict, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward pass -> (bin logits [B, n, bins] predicting ``tokens`` [B, n], last prompt hidden [B, D])."""
        n, plen = tokens.shape[1], enc["input_ids"].shape[1]
        if self.cfg.decoding == "autoregressive":
            hidden = self._run(enc, tokens[:, :-1]).last_hidden_state
            pred = hidden[:, plen - 1 :]
        else:
            hidden = self._run(enc, self._placeholders(tokens.shape[0])).last_hidden_state
            pred = hidden[:, plen:]
        assert pred.shape[1] == n
        return self.bin_logits(pred), hidden[:, plen - 1]

    def _placeholders(self, b: int) -> torch.Tensor:
        assert self.placeholder_id is not None, "parallel decoding (the only caller) has a placeholder token"
        return torch.full((b, self.num_tokens), self.placeholder_id, dtype=torch.long, device=self.device)

    @staticmethod
    def _pick(logits: torch.Tensor, greedy: bool, generator: torch.Generator | None) -> torch.Tensor:
        if greedy:
            return logits.argmax(-1)
        probs = logits.softmax(-1)
        flat = probs.reshape(-1, probs.shape[-1])
        return torch.multinomial(flat, 1, generator=rows_generator(generator)).reshape(probs.shape[:-1])

    # ---- the policy contract ------------------------------------------------------------------
    @torch.no_grad()
    def rollout(self, obs, generator: torch.Generator | None = None, mode: str = "train") -> Decision:
        greedy = mode != "train"
        enc = self.encode_prompt(obs.image, list(obs.instruction))
        b, n = enc["input_ids"].shape[0], self.num_tokens
        if self.cfg.decoding == "parallel":
            hidden = self._run(enc, self._placeholders(b)).last_hidden_state
            plen = enc["input_ids"].shape[1]
            logits = self._dist(self.bin_logits(hidden[:, plen:]))
            bins = self._pick(logits, greedy, generator)
            logp = logits.log_softmax(-1).gather(-1, bins[..., None]).squeeze(-1)
            last = hidden[:, plen - 1]
        else:  # autoregressive with the KV cache: prompt once, then one call per token
            out = self._run(enc, use_cache=True)
            last = h = out.last_hidden_state[:, -1]
            past, fed = out.past_key_values, enc
            bins_l, logp_l = [], []
            for j in range(n):
                logits = self._dist(self.bin_logits(h))
                bin_j = self._pick(logits, greedy, generator)
                bins_l.append(bin_j)
                logp_l.append(logits.log_softmax(-1).gather(-1, bin_j[:, None]).squeeze(-1))
                if j == n - 1:
                    break
                tok = self.bin_ids[bin_j][:, None]
                out = self._run(fed, tok, past=past, use_cache=True)
                fed = {"attention_mask": torch.cat([fed["attention_mask"], torch.ones_like(tok)], 1)}
                h, past = out.last_hidden_state[:, -1], out.past_key_values
            bins, logp = torch.stack(bins_l, 1), torch.stack(logp_l, 1)
        actions = self.action_tokenizer.decode(bins).reshape(b, self.cfg.chunk_size, self.action_dim)
        batch = Batch(
            image=obs.image.to(self.device),
            instruction=encode_text(list(obs.instruction)).to(self.device),
            actions=self.normalizer.unnormalize(actions),
            action_tokens=self.bin_ids[bins],
            old_logp=logp,
        )
        if obs.state is not None:
            batch["state"] = obs.state.to(self.device).float()
        values = self._values(last)
        if values is not None:
            batch["old_values"] = values
        return Decision(batch, batch["actions"])

    def evaluate(self, batch: Batch) -> Evaluation:
        """Teacher-forced log-probs ``logp`` [B, C*A] of ``action_tokens``, ``values`` [B] (or None)
        and ``entropy`` (mean entropy of the per-token bin distributions, a scalar)."""
        enc = self.encode_prompt(batch["image"], decode_text(batch["instruction"]))
        taken = self.action_tokenizer.tokens_to_bins(batch["action_tokens"].to(self.device))
        logits, last = self._teacher_forced(enc, batch["action_tokens"].to(self.device))
        logp_all = self._dist(logits, taken).log_softmax(-1)
        logp = logp_all.gather(-1, taken[..., None]).squeeze(-1)
        finite = logp_all.clamp(min=torch.finfo(logp_all.dtype).min)
        entropy = -(logp_all.exp() * finite).sum(-1).mean()
        return Evaluation(logp=logp, entropy=entropy, values=self._values(last))

    def supervised_loss(self, batch: Batch) -> torch.Tensor:
        """Cross-entropy [B] (mean over the C*A tokens) of the demonstration chunk ``actions``
        [B, C, A] (env units) discretised into bins, over the bin slice at temperature 1."""
        enc = self.encode_prompt(batch["image"], decode_text(batch["instruction"]))
        x = self.normalizer.normalize(batch["actions"].to(self.device).float())
        bins = self.action_tokenizer.encode(x).reshape(x.shape[0], -1)
        logits, _ = self._teacher_forced(enc, self.bin_ids[bins])
        return F.cross_entropy(logits.transpose(1, 2), bins, reduction="none").mean(-1)


# ---- loading and vocabulary -----------------------------------------------------------------
def load_model(cfg: TokenVLAConfig):
    """``AutoModelForImageTextToText`` + ``AutoProcessor`` from ``cfg.model`` (hub id or local path)."""
    from mmrl.utils.compat import patch_torchvision

    patch_torchvision()  # a broken torchvision install would otherwise break transformers imports
    from transformers import AutoModelForImageTextToText, AutoProcessor

    dtype = cfg.dtype if cfg.dtype == "auto" else getattr(torch, cfg.dtype)
    model = AutoModelForImageTextToText.from_pretrained(cfg.model, dtype=dtype, trust_remote_code=cfg.trust_remote_code)
    processor = AutoProcessor.from_pretrained(cfg.model, trust_remote_code=cfg.trust_remote_code)
    return model, processor


def setup_action_vocab(model: HFModel, tokenizer, num_bins: int, mode: str) -> list[int]:
    """Token id of each action bin (``ids[bin]``); ``mode="new"`` may add tokens and resize the model."""
    rows = model.get_output_embeddings().weight.shape[0]
    if mode == "last":
        vocab = int(tokenizer.vocab_size)
        ids = [vocab - 1 - b for b in range(num_bins)]
        if num_bins > vocab or vocab > rows:
            raise ValueError(
                f"cannot use the last {num_bins} of the tokenizer's {vocab} ids as action bins "
                f"(model output rows: {rows}). Fix: lower policy.num_bins or set "
                "policy.action_tokens=new"
            )
        reserved = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))
        clash = sorted(set(ids) & reserved)
        if clash:
            raise ValueError(
                f"the last {num_bins} vocabulary ids include special / added tokens "
                f"{tokenizer.convert_ids_to_tokens(clash[:5])}. Fix: set policy.action_tokens=new "
                "(adds dedicated action tokens) or lower policy.num_bins"
            )
        return ids
    if mode != "new":
        raise ValueError(f"action_tokens must be 'last' or 'new', got {mode!r}")
    return add_tokens(model, tokenizer, [f"<action_{b}>" for b in range(num_bins)])


def add_tokens(model: HFModel, tokenizer, names: list[str]) -> list[int]:
    """Ids of special tokens ``names``, adding the missing ones to the tokenizer and resizing the
    model's embeddings (new rows: see `_init_new_rows`)."""
    rows = model.get_output_embeddings().weight.shape[0]
    vocab = tokenizer.get_vocab()
    missing = [t for t in names if t not in vocab]
    if missing:
        tokenizer.add_tokens(missing, special_tokens=True)
    if len(tokenizer) > rows:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
        _init_new_rows(model, rows)
    return [int(i) for i in tokenizer.convert_tokens_to_ids(names)]


@torch.no_grad()
def _init_new_rows(model: HFModel, old_rows: int) -> None:
    """Rows ``old_rows:`` of the input / output embeddings := mean + std * N(0, 1) of the old rows
    (per dimension, global torch RNG). transformers' mean resizing gives every new row the same
    vector, which would make all action tokens identical inputs and logits."""
    mats = [model.get_input_embeddings().weight]
    out = model.get_output_embeddings().weight
    if out.data_ptr() != mats[0].data_ptr():
        mats.append(out)
    for w in mats:
        old = w[:old_rows].float()
        noise = torch.randn(w.shape[0] - old_rows, w.shape[1], device=w.device)
        w[old_rows:] = (old.mean(0) + old.std(0) * noise).to(w.dtype)


def freeze_vision_tower(model: nn.Module) -> list[str]:
    """requires_grad=False on the vision encoder(s) (not the projector); returns their names."""
    found = [name for name, _ in model.named_modules() if name.split(".")[-1] in VISION_TOWER_NAMES]
    found = [n for n in found if not any(n != o and n.startswith(o + ".") for o in found)]
    if not found:
        raise ValueError(f"freeze_vision: no vision tower ({', '.join(VISION_TOWER_NAMES)}) in {type(model).__name__}")
    for name in found:
        model.get_submodule(name).requires_grad_(False)
    return found


__all__ = ["TokenVLAConfig", "TokenVLAPolicy", "load_model", "setup_action_vocab", "add_tokens", "freeze_vision_tower"]
