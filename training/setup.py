"""A run's setup, one value made once: the model and the module that runs its forward pass (the
model itself, its DDP wrapper or its compiled form), the optimizer, the device and precision, the
ranks, the trainer config, the data and the run folder. The training step (``training/step.py``),
validation (``training/validation.py``) and the test decoding (``training/results.py``) take it
whole instead of a dozen loose fields; the ``Trainer`` holds it beside what changes as it trains
(progress, schedule, board)."""

import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager

import torch
from omegaconf import DictConfig
from torch import nn

from alignment.reference import attach_links
from common.device import (
    amp_choice,
    attention_kernels,
    autocast_for,
    native_bf16,
    pick_device,
    precision_name,
    set_tf32,
    set_threads,
)
from data.config import DataConfig
from data.pipeline import PreparedData, prepare_data
from data.specials import PAD_ID
from data.tokenizer import Tokenizer
from inference.decoding import batch_tokens_for
from models.build import ModelConfig, build_model, count_parameters
from training import distributed
from training.config import TrainerConfig
from training.distributed import World

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Setup:
    model: nn.Module
    forward: nn.Module  # runs the model's forward pass in training: itself, DDP's wrapper or compiled
    optimizer: torch.optim.Optimizer
    device: torch.device
    autocast: Callable[[], ContextManager]  # the precision of training, validation and test decoding
    precision: str  # its name (float32, tf32, bfloat16): translate.py's --dtype auto takes it
    precision_reason: str  # why (trainer.amp and the device's bf16), said once in train.log
    world: World
    tc: TrainerConfig
    model_cfg: ModelConfig
    params: int
    data: PreparedData
    out_dir: Path
    eval_batch_tokens: int  # the batches of validation and test decoding


FUSED_DEVICES = ("cpu", "cuda")  # where torch has one kernel for the whole Adam update


def make_optimizer(model: nn.Module, tc: TrainerConfig) -> torch.optim.Optimizer:
    """``trainer.optimizer`` over the model's parameters, fused on the CPU and on CUDA: one kernel
    updates every parameter, where torch's default on the CPU loops over them (the default
    Transformer's update took 7 ms instead of 31 on a 2-core AVX2 machine)."""
    kinds = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}  # training/config.py OPTIMIZERS
    params = list(model.parameters())
    fused = all(p.device.type in FUSED_DEVICES and p.is_floating_point() for p in params)
    return kinds[tc.optimizer](
        params, lr=tc.lr, betas=tuple(tc.betas), weight_decay=tc.weight_decay, fused=fused or None
    )


def compiled_forward(module: nn.Module, tc: TrainerConfig) -> nn.Module:
    """``module`` compiled in ``trainer.compile_mode`` when ``trainer.compile``, else itself (torch
    compiles at the first call, not here)."""
    return torch.compile(module, mode=tc.compile_mode) if tc.compile else module


def model_for(model_cfg: ModelConfig, tokenizer: Tokenizer) -> nn.Module:
    """The model of ``model_cfg`` for the tokenizer's vocabularies (with separate vocabularies the
    source and target embeddings cannot be shared, whatever ``model.share_embeddings`` says)."""
    if not tokenizer.joint and model_cfg.share_embeddings:
        log.info(
            "separate vocabularies (data.joint_vocab=false): source and target embeddings are not shared"
        )
        model_cfg.share_embeddings = False
    return build_model(model_cfg, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, PAD_ID)


def make_setup(
    cfg: DictConfig, data_cfg: DataConfig, model_cfg: ModelConfig, tc: TrainerConfig, out_dir: Path
) -> Setup:
    """The ranks, the device, the data, the model (seeded by ``cfg.seed``: the same initial weights
    on every rank), the optimizer and the precision of a run."""
    world = distributed.world_from_env()
    device = pick_device(cfg.device, world.local_rank, world.local_world_size)
    set_threads(device, tc.num_threads)
    distributed.init(world, device)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    with distributed.main_first(world):  # rank 0 trains and caches the tokenizer; the others then read it
        data = prepare_data(data_cfg)
        if tc.guided_alignment > 0:  # the training pairs' reference links (computed once, then cached)
            attach_links(data, data_cfg)
    model = model_for(model_cfg, data.tokenizer).to(device)
    optimizer = make_optimizer(model, tc)
    # one precision for training, validation and the test decoding (translate.py takes the same);
    # TF32 for the whole process, so that the backward pass has it too
    amp, reason = amp_choice(tc.amp, device, native_bf16())
    if device.type == "cuda":
        set_tf32(tc.tf32)
        attention_kernels(device, cudnn=tc.cudnn_attention)
    ddp = distributed.wrap(model, world, device)  # shares the model's parameters, all-reduces their gradients
    forward = compiled_forward(ddp, tc)
    if world.distributed:
        torch.manual_seed(cfg.seed * 1000 + world.rank)  # each rank its own dropout masks
    return Setup(
        model,
        forward,
        optimizer,
        device,
        autocast_for(device, amp),
        precision_name(device, amp, tc.tf32),
        reason,
        world,
        tc,
        model_cfg,
        count_parameters(model),
        data,
        Path(out_dir),
        tc.eval_batch_tokens or batch_tokens_for(device, tc.batch_tokens),
    )
