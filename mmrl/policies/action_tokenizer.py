"""Discretise continuous actions into bins and map the bins to reserved vocabulary tokens.

OpenVLA-style action tokenization: every action dimension (already normalised to ``[low, high]``,
by default ``[-1, 1]``) is cut into ``num_bins`` uniform bins of width ``(high - low) / num_bins``::

    bin    = clamp(floor((a - low) / width), 0, num_bins - 1)     a = low -> 0, a = high -> num_bins - 1
    centre = low + (bin + 0.5) * width                             |a - centre(bin(a))| <= width / 2

Bins map to token ids of a language model in one of two ways:

- ``vocab_size=V`` (OpenVLA's convention): the last ``num_bins`` tokens of the vocabulary,
  ``token = V - 1 - bin`` (bin 0 is the very last token).
- ``token_ids=[...]``: an explicit list, ``token_ids[bin]`` (e.g. ``num_bins`` special tokens
  added to the tokenizer).

Without either, only the bin <-> action half is available. Everything works on tensors of any
leading shape; the last dimension of ``actions`` is the action dimension but the mapping is
element-wise, so ``[.., A]``, ``[.., C, A]`` and flattened ``[.., C*A]`` layouts all work.
"""

from __future__ import annotations

import torch


class ActionTokenizer:
    """Uniform per-dimension action bins and their vocabulary token ids; see the module docstring."""

    def __init__(
        self,
        num_bins: int = 256,
        low: float = -1.0,
        high: float = 1.0,
        token_ids: list[int] | None = None,
        vocab_size: int | None = None,
    ):
        if num_bins < 2:
            raise ValueError(f"num_bins must be >= 2, got {num_bins}")
        if not high > low:
            raise ValueError(f"need high > low, got low={low}, high={high}")
        self.num_bins, self.low, self.high = int(num_bins), float(low), float(high)
        self.width = (self.high - self.low) / self.num_bins
        if token_ids is not None and vocab_size is not None:
            raise ValueError("pass token_ids or vocab_size, not both")
        if vocab_size is not None:
            if vocab_size < num_bins:
                raise ValueError(f"vocab_size ({vocab_size}) is smaller than num_bins ({num_bins})")
            token_ids = [vocab_size - 1 - b for b in range(num_bins)]
        self.vocab_size = vocab_size
        self._ids: torch.Tensor | None = None
        self._lookup: torch.Tensor | None = None  # token id -> bin (-1 = not an action token)
        if token_ids is not None:
            ids = torch.as_tensor(list(token_ids), dtype=torch.long)
            if ids.shape != (num_bins,):
                raise ValueError(f"token_ids must hold num_bins={num_bins} ids, got {ids.numel()}")
            if ids.min() < 0 or len(set(ids.tolist())) != num_bins:
                raise ValueError("token_ids must be distinct non-negative ids")
            self._ids = ids
            self._lookup = torch.full((int(ids.max()) + 1,), -1, dtype=torch.long)
            self._lookup[ids] = torch.arange(num_bins)

    # ---- actions <-> bins -------------------------------------------------------------------
    def encode(self, actions: torch.Tensor) -> torch.Tensor:
        """Actions [..] (any float shape) -> bin ids long [..] in [0, num_bins); values outside
        ``[low, high]`` fall into the edge bins."""
        x = (actions.float() - self.low) / self.width
        return torch.floor(x).clamp(0, self.num_bins - 1).long()

    def decode(self, bins: torch.Tensor) -> torch.Tensor:
        """Bin ids [..] -> bin-centre actions float32 [..]."""
        return self.low + (bins.float() + 0.5) * self.width

    @property
    def centers(self) -> torch.Tensor:
        """Bin centres float32 [num_bins]."""
        return self.decode(torch.arange(self.num_bins))

    # ---- bins <-> vocabulary tokens -----------------------------------------------------------
    @property
    def token_ids(self) -> torch.Tensor:
        """long [num_bins]: the vocabulary id of each bin (``token_ids[bin]``)."""
        if self._ids is None:
            raise ValueError("this ActionTokenizer has no vocabulary mapping: pass token_ids or vocab_size")
        return self._ids

    def bins_to_tokens(self, bins: torch.Tensor) -> torch.Tensor:
        ids = self.token_ids.to(bins.device)
        return ids[bins.long()]

    def tokens_to_bins(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids [..] -> bin ids [..]; raises if one is not an action token."""
        self.token_ids  # noqa: B018  (raises without a mapping)
        assert self._lookup is not None  # made with the mapping
        lookup = self._lookup.to(tokens.device)
        tokens = tokens.long()
        inside = (tokens >= 0) & (tokens < lookup.numel())
        bins = torch.where(inside, lookup[tokens.clamp(0, lookup.numel() - 1)], torch.full_like(tokens, -1))
        if (bins < 0).any():
            bad = tokens[bins < 0][:5].tolist()
            raise ValueError(f"token ids {bad} are not action tokens of this ActionTokenizer")
        return bins

    def actions_to_tokens(self, actions: torch.Tensor) -> torch.Tensor:
        return self.bins_to_tokens(self.encode(actions))

    def tokens_to_actions(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.decode(self.tokens_to_bins(tokens))

    def __repr__(self) -> str:
        where = (
            f"vocab_size={self.vocab_size}"
            if self.vocab_size is not None
            else "token_ids=[...]"
            if self._ids is not None
            else "no tokens"
        )
        return f"ActionTokenizer(num_bins={self.num_bins}, low={self.low}, high={self.high}, {where})"


__all__ = ["ActionTokenizer"]
