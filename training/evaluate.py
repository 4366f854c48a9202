"""Evaluation: the teacher-forced validation loss and perplexity (decoding whole splits:
``inference/decoding.py``)."""

import math
from contextlib import nullcontext
from typing import Dict

import torch
from torch import nn

from data.batching import ParallelDataset
from data.specials import PAD_ID
from inference.decoding import ordered_batches, src_mask_of
from training.loss import label_smoothed_nll


@torch.no_grad()
def validation_loss(
    model: nn.Module, dataset: ParallelDataset, batch_tokens: int, device: torch.device, autocast=nullcontext
) -> Dict[str, float]:
    """Per-token NLL (no label smoothing) and perplexity of the references."""
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)  # summed on the device: one sync at the end
    tokens = torch.zeros((), dtype=torch.int64, device=device)
    for batch in ordered_batches(dataset, batch_tokens):
        batch = batch.to(device)
        with autocast():
            logits, _ = model(batch.src, src_mask_of(batch), batch.tgt_in)  # (B, T, V)
        _, nll, n = label_smoothed_nll(logits, batch.tgt_out, PAD_ID, 0.0)
        total, tokens = total + nll, tokens + n
    loss = float(total) / max(int(tokens), 1)
    return {"loss": loss, "ppl": math.exp(min(loss, 50.0))}
