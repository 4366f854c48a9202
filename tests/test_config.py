"""The Hydra config (conf/, training/config.py): every option composes and builds; typos fail early."""

import subprocess
import sys

import pytest
import torch
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError

from data.config import DataConfig, data_config
from data.specials import BOS_ID, PAD_ID
from models.build import build_model
from models.config import RNNConfig, TransformerConfig
from training.config import TrainerConfig, checked_config, model_config, trainer_config
from training.schedule import SCHEDULES

from helpers import ROOT, compose

CONF = ROOT / "conf"


def options(group: str):
    return sorted(p.stem for p in (CONF / group).glob("*.yaml") if not p.stem.endswith("_schema"))


def compose_config(*overrides: str):
    return compose(overrides)


def test_every_group_has_options():
    assert {"rnn", "transformer"} <= set(options("model"))
    assert {"rnn", "transformer"} <= set(options("trainer"))
    assert "multi30k" in options("data")


@pytest.mark.parametrize("name", options("model"))
def test_every_model_option_composes_builds_and_runs(name):
    cfg = compose_config(f"model={name}")
    model_cfg = model_config(cfg.model)
    assert isinstance(model_cfg, RNNConfig if model_cfg.name == "rnn" else TransformerConfig)
    torch.manual_seed(0)
    model = build_model(model_cfg, 100, 100).eval()
    src = torch.tensor([[5, 6, 7, 3], [8, 3, PAD_ID, PAD_ID]])
    tgt_in = torch.tensor([[BOS_ID, 9, 10], [BOS_ID, 11, PAD_ID]])
    with torch.no_grad():
        logits, _ = model(src, src != PAD_ID, tgt_in)
    assert logits.shape == (2, 3, 100)
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("name", options("trainer"))
def test_every_trainer_option_composes(name):
    trainer = OmegaConf.to_object(compose_config(f"trainer={name}").trainer)
    assert isinstance(trainer, TrainerConfig)
    assert trainer.schedule in SCHEDULES


@pytest.mark.parametrize("name", options("data"))
def test_every_data_option_composes(name):
    cfg = compose_config(f"data={name}", "data.root=/nowhere")
    assert cfg.data.name == name
    assert cfg.data.root == "/nowhere"
    if name != "files":  # data=files needs its paths (tested below)
        assert isinstance(data_config(cfg.data), DataConfig)


def test_files_data_takes_paths_from_overrides():
    pairs = [
        f"data.files.{split}.{side}=corpus/{split}.{side}"
        for split in ("train", "val")
        for side in ("src", "tgt")
    ]
    data = data_config(compose_config("data=files", *pairs).data)
    assert data.files["train"].src == "corpus/train.src"
    assert data.files["val"].tgt == "corpus/val.tgt"


def test_the_trainer_follows_the_model():
    assert compose_config().trainer.lr == 1.5e-3
    assert compose_config("model=rnn").trainer.lr == 8e-3
    assert compose_config("model=rnn_large").trainer.max_epochs == 30
    # An explicit trainer wins over the model's.
    assert compose_config("model=rnn", "trainer=transformer").trainer.lr == 1.5e-3


NOT_IN = "Key '{}' not in '{}'"
NOT_A = "Value '{}' of type 'str' could not be converted to {}"


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.d_modl=3", NOT_IN.format("d_modl", "TransformerConfig")),
        ("trainer.frobnicate=1", NOT_IN.format("frobnicate", "TrainerConfig")),
        ("data.bogus=1", NOT_IN.format("bogus", "DataConfig")),
        ("bogus=1", NOT_IN.format("bogus", "Config")),
        ("model=rnn model.d_model=3", NOT_IN.format("d_model", "RNNConfig")),
        ("trainer.lr=abc", NOT_A.format("abc", "Float")),
        ("trainer.batch_tokens=many", NOT_A.format("many", "Integer")),
        ("model.d_model=abc", NOT_A.format("abc", "Integer")),
        ("data.vocab_size=x", NOT_A.format("x", "Integer")),
        ("seed=x", NOT_A.format("x", "Integer")),
    ],
)
def test_unknown_keys_and_wrong_types_fail_when_composing_naming_the_key(override, message):
    """What ``train.py`` prints for these (Hydra's error and its cause) before any run starts."""
    with pytest.raises(ConfigCompositionException) as caught:
        compose_config(*override.split())
    text = f"{caught.value}\n{caught.value.__cause__}"
    assert message in text
    assert f"full_key: {override.split()[-1].split('=')[0]}" in text


@pytest.mark.parametrize(
    "override, read, message",
    [
        ("+trainer.frobnicate=1", "trainer", "trainer.frobnicate: the keys of trainer are accumulate, "),
        ("+data.srcc=de", "data", "data.srcc: the keys of data are alignments, cache_dir, "),
        ("+model.frobnicate=1", "model", "model.frobnicate: the keys of model are "),
        ("model=rnn +model.n_heads=4", "model", "model.n_heads: the keys of model are "),
    ],
)
def test_keys_forced_in_with_plus_are_refused_when_the_config_is_read(override, read, message):
    cfg = compose_config(*override.split())  # Hydra lets a key added with + through
    readers = {"trainer": trainer_config, "data": data_config, "model": model_config}
    with pytest.raises(ConfigKeyError) as caught:
        readers[read](cfg[read])
    assert str(caught.value).startswith(f"unknown config key {message}")


@pytest.mark.parametrize(
    "override, message",
    [
        ("trainer.keep_last=0", "trainer.keep_last must be at least 1, got 0"),
        ("trainer.batch_tokens=0", "trainer.batch_tokens must be at least 1, got 0"),
        ("trainer.max_steps=-3", "trainer.max_steps must be at least 1, got -3"),
        ("trainer.max_minutes=0", "trainer.max_minutes must be positive, got 0.0"),
        ("trainer.label_smoothing=1.0", "trainer.label_smoothing must be in [0, 1), got 1.0"),
        ("trainer.rdrop_alpha=-1", "trainer.rdrop_alpha must be at least 0 (0: off), got -1.0"),
        ("trainer.attention_samples=-1", "trainer.attention_samples must be 0 or more, got -1"),
        ("trainer.loader_workers=-1", "trainer.loader_workers must be 0 or more, got -1"),
        ("trainer.schedule_steps=0", "trainer.schedule_steps must be at least 1, got 0"),
        (
            "trainer.average_last=1",
            "trainer.average_last must be at least 2 (checkpoints to average) or null, got 1",
        ),
        ("trainer.ema_decay=1.0", "trainer.ema_decay must be in (0, 1) or null, got 1.0"),
        ("trainer.lr=-1", "trainer.lr must be positive, got -1.0"),
        ("trainer.clip_grad_norm=0", "trainer.clip_grad_norm must be positive, got 0.0"),
        ("trainer.warmup_steps=-5", "trainer.warmup_steps must be 0 or more, got -5"),
        ("trainer.betas=[0.9,1.0]", "trainer.betas must be two numbers in [0, 1), got [0.9, 1.0]"),
        ("trainer.optimizer=sgd", "trainer.optimizer must be adam or adamw, got 'sgd'"),
        (
            "trainer.compile_mode=fast",
            "trainer.compile_mode must be one of default, reduce-overhead, max-autotune, "
            "max-autotune-no-cudagraphs, got 'fast'",
        ),
        (
            "trainer.compile=true trainer.compile_mode=max-autotune trainer.accumulate=2",
            "trainer.compile_mode=max-autotune records CUDA graphs, whose gradients the next batch of a step would "
            "overwrite: set trainer.accumulate=1 or trainer.compile_mode=max-autotune-no-cudagraphs",
        ),
        (
            "trainer.compile_mode=reduce-overhead",
            "trainer.compile_mode=reduce-overhead is torch.compile's mode: set trainer.compile=true with it",
        ),
        (
            "trainer.schedule=step",
            "trainer.schedule must be one of inverse_sqrt, exponential, constant, linear, cosine, got 'step'",
        ),
    ],
)
def test_values_out_of_range_are_refused_naming_the_key(override, message):
    with pytest.raises(ValueError) as caught:
        trainer_config(compose_config(*override.split()).trainer)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.d_model=0", "model.d_model must be at least 1, got 0"),
        ("model=rnn model.attention_size=-2", "model.attention_size must be at least 1, got -2"),
        ("model.dropout=1.0", "model.dropout must be in [0, 1), got 1.0"),
        ("model.activation_dropout=-0.1", "model.activation_dropout must be in [0, 1), got -0.1"),
        (
            "model.n_heads=3",
            "model.d_model (256) must be divisible by model.n_heads (3): each head takes d_model / n_heads dimensions",
        ),
        ("model.norm=sideways", "model.norm must be pre or post, got 'sideways'"),
    ],
)
def test_model_values_out_of_range_are_refused_naming_the_key(override, message):
    with pytest.raises(ValueError) as caught:
        model_config(compose_config(*override.split()).model)
    assert str(caught.value) == message


def test_the_default_transformer_is_guided_by_fast_align_and_the_others_are_not():
    """Guided alignment is the small Transformer's default (0.1 on fast_align's links); the RNN, the
    tiny and the base Transformer and the attention experiments train unguided."""
    data, _, trainer = checked_config(compose_config())
    assert (data.alignments, trainer.guided_alignment) == ("fast_align", 0.1)
    for overrides in (["model=rnn"], ["model=tiny_transformer"], ["model=transformer_base"]):
        assert checked_config(compose_config(*overrides))[2].guided_alignment == 0.0, overrides
    for experiment in ("attention_grid", "attention_lr"):
        assert compose_config(f"+experiment={experiment}").trainer.guided_alignment == 0.0


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "data.alignments=null",
            "trainer.guided_alignment=0.1 needs reference links: set data.alignments (a Pharaoh file of the "
            "training pairs, or fast_align) or trainer.guided_alignment=0",
        ),
        (
            "data.sampling_alpha=0.2",
            "trainer.guided_alignment=0.1 follows links between the pieces of one segmentation; "
            "data.sampling_alpha draws a new one every epoch: set trainer.guided_alignment=0 or "
            "data.sampling_alpha=null",
        ),
    ],
)
def test_guidance_without_links_or_with_sampling_is_refused_and_unguided_runs_take_either(override, message):
    with pytest.raises(ValueError) as caught:
        checked_config(compose_config(override))
    assert str(caught.value) == message
    for unguided in (["trainer.guided_alignment=0"], ["model=rnn"]):
        checked_config(compose_config(override, *unguided))  # data.alignments is read only when guided


@pytest.mark.parametrize(
    "override", ["model.norm=sideways", "model.positions=rotary", "model=rnn model.cell=rnn"]
)
def test_unknown_choices_fail_when_building(override):
    cfg = compose_config(*override.split())
    with pytest.raises(ValueError, match=override.split(".")[-1].split("=")[0]):
        build_model(model_config(cfg.model), 100, 100)


def test_spec_keys_and_defaults():
    """The keys SPEC.md promises, with their documented defaults."""
    cfg = compose_config()
    assert cfg.model.name == "transformer"
    assert cfg.data.name == "multi30k"
    assert cfg.data.root is None
    assert (cfg.data.src, cfg.data.tgt) == ("de", "en")
    assert cfg.data.train_limit is None
    assert cfg.data.vocab_size == 8000
    trainer = cfg.trainer
    assert trainer.max_epochs is None or trainer.max_epochs > 0
    assert "max_steps" in trainer and (trainer.max_steps is None or trainer.max_steps > 0)
    assert trainer.max_epochs is not None or trainer.max_steps is not None
    assert trainer.batch_tokens > 0
    assert trainer.eval_every is None
    assert "patience" in trainer and (trainer.patience is None or trainer.patience > 0)
    assert trainer.beam_size == 5
    assert trainer.resume is None
    # the suite composes with device=cpu (helpers.compose): the default is the root config's
    assert OmegaConf.load(ROOT / "conf" / "config.yaml").device == "auto"
    assert cfg.seed == 1


def test_overrides_reach_the_config():
    cfg = compose_config(
        "model=rnn", "model.cell=lstm", "trainer.max_steps=7", "data.train_limit=100", "seed=3"
    )
    assert model_config(cfg.model) == RNNConfig(cell="lstm")
    assert (cfg.trainer.max_steps, cfg.data.train_limit, cfg.seed) == (7, 100, 3)


def test_model_config_of_a_plain_node_checks_the_name():
    assert model_config(OmegaConf.create({"name": "rnn", "hidden_size": 8})) == RNNConfig(hidden_size=8)
    with pytest.raises(ValueError, match="model.name"):
        model_config(OmegaConf.create({"name": "lstm"}))


@pytest.mark.parametrize(
    "experiment,src,tgt",
    [
        ("compare_multi30k", "de", "en"),
        ("compare_multi30k_en_de", "en", "de"),
        ("compare_multi30k_fr_en", "fr", "en"),
    ],
)
def test_comparison_experiments_sweep_both_families_on_one_direction(experiment, src, tgt):
    cfg = compose([f"+experiment={experiment}"], hydra_config=True)
    assert (cfg.data.name, cfg.data.src, cfg.data.tgt, cfg.seed) == ("multi30k", src, tgt, 1)
    assert cfg.hydra.sweeper.params == {"model": "rnn,transformer"}
    assert cfg.hydra.sweep.dir.startswith(f"multirun/{experiment}/")
    assert experiment in options("experiment")


def test_the_gpu_recipe_is_transformer_base_in_gpu_sized_batches_and_refuses_a_machine_without_cuda(
    multi30k_slice, tmp_path
):
    cfg = compose(["+experiment=gpu_multi30k"])  # compose() trains on the CPU unless told otherwise
    assert (cfg.model.d_model, cfg.model.encoder_layers, cfg.model.dropout) == (512, 6, 0.3)
    assert (cfg.trainer.batch_tokens, cfg.trainer.max_epochs, cfg.trainer.warmup_steps) == (16384, 40, 400)
    assert (cfg.data.src, cfg.data.tgt) == ("de", "en")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the recipe would train")
    run = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "train.py",
            "+experiment=gpu_multi30k",
            f"data.root={multi30k_slice}",
            f"hydra.run.dir={run}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert (
        done.stderr.strip()
        == "error: device cuda asked for, but no CUDA device is available: use auto or cpu"
    )
    assert [p.name for p in run.iterdir()] == ["train.log"]  # Hydra's log; no checkpoint, no results


def test_the_slurm_launcher_config_composes():
    """conf/hydra/launcher/slurm.yaml on top of hydra-submitit-launcher's submitit_slurm (optional)."""
    pytest.importorskip(
        "hydra_plugins.hydra_submitit_launcher", reason="hydra-submitit-launcher is not installed (optional)"
    )
    cfg = compose(["hydra/launcher=slurm", "model=rnn"], hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert (launcher.gpus_per_node, launcher.tasks_per_node, launcher.timeout_min) == (1, 1, 240)
