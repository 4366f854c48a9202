"""Which attention heads matter: each head's entropy and importance over a parallel text.

- **Entropy**: the mean, over the real query positions, of the entropy (nats) of a head's weights
  over its keys: near 0 a head looks at one key, ``log S`` spreads evenly over ``S`` keys.
- **Importance** (Michel et al. 2019, "Are Sixteen Heads Really Better than One?"): how much the
  per-token loss (NLL, teacher-forced) rises when that head alone is masked, its output set to 0
  before the heads are mixed (``models/attention.py``: ``masked_heads``). A negative value: the model
  does better without it.

Every kind of attention is measured (``encoder_self``, ``decoder_self``, ``cross``), layer by layer
and head by head; the RNN has one map (its ``cross``, one head but for ``multihead``).

Shapes: ``B`` sentences, ``H`` heads, ``T`` decoder positions, ``S`` source positions.
"""

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from data.batching import Batch, ParallelDataset, ordered_batches
from data.corpus import read_lines
from data.specials import PAD_ID
from data.tokenizer import Tokenizer
from models.attention import masked_heads

Key = Tuple[str, int, int]  # (kind, layer, head), layer and head 1-based


@dataclass(frozen=True)
class HeadStats:
    """One head's numbers: ``entropy`` (nats, mean over query positions) and ``importance`` (the
    rise of the per-token loss when it is masked)."""

    kind: str
    layer: int
    head: int
    entropy: float
    importance: float


def row_entropy(weights: Tensor) -> Tensor:
    """``(..., Q, K)`` attention weights -> ``(..., Q)``: each row's entropy in nats (``0 log 0 = 0``):
    0 for a row on one key, ``log K`` for a uniform one."""
    return torch.special.entr(weights.detach().float()).sum(dim=-1)  # (..., Q)


def summed_entropy(weights: Tensor, rows: Tensor) -> Tensor:
    """``(B, H, Q, K)`` weights and ``(B, Q)`` real query rows -> ``(H,)`` entropy summed over the
    real rows."""
    return (row_entropy(weights) * rows[:, None, :]).sum(dim=(0, 2))  # (H,)


@torch.no_grad()
def loss_and_entropy(
    model: nn.Module, data: List[Batch], need_weights: bool = True
) -> Tuple[float, Dict[Key, float]]:
    """The per-token NLL of ``data`` (teacher-forced) and, with ``need_weights``, every head's mean
    entropy (``(kind, layer, head)`` keys; else ``{}``)."""
    device = next(model.parameters()).device
    nll, tokens = 0.0, 0
    sums: Dict[Tuple[str, int], Tensor] = {}
    counts = {"cross": 0.0, "decoder_self": 0.0, "encoder_self": 0.0}
    for batch in data:
        batch = batch.to(device)
        logits, attention = model(batch.src, batch.src_mask, batch.tgt_in, need_weights)  # (B, T, V)
        nll += F.cross_entropy(
            logits.flatten(0, 1).float(), batch.tgt_out.flatten(), ignore_index=PAD_ID, reduction="sum"
        ).item()
        target_rows = (batch.tgt_out != PAD_ID).float()  # (B, T)
        source_rows = batch.src_mask.float()  # (B, S)
        tokens += int(target_rows.sum())
        rows = {"cross": target_rows, "decoder_self": target_rows, "encoder_self": source_rows}
        for kind, layers in attention.items():
            counts[kind] += float(rows[kind].sum())
            for layer, weights in enumerate(layers, start=1):
                summed = summed_entropy(weights, rows[kind])  # (H,)
                sums[kind, layer] = sums.get((kind, layer), 0.0) + summed
    entropy = {
        (kind, layer, head): float(total[head - 1]) / max(counts[kind], 1.0)
        for (kind, layer), total in sums.items()
        for head in range(1, len(total) + 1)
    }
    return nll / max(tokens, 1), entropy


def head_stats(model: nn.Module, dataset: ParallelDataset, batch_tokens: int = 4000) -> List[HeadStats]:
    """Entropy and importance of every head of ``model`` over ``dataset``: one pass with the
    weights, then one pass per head with that head masked."""
    model.eval()
    data = list(ordered_batches(dataset, batch_tokens))
    _, entropy = loss_and_entropy(model, data)
    # the baseline by the same kernels as the masked passes (the weights take another path)
    loss = loss_and_entropy(model, data, need_weights=False)[0]
    stats = []
    for kind, modules in model.attention_modules().items():
        for layer, module in enumerate(modules, start=1):
            for head in range(1, module.n_heads + 1):
                mask = torch.ones(module.n_heads, device=next(model.parameters()).device)  # (H,)
                mask[head - 1] = 0.0
                with masked_heads({module: mask}):
                    importance = loss_and_entropy(model, data, need_weights=False)[0] - loss
                stats.append(HeadStats(kind, layer, head, entropy[kind, layer, head], importance))
    return stats


def text_head_stats(
    model: nn.Module, tokenizer: Tokenizer, src: Path, tgt: Path
) -> Tuple[List[HeadStats], str]:
    """``head_stats`` over the raw parallel text of ``src`` and ``tgt``, and a sentence on what they are."""
    src_ids = tokenizer.encode_src(read_lines(src))
    tgt_ids = tokenizer.encode_tgt(read_lines(tgt))
    start = time.perf_counter()
    stats = head_stats(model, ParallelDataset(src_ids, tgt_ids))
    about = (
        f"Over `{src}` / `{tgt}` ({len(src_ids)} pairs, {time.perf_counter() - start:.1f} s): "
        "the entropy of each head's weights (nats, the mean over query positions), and its importance, "
        "the rise of the per-token loss when that head alone is masked (Michel et al. 2019)."
    )
    return stats, about
