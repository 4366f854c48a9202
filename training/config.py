"""Typed schemas of the whole config, registered with Hydra's ConfigStore.

``conf/config.yaml`` starts from ``base_config`` (the ``Config`` dataclass below); each file of
``conf/model/`` extends ``rnn_schema`` or ``transformer_schema``. A misspelt key or a value of the
wrong type then fails when the config is composed, naming the key.
"""

from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from common.settings import NOT_SETTINGS, check_keys
from data.config import DataConfig, data_config
from models.config import RNNConfig, TransformerConfig, config_from_dict
from training.schedule import FITTED, SCHEDULES

OPTIMIZERS = ("adam", "adamw")  # training/setup.py make_optimizer
AMP = ("auto", "true", "false")  # trainer.amp: common/device.py amp_choice
# trainer.compile_mode: torch.compile's modes; those that record CUDA graphs (on CUDA only)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


@dataclass
class TrainerConfig:
    """Training, evaluation and limits. The defaults are the default recipe, the small Transformer on
    Multi30k sized for 2 CPU cores (8 epochs: 35 to 50 min), so ``conf/trainer/transformer.yaml``
    sets nothing; every other ``conf/trainer/*.yaml`` lists only what differs (tests/test_defaults.py).
    Measured values: docs/sweeps.md."""

    # Stop at whichever limit comes first (null: no limit from that key).
    max_epochs: Optional[int] = 8
    max_steps: Optional[int] = None
    max_minutes: Optional[float] = None  # wall-clock budget for training (evaluations included)
    # Tokens per batch: source + target positions, padding included (n_pairs * (S + T)). 4096 gives
    # twice the updates of 8192 at the same speed; 2048 lost over 8 epochs (the 2-epoch proxies).
    batch_tokens: int = 4096
    accumulate: int = 1  # batches per optimizer step (gradient accumulation)
    optimizer: str = "adam"  # adam or adamw
    lr: float = 1.5e-3  # peak learning rate: the best 3-epoch proxy of 1e-3 / 1.5e-3 / 2e-3 / 3e-3
    betas: List[float] = field(default_factory=lambda: [0.9, 0.98])
    weight_decay: float = 0.0
    # training/schedule.py lr_at(step), after a linear warm-up: fitted to the run, linear or cosine
    # (decay to min_lr at the run's last step); open-ended, inverse_sqrt (lr * sqrt(warmup / step)),
    # exponential (lr * decay_rate ** ((step - warmup) / decay_steps)) or constant.
    schedule: str = "cosine"
    # A fitted schedule warms up over at most a quarter of the run. 200: ahead of 100 from the fourth
    # epoch on, in the proxy and in a full run.
    warmup_steps: int = 200
    decay_rate: float = 0.5
    decay_steps: int = 2000
    min_lr: float = 1e-5  # floor of every schedule after the warm-up; where linear and cosine end
    # The step where linear and cosine reach min_lr (null: the run's last step by max_steps or
    # max_epochs; set it when trainer.max_minutes alone limits the run).
    schedule_steps: Optional[int] = None
    label_smoothing: float = 0.2  # ahead of 0.1 after every epoch of the proxy
    # Guided alignment (training/guided.py): the weight of the loss that trains the cross-attention
    # heads model.alignment_layer / model.alignment_heads name to follow data.alignments's links
    # (0: off). fairseq's --alignment-lambda is 0.05. 0.1 cost no BLEU over three seeds of the
    # default Transformer and made its supervised head an aligner (docs/history_of_defaults.md).
    guided_alignment: float = 0.1
    # R-Drop (training/rdrop.py): the weight of the symmetric KL between two dropout passes of each
    # batch, as fairseq's --rdrop-alpha (0: off); a step then costs about two
    rdrop_alpha: float = 0.0
    clip_grad_norm: Optional[float] = 1.0  # null: no clipping (the norm is still logged)
    eval_every: Optional[int] = None  # validate every N steps (null: at the end of every epoch)
    patience: Optional[int] = 5  # early stopping: evaluations without a better valid BLEU (null: off)
    beam_size: int = 5  # final test decoding (validation decodes greedily)
    # GNMT alpha of the final beam search; 1.2: the best at beam 5 on the validation set
    # (scripts/tune_decoding.py).
    length_penalty: float = 1.2
    # tokens per decoding batch (null: batch_tokens; on a GPU at least inference.decoding.GPU_BATCH_TOKENS)
    eval_batch_tokens: Optional[int] = None
    log_every: int = 50  # steps between log lines and train/* scalars
    attention_samples: int = 4  # validation sentences whose attention is drawn at every evaluation
    resume: Optional[str] = None  # null, auto (this run folder's last.pt) or a checkpoint path
    keep_last: Optional[int] = (
        None  # also keep the last N evaluations' checkpoints as checkpoints/step_<step>.pt
    )
    max_bad_steps: int = (
        5  # consecutive steps with a non-finite loss or gradient (each skipped) that stop the run
    )
    # Weight averages (training/averaging.py): an exponential moving average of the weights, updated
    # after every step, validated at every evaluation and saved as checkpoints/ema.pt (null: off);
    # and the mean of the last N evaluations' checkpoints (kept as with keep_last), saved as
    # checkpoints/average.pt. The test splits are decoded with whichever of best.pt, ema.pt and
    # average.pt scores the best validation BLEU. By default: the mean of the last 3 evaluations'
    # weights (one an epoch), the EMA off.
    ema_decay: Optional[float] = None
    average_last: Optional[int] = 3
    # bf16 autocast of the forward passes: auto (on CUDA, and on a CPU with native bf16: AVX-512 BF16,
    # AMX; float32 elsewhere), true (also where a CPU emulates bf16, much slower) or false (float32)
    amp: str = "auto"
    # TF32 matrix products for the float32 work on CUDA (Ampere and later: about 8x float32's
    # throughput, a 10-bit mantissa); false: full float32. The CPU ignores it.
    tf32: bool = True
    num_threads: Optional[int] = None  # CPU threads for torch (null: the cores this process may use)
    compile: bool = False  # torch.compile the model
    # torch.compile's mode with trainer.compile: default, reduce-overhead (CUDA graphs: on CUDA each
    # batch shape is recorded once, then replayed with one launch; data.pad_multiple bounds the
    # shapes), max-autotune (searched kernels and CUDA graphs) or max-autotune-no-cudagraphs
    compile_mode: str = "default"
    # On CUDA, let the fused attention take cuDNN's kernels (common.device.attention_kernels): fast
    # for shapes seen before, but a graph built for every new one; batches of varying lengths are.
    cudnn_attention: bool = False
    # Processes that collate training batches ahead of the step (data/loading.py; 0: collated in
    # this process, between steps). The batches are the same either way.
    loader_workers: int = 0


@dataclass
class Config:
    data: DataConfig = MISSING
    model: Any = MISSING  # RNNConfig or TransformerConfig (typed by conf/model/*.yaml)
    trainer: TrainerConfig = MISSING
    seed: int = 1
    device: str = "auto"  # auto (cuda when available), cpu, cuda, cuda:N


def cuda_graphs(tc: TrainerConfig, device_type: str) -> bool:
    """Whether the compiled training forward records CUDA graphs (``trainer.compile_mode``
    reduce-overhead or max-autotune, on CUDA): a replay reuses the memory of the one before, so each
    forward pass tells torch that the last one's outputs are spent (``training/step.py``)."""
    return tc.compile and tc.compile_mode in CUDA_GRAPH_MODES and device_type == "cuda"


def register_configs() -> None:
    """Put the schemas in Hydra's ConfigStore and the ``not_settings`` resolver in OmegaConf
    (idempotent; call before composing)."""
    # conf/config.yaml: sweep folders are named without the keys that are not settings
    OmegaConf.register_new_resolver("not_settings", lambda *extra: [*NOT_SETTINGS, *extra], replace=True)
    store = ConfigStore.instance()
    store.store(name="base_config", node=Config)
    store.store(group="model", name="rnn_schema", node=RNNConfig)
    store.store(group="model", name="transformer_schema", node=TransformerConfig)
    store.store(group="trainer", name="trainer_schema", node=TrainerConfig)


def checked_config(cfg: DictConfig) -> Tuple[DataConfig, Any, "TrainerConfig"]:
    """The ``data``, ``model`` and ``trainer`` nodes as their dataclasses, every value checked: the
    whole config is refused (one line naming the key) before any data is read or prepared."""
    data, model, trainer = data_config(cfg.data), model_config(cfg.model), trainer_config(cfg.trainer)
    guided = f"trainer.guided_alignment={trainer.guided_alignment}"
    if trainer.guided_alignment > 0 and data.alignments is None:
        raise ValueError(
            f"{guided} needs reference links: set data.alignments (a Pharaoh file of the training pairs, "
            "or fast_align) or trainer.guided_alignment=0"
        )
    if trainer.guided_alignment > 0 and data.sampling_alpha is not None:
        raise ValueError(
            f"{guided} follows links between the pieces of one segmentation; data.sampling_alpha draws a "
            "new one every epoch: set trainer.guided_alignment=0 or data.sampling_alpha=null"
        )
    return data, model, trainer


def model_config(node: DictConfig):
    """The ``model`` node as its dataclass (``RNNConfig`` or ``TransformerConfig``)."""
    obj = OmegaConf.to_object(node)
    if isinstance(obj, (RNNConfig, TransformerConfig)):  # typed by a conf/model/*.yaml schema
        check_keys(node, type(obj), "model")
        return obj
    return config_from_dict(obj)  # an untyped node (``+model=...``): the family its name gives


def trainer_config(node: DictConfig) -> TrainerConfig:
    """The ``trainer`` node as ``TrainerConfig``, with the range checks its types cannot express."""
    check_keys(node, TrainerConfig, "trainer")
    tc: TrainerConfig = OmegaConf.to_object(node)
    tc.amp = str(tc.amp).lower()  # trainer.amp=true comes as a boolean, kept as the text "True"
    check_trainer_config(tc)
    return tc


def check_trainer_config(tc: TrainerConfig) -> None:
    """Range checks the schema's types cannot express; one line naming the key."""
    at_least_one = {
        "batch_tokens": tc.batch_tokens,
        "accumulate": tc.accumulate,
        "log_every": tc.log_every,
        "beam_size": tc.beam_size,
        "eval_every": tc.eval_every,
        "patience": tc.patience,
        "keep_last": tc.keep_last,
        "max_bad_steps": tc.max_bad_steps,
        "max_epochs": tc.max_epochs,
        "max_steps": tc.max_steps,
        "num_threads": tc.num_threads,
        "schedule_steps": tc.schedule_steps,
        "decay_steps": tc.decay_steps,
        "eval_batch_tokens": tc.eval_batch_tokens,
    }
    for key, value in at_least_one.items():
        if value is not None and value < 1:
            raise ValueError(f"trainer.{key} must be at least 1, got {value}")
    positive = {"lr": tc.lr, "decay_rate": tc.decay_rate, "clip_grad_norm": tc.clip_grad_norm}
    for key, value in positive.items():
        if value is not None and not value > 0:
            raise ValueError(f"trainer.{key} must be positive, got {value}")
    for key in ("min_lr", "weight_decay", "warmup_steps", "length_penalty"):
        if getattr(tc, key) < 0:
            raise ValueError(f"trainer.{key} must be 0 or more, got {getattr(tc, key)}")
    if len(tc.betas) != 2 or not all(0.0 <= beta < 1.0 for beta in tc.betas):
        raise ValueError(f"trainer.betas must be two numbers in [0, 1), got {list(tc.betas)}")
    if tc.amp not in AMP:
        raise ValueError(f"trainer.amp must be one of {', '.join(AMP)}, got {tc.amp!r}")
    if tc.compile_mode not in COMPILE_MODES:
        raise ValueError(
            f"trainer.compile_mode must be one of {', '.join(COMPILE_MODES)}, got {tc.compile_mode!r}"
        )
    if tc.compile_mode != "default" and not tc.compile:
        raise ValueError(
            f"trainer.compile_mode={tc.compile_mode} is torch.compile's mode: set trainer.compile=true with it"
        )
    if tc.compile_mode in CUDA_GRAPH_MODES and tc.accumulate > 1:
        raise ValueError(
            f"trainer.compile_mode={tc.compile_mode} records CUDA graphs, whose gradients the next batch of a "
            "step would overwrite: set trainer.accumulate=1 or trainer.compile_mode=max-autotune-no-cudagraphs"
        )
    if tc.optimizer not in OPTIMIZERS:
        raise ValueError(f"trainer.optimizer must be {' or '.join(OPTIMIZERS)}, got {tc.optimizer!r}")
    if tc.schedule not in SCHEDULES:
        raise ValueError(f"trainer.schedule must be one of {', '.join(SCHEDULES)}, got {tc.schedule!r}")
    if tc.average_last is not None and tc.average_last < 2:
        raise ValueError(
            f"trainer.average_last must be at least 2 (checkpoints to average) or null, got {tc.average_last}"
        )
    if tc.schedule in FITTED and tc.schedule_steps is None and tc.max_steps is None and tc.max_epochs is None:
        raise ValueError(
            f"trainer.schedule={tc.schedule} decays over the run's steps, which trainer.max_minutes alone does not "
            "tell: set trainer.schedule_steps (steps/s in the log x seconds), trainer.max_steps or trainer.max_epochs"
        )
    if tc.ema_decay is not None and not 0.0 < tc.ema_decay < 1.0:
        raise ValueError(f"trainer.ema_decay must be in (0, 1) or null, got {tc.ema_decay}")
    if tc.max_minutes is not None and tc.max_minutes <= 0:
        raise ValueError(f"trainer.max_minutes must be positive, got {tc.max_minutes}")
    if tc.rdrop_alpha < 0:
        raise ValueError(f"trainer.rdrop_alpha must be at least 0 (0: off), got {tc.rdrop_alpha}")
    if tc.guided_alignment < 0:
        raise ValueError(f"trainer.guided_alignment must be at least 0 (0: off), got {tc.guided_alignment}")
    if not 0.0 <= tc.label_smoothing < 1.0:
        raise ValueError(f"trainer.label_smoothing must be in [0, 1), got {tc.label_smoothing}")
    for key in ("attention_samples", "loader_workers"):
        if getattr(tc, key) < 0:
            raise ValueError(f"trainer.{key} must be 0 or more, got {getattr(tc, key)}")
