"""Pieces both model families share: token embeddings, positions, the output layer.

``E`` is the embedding size (the RNN's ``embed_dim``, the Transformer's ``D``); ``T`` the length of
any sequence, source or target.
"""

import math
from typing import Optional

import torch
from torch import Tensor, nn


class TokenEmbedding(nn.Module):
    """Token ids -> vectors of size ``E = dim``, optionally scaled by ``sqrt(E)`` (Vaswani et al. 2017,
    section 3.4).

    Initialised from ``N(0, E^-1/2)`` so that a scaled embedding starts at unit variance and an
    output layer tied to it starts with logits of unit scale; the padding row is zero.
    """

    def __init__(self, vocab_size: int, dim: int, pad_id: int = 0, scale: bool = False):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, dim, padding_idx=pad_id)
        nn.init.normal_(self.embedding.weight, mean=0.0, std=dim**-0.5)
        with torch.no_grad():
            self.embedding.weight[pad_id].zero_()
        self.scale = math.sqrt(dim) if scale else 1.0

    @property
    def weight(self) -> Tensor:
        """The ``(V, E)`` embedding matrix (an output layer may share it)."""
        return self.embedding.weight  # (V, E)

    def forward(self, ids: Tensor) -> Tensor:
        """``(B, T)`` ids -> ``(B, T, E)``."""
        return self.embedding(ids) * self.scale  # (B, T, E)


def sinusoidal_table(n_positions: int, dim: int) -> Tensor:
    """``(T, D)`` table for ``T = n_positions``: ``PE[p, 2i] = sin(p / 10000^(2i/D))``,
    ``PE[p, 2i+1] = cos(...)`` (section 3.5)."""
    positions = torch.arange(n_positions, dtype=torch.float32).unsqueeze(1)  # (T, 1)
    rates = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))  # (D/2,)
    table = torch.zeros(n_positions, dim)  # (T, D)
    table[:, 0::2] = torch.sin(positions * rates)  # (T, D/2) even columns
    table[:, 1::2] = torch.cos(positions * rates[: dim // 2])  # (T, D/2) odd columns
    return table


class PositionalEncoding(nn.Module):
    """Adds position vectors to ``(B, T, D)`` inputs, starting at position ``offset``.

    ``sinusoidal`` positions are computed (for any length); ``learned`` ones are parameters and
    cover ``max_positions`` positions.
    """

    def __init__(self, dim: int, kind: str = "sinusoidal", max_positions: int = 1024):
        super().__init__()
        if kind not in ("sinusoidal", "learned"):
            raise ValueError(f"positions must be 'sinusoidal' or 'learned', got {kind!r}")
        self.kind, self.dim, self.max_positions = kind, dim, max_positions
        if kind == "learned":
            self.learned = nn.Parameter(torch.randn(max_positions, dim) * dim**-0.5)  # (max_positions, D)
        else:
            table = sinusoidal_table(max_positions, dim)  # (max_positions, D)
            self.register_buffer("table", table, persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """``(B, T, D)`` -> ``(B, T, D)`` with positions ``offset .. offset + T - 1`` added."""
        end = offset + x.size(1)
        if self.kind == "learned":
            if end > self.max_positions:
                raise ValueError(
                    f"sequence of {end} positions is longer than model.max_positions={self.max_positions}"
                )
            return x + self.learned[offset:end]  # (B, T, D)
        if end > self.table.size(0):
            self.table = sinusoidal_table(2 * end, self.dim).to(self.table.device)  # (2 end, D)
        return x + self.table[offset:end].to(x.dtype)  # (B, T, D)


class OutputLayer(nn.Module):
    """``(..., E)`` states -> ``(..., V)`` logits, ``E = dim``; the ``(V, E)`` weight may be tied to an
    embedding (Press & Wolf 2017)."""

    def __init__(self, dim: int, vocab_size: int, tie_to: Optional[TokenEmbedding] = None):
        super().__init__()
        self.proj = nn.Linear(dim, vocab_size, bias=False)
        if tie_to is not None:
            if tie_to.weight.shape != self.proj.weight.shape:
                raise ValueError(
                    f"cannot tie the output layer ({vocab_size} x {dim}) to an embedding of shape "
                    f"{tuple(tie_to.weight.shape)}"
                )
            self.proj.weight = tie_to.weight
        else:
            nn.init.normal_(self.proj.weight, mean=0.0, std=dim**-0.5)

    def forward(self, x: Tensor) -> Tensor:
        """``(..., E)`` -> logits ``(..., V)``."""
        return self.proj(x)  # (..., V)
