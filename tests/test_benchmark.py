"""scripts/benchmark.py runs end to end on a small slice (a check that it works, not a timing)."""

import json
import subprocess
import sys

import pytest

from common.device import native_bf16
from training.efficiency import CPU_KINDS

from helpers import ROOT, load_script

pytestmark = pytest.mark.slow  # a real benchmark run (and a trained model)


def benchmark(*args) -> subprocess.CompletedProcess:
    """``scripts/benchmark.py ARGS`` in a process of its own (each argument as a string)."""
    command = [sys.executable, str(ROOT / "scripts" / "benchmark.py"), *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def test_train_benchmark_measures_throughput_memory_and_decoding(
    multi30k_slice, trained_synthetic_models, tmp_path
):
    checkpoint = trained_synthetic_models["rnn"].checkpoint  # any RNN checkpoint: its decoding is timed
    out = tmp_path / "bench"
    done = benchmark(
        "train", "--data", multi30k_slice, "--models", "tiny_transformer", "--warmup", 1, "--steps", 2,
        "--batch-tokens", 1000, "--checkpoint", f"rnn={checkpoint}", "--beams", 1, "--out", out,
        "--", f"data.cache_dir={tmp_path / 'cache'}", "data.vocab_size=500",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(out.with_suffix(".json").read_text())
    (row,) = result["rows"]
    assert row["model"] == "tiny_transformer" and row["batch_tokens"] == 1000
    assert row["steps"] == 2 and row["params"] > 0
    assert 0 < row["tgt_tokens_per_batch"] <= 1000 and row["peak_memory_mib"] > 50
    rate = row["tgt_tokens_per_batch"] / row["seconds_per_step"]
    assert abs(rate - row["tgt_tokens_per_s"]) / rate < 0.01
    assert abs(row["epoch_minutes"] - row["epoch_tgt_tokens"] / row["tgt_tokens_per_s"] / 60) < 0.01
    # the FLOPs of a step are counted; a CPU has no known peak, so no MFU, and no CUDA profile
    # trainer.amp=auto: bf16 on a CPU that has it
    assert row["precision"] == ("bfloat16" if native_bf16() else "float32") and row["compile"] is False
    flops = row["gflops_per_tgt_token"] * 1e9 * row["tgt_tokens_per_s"]
    assert row["gflops_per_tgt_token"] > 0 and abs(flops / 1e12 - row["tflops_per_s"]) < 1e-3
    assert row["mfu"] is None and row["peak_tflops"] is None
    # the CPU profile: every kind's share of the wall time, the operators, the matrix products' own rate
    assert list(row["profile"]) == list(CPU_KINDS) and 0.9 < sum(row["profile"].values()) <= 1.01
    assert min(row["profile"][kind] for kind in ("matrix products", "attention", "optimizer")) > 0
    assert row["ops_per_step"] > 50 and row["matmul_gflops"] > 0 and 0 < row["of_matmul_rate"]
    (decoding,) = result["translate"]["rows"]
    assert decoding["beam"] == 1 and decoding["sentences"] == 30 and decoding["startup_s"] > 0
    # 30 sentences of a tiny model can decode within start-up noise; a rate, when given, is positive
    assert decoding["sentences_per_s"] is None or decoding["sentences_per_s"] > 0
    markdown = out.with_suffix(".md").read_text()
    assert "| tiny_transformer | " in markdown and "sentences/s" in markdown and "| n/a |" in markdown
    assert "Where a step's time goes (CPU operators" in markdown


def translate_table_of(rows):
    """The translate benchmark's report of ``rows`` (timings as given, the other columns made up)."""
    for row in rows:
        row.update(tokens_per_s=300.0, peak_memory_mib=200, bleu=5.0)
    result = dict(
        split="test_2016_flickr", batch_size=64, device="cpu", threads=1, machine="x", date="d", rows=rows
    )
    return load_script("benchmark").translate_table(result)


def test_a_decoding_time_below_start_up_noise_is_said_not_divided():
    """On a slow machine a short decode can time below its start-up's noise (decode s <= 0): the
    speed line says so instead of leaving the model out."""
    rows = [
        dict(model="ours", engine="torch", beam=5, startup_s=2.0, decode_s=1.5, sentences_per_s=20.0),
        dict(
            model="int8",
            engine="ctranslate2 int8",
            beam=5,
            startup_s=2.1,
            decode_s=-0.2,
            sentences_per_s=None,
        ),
    ]
    table = translate_table_of(rows)
    assert "| int8 | ctranslate2 int8 | 5 | 2.10 | -0.20 | (below start-up noise) | - |" in table
    assert "beam 5, speed against ours: int8: below start-up noise" in table


def test_a_reference_decoding_below_start_up_noise_gives_no_ratio_but_its_line():
    """Where the first model's own decoding times below its start-up's noise, no ratio can be given
    against it: the speed line says so rather than being left out."""
    rows = [
        dict(model="ours", engine="torch", beam=5, startup_s=4.0, decode_s=-0.13, sentences_per_s=None),
        dict(
            model="int8",
            engine="ctranslate2 int8",
            beam=5,
            startup_s=2.5,
            decode_s=0.17,
            sentences_per_s=179.9,
        ),
    ]
    table = translate_table_of(rows)
    assert "beam 5, speed against ours: ours below start-up noise, no ratio" in table


def test_epochs_benchmark_times_each_epoch_then_validation_and_test_decoding(multi30k_slice, tmp_path):
    out = tmp_path / "epochs"
    done = benchmark(
        "epochs", "--data", multi30k_slice, "--model", "tiny_transformer", "--epochs", 2, "--beams", 1, 3,
        "--out", out, "--", f"data.cache_dir={tmp_path / 'cache'}", "data.vocab_size=500",
        "trainer.batch_tokens=1000",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(out.with_suffix(".json").read_text())
    assert [e["epoch"] for e in result["epochs"]] == [1, 2]
    assert all(e["tgt_tokens_per_s"] > 0 and e["seconds"] > 0 for e in result["epochs"])
    first, last = (e["tgt_tokens_per_s"] for e in result["epochs"])
    assert result["first_to_last"] == pytest.approx(first / last, abs=1e-3)
    assert result["eval_batch_tokens"] == 1000  # the CPU decodes in the training's batches
    assert len(result["validation_seconds"]) == 2 and min(result["validation_seconds"]) > 0
    cases = [(d["split"], d["beam"]) for d in result["decoding"]]
    assert cases == [("test_2016_flickr", 1), ("test_2016_flickr", 3)]
    assert all(d["sentences"] == 30 and d["sentences_per_s"] > 0 for d in result["decoding"])
    markdown = out.with_suffix(".md").read_text()
    assert (
        "| 2 | " in markdown and "Greedy validation of" in markdown and "| test_2016_flickr | 3 |" in markdown
    )
