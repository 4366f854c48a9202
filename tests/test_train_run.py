"""End to end: a few steps of ``train(cfg)`` on a real Multi30k slice, composed like ``train.py``."""

import json
import logging
import math
import re
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from common.device import native_bf16
from training.run import train

from helpers import ROOT, SPLIT, TINY_RNN, TINY_TRANSFORMER


def run_overrides(slice_dir: Path, cache: Path, *extra: str):
    return [
        f"data.root={slice_dir}",
        f"data.cache_dir={cache}",
        "data.vocab_size=500",
        "trainer.max_steps=4",
        "trainer.eval_every=2",
        "trainer.batch_tokens=1500",
        "trainer.log_every=1",
        "trainer.warmup_steps=2",
        "trainer.beam_size=3",
        "trainer.attention_samples=2",
        *extra,
    ]


@pytest.fixture(scope="module")
def transformer_run(multi30k_slice, compose_config, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    cfg = compose_config(run_overrides(multi30k_slice, out.parent / "cache", *TINY_TRANSFORMER))
    return out, train(cfg, out)


def scalar_and_image_tags(tb_dir: Path):
    events = EventAccumulator(str(tb_dir), size_guidance={"images": 0, "scalars": 0, "tensors": 0})
    events.Reload()
    return events.Tags()


def test_run_folder_holds_checkpoints_results_and_hypotheses(transformer_run, multi30k_slice):
    out, results = transformer_run
    best, last = out / "checkpoints" / "best.pt", out / "checkpoints" / "last.pt"
    assert best.is_file() and last.is_file()
    saved = json.loads((out / "results.json").read_text())
    assert saved == json.loads(json.dumps(results))
    # best.pt: the checkpoint of the first evaluation with the best BLEU, written once (a hard link of
    # last.pt as it was then; still last.pt's file when the last evaluation was the best)
    bleus = [h["bleu"] for h in saved["valid_history"]]
    best_step = saved["valid_history"][bleus.index(max(bleus))]["step"]
    assert torch.load(best, weights_only=True)["progress"]["step"] == best_step
    assert best.samefile(last) == (best_step == saved["valid_history"][-1]["step"])
    for key in (
        "model",
        "params",
        "steps",
        "epochs",
        "train_seconds",
        "train_tokens_per_second",
        "valid",
        "test",
        "sacrebleu",
    ):
        assert key in saved, key
    assert saved["model"] == "transformer" and saved["steps"] == 4 and saved["params"] > 0
    assert set(saved["valid"]) >= {"loss", "bleu", "chrf"}
    assert list(saved["test"]) == ["test_2016_flickr"]
    assert set(saved["test"]["test_2016_flickr"]) == {"bleu", "chrf"}
    assert "nrefs:1" in saved["sacrebleu"]["bleu"] and "nc:6" in saved["sacrebleu"]["chrf"]
    hyps = (out / "test_2016_flickr.hyp").read_text(encoding="utf-8").split("\n")
    assert len(hyps) == 30 + 1 and hyps[-1] == ""  # one line per test sentence


def test_checkpoint_is_plain_data_with_model_config_and_tokenizer(transformer_run):
    out, _ = transformer_run
    payload = torch.load(out / "checkpoints" / "best.pt", weights_only=True)
    assert payload["model_config"]["name"] == "transformer" and payload["model_config"]["d_model"] == 64
    assert isinstance(payload["tokenizer"]["src_model"], bytes)
    from data.tokenizer import Tokenizer
    from models.build import build_model
    from models.config import TransformerConfig

    tok = Tokenizer.from_state_dict(payload["tokenizer"])
    model = build_model(TransformerConfig(**payload["model_config"]), tok.src_vocab_size, tok.tgt_vocab_size)
    model.load_state_dict(payload["model"])  # strict: every weight is there
    assert payload["progress"]["step"] in (2, 4)


def test_tensorboard_events_hold_every_scalar_image_and_text_tag(transformer_run):
    out, _ = transformer_run
    tags = scalar_and_image_tags(out / "tb")
    scalars = set(tags["scalars"])
    for tag in (
        "train/loss",
        "train/lr",
        "train/tokens_per_second",
        "train/grad_norm",
        "valid/loss",
        "valid/ppl",
        "valid/bleu",
        "valid/chrf",
    ):
        assert tag in scalars, tag
    images = set(tags["images"])
    for sent in ("sent0", "sent1"):
        for suffix in (
            "cross_layer1_mean",
            "cross_layer2_mean",
            "cross_layer2_head1",
            "cross_layer2_head4",
            "encoder_self_layer2_mean",
        ):
            assert f"attention/{sent}/{suffix}" in images, (sent, suffix)
    assert all(tag.startswith("attention/") for tag in images)
    texts = {tag for tag in tags["tensors"] if tag.startswith("samples/")}
    assert texts == {"samples/sent0/text_summary", "samples/sent1/text_summary"}
    hparams = EventAccumulator(str(out / "tb"), size_guidance={"tensors": 0})
    hparams.Reload()
    plugin_data = hparams.summary_metadata if hasattr(hparams, "summary_metadata") else {}
    assert "_hparams_/session_start_info" in hparams.Tags()["tensors"] or any(
        "hparams" in t for t in plugin_data
    )


def test_rnn_run_draws_its_additive_attention(multi30k_slice, compose_config, tmp_path):
    overrides = run_overrides(
        multi30k_slice,
        tmp_path / "cache",
        *TINY_RNN,
        "trainer.max_steps=2",
    )
    results = train(compose_config(overrides), tmp_path / "run")
    assert results["model"] == "rnn" and results["steps"] == 2
    images = set(scalar_and_image_tags(tmp_path / "run" / "tb")["images"])
    assert images == {"attention/sent0/cross_layer1", "attention/sent1/cross_layer1"}


def test_amp_true_trains_validates_and_decodes_a_cpu_run_in_bf16(
    multi30k_slice, compose_config, tmp_path, caplog
):
    """``trainer.amp=true`` on a CPU: bf16 autocast (emulated where the CPU has no native bf16, so
    two steps of the tiny Transformer); the checkpoint and ``results.json`` say so, and
    ``translate.py --dtype auto`` decodes it as ``common.device.decode_precision`` says."""
    overrides = run_overrides(multi30k_slice, tmp_path / "cache", *TINY_TRANSFORMER, "trainer.amp=true")
    overrides += ["trainer.max_steps=2", "trainer.attention_samples=0", "trainer.beam_size=1"]
    with caplog.at_level(logging.INFO, logger="training.trainer"):
        results = train(compose_config(overrides), tmp_path / "run")
    assert "precision: trainer.amp=true: bf16 autocast" in caplog.text
    assert results["decode_dtype"] == "bfloat16" and math.isfinite(results["valid"]["loss"])
    payload = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)
    assert payload["precision"] == "bfloat16"
    assert all(t.dtype == torch.float32 for t in payload["model"].values())  # autocast: float32 weights


def test_the_debug_experiment_writes_every_output_of_a_run(multi30k_slice, tmp_path):
    """``python train.py +experiment=debug data.root=DIR`` as docs/training.md gives it, on the slice:
    the tiny Transformer evaluated twice, every file a real run writes."""
    run = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            "+experiment=debug",
            f"data.root={multi30k_slice}",
            f"data.cache_dir={tmp_path / 'cache'}",
            f"hydra.run.dir={run}",
            "device=cpu",  # the CPU path, also on a machine with a GPU
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert {".hydra", "checkpoints", "tb", "results.json", "train.log", f"{SPLIT}.hyp", f"{SPLIT}.ref"} <= {
        p.name for p in run.iterdir()
    }
    checkpoints = {p.name for p in (run / "checkpoints").iterdir()}
    assert checkpoints == {"best.pt", "last.pt", "average.pt", "step_0000020.pt", "step_0000040.pt"}
    results = json.loads((run / "results.json").read_text())
    assert results["model"] == "transformer" and results["steps"] == 40
    assert [h["step"] for h in results["valid_history"]] == [20, 40]
    assert set(results["test_weights"]["valid_bleu"]) == {"best.pt", "average.pt"}
    assert list(results["test"]) == [SPLIT]
    assert len((run / f"{SPLIT}.hyp").read_text(encoding="utf-8").splitlines()) == 30
    # each evaluation's line says where its time went (a GPU run's evaluations outlast its steps)
    evaluations = [line for line in (run / "train.log").read_text().splitlines() if "valid step" in line]
    assert len(evaluations) == 2
    assert all(
        re.search(r"\(\d+ s: scoring [\d.]+, attention [\d.]+, checkpoints [\d.]+\)$", line)
        for line in evaluations
    )
    tags = scalar_and_image_tags(run / "tb")
    assert {"train/loss", "valid/bleu", "valid/chrf", "entropy/cross/layer1/head1"} <= set(tags["scalars"])
    assert "collapsed" not in (run / "train.log").read_text()  # a healthy run says nothing of it
    # trainer.amp=auto: bf16 where this CPU has native bf16, float32 elsewhere, said once
    (precision,) = [line for line in (run / "train.log").read_text().splitlines() if "precision: " in line]
    assert ("bf16 autocast" in precision) == bool(native_bf16()) and "trainer.amp=auto" in precision
    assert tags["images"] and all(tag.startswith("attention/sent0/") for tag in tags["images"])
    assert {tag for tag in tags["tensors"] if tag.startswith("samples/")} == {"samples/sent0/text_summary"}


def test_the_debug_experiment_takes_the_tiny_rnn_and_keeps_its_own_settings(compose_config):
    """``model=tiny_rnn`` replaces the experiment's model; the RNN's recipe (no average) does not
    replace the experiment's trainer settings; runs go to a folder of their own."""
    transformer = compose_config(["+experiment=debug"], hydra_config=True)
    rnn = compose_config(["+experiment=debug", "model=tiny_rnn"], hydra_config=True)
    assert transformer.hydra.runtime.choices.model == "tiny_transformer"
    assert rnn.hydra.runtime.choices.model == rnn.hydra.runtime.choices.trainer == "tiny_rnn"
    assert rnn.trainer.lr == compose_config(["model=rnn"]).trainer.lr  # the RNN's recipe
    for cfg in (transformer, rnn):
        assert (cfg.trainer.max_steps, cfg.trainer.eval_every, cfg.trainer.average_last) == (40, 20, 2)
        assert cfg.hydra.run.dir.startswith("outputs/debug/")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(url: str, timeout: float = 10.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def test_tensorboard_server_serves_the_attention_images(transformer_run):
    out, _ = transformer_run
    port = free_port()
    exe = Path(sys.executable).parent / "tensorboard"
    server = subprocess.Popen(
        [str(exe), "--logdir", str(out / "tb"), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}/data/plugin/images"
    try:
        deadline, tags = time.time() + 90, {}
        while time.time() < deadline:
            try:
                tags = json.loads(get(f"{base}/tags"))
                if any(tags.values()):
                    break
            except OSError:
                pass
            time.sleep(1.0)
        assert tags, "tensorboard did not answer within 90 s"
        run, run_tags = next((r, t) for r, t in tags.items() if t)
        tag = "attention/sent0/cross_layer1_mean"
        assert tag in run_tags
        query = urllib.parse.urlencode({"run": run, "tag": tag, "sample": 0})
        items = json.loads(get(f"{base}/images?{query}"))
        assert len(items) >= 2  # one image per evaluation
        assert "blob_key=" in items[-1]["query"]  # the item's ready-made query for its PNG
        blob = get(f"{base}/individualImage?{items[-1]['query']}")
        assert blob[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_tb_images_exports_the_png_tensorboard_shows(transformer_run, tmp_path):
    out, _ = transformer_run
    script = [
        sys.executable,
        str(Path(__file__).resolve().parent.parent / "scripts" / "tb_images.py"),
        str(out / "tb"),
    ]
    listing = subprocess.run(script + ["--list"], capture_output=True, text=True, timeout=120)
    assert listing.returncode == 0 and "attention/sent0/cross_layer1_mean 2 4" in listing.stdout
    tag = "attention/sent0/cross_layer1_mean"
    events = EventAccumulator(str(out / "tb"), size_guidance={"images": 0})
    events.Reload()
    for step, extra in ((4, []), (2, ["--step", "2"])):
        png = tmp_path / f"{step}.png"
        done = subprocess.run(
            script + ["--tag", tag, "--out", str(png), *extra], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        expected = next(image for image in events.Images(tag) if image.step == step).encoded_image_string
        assert png.read_bytes() == expected and expected[:8] == b"\x89PNG\r\n\x1a\n"
    missing = subprocess.run(
        script + ["--tag", "attention/nope", "--out", str(tmp_path / "x.png")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode == 1 and missing.stderr.startswith("error: no image tag 'attention/nope'")
    assert not (tmp_path / "x.png").exists()
