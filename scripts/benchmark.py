"""Speed benchmarks of the toolkit; JSON and Markdown out.

``train``: for each model family at its default size (``conf/model``, ``conf/trainer``), training
throughput on Multi30k: real (non-padding) target tokens per second over ``--steps`` optimizer
steps after ``--warmup`` steps, seconds per step, the real target tokens in a batch, peak memory
(CPU: the process's peak resident set; CUDA: peak allocated tensors) and the time of one
training epoch at that rate (evaluation excluded). Each family runs in a process of its own, so
that its peak memory is its own. With ``--checkpoint NAME=PATH`` it also times decoding as
``translate`` does::

    python scripts/benchmark.py train --data ../multi30k --checkpoint rnn=RUN/checkpoints/best.pt ...

``translate``: sentences/s and output tokens/s of ``translate.py`` (run as users run it, one
process per case) on a test split, per checkpoint and beam size. Start-up (imports and loading
the checkpoint) is timed separately, as a run on an empty input, and left out of the rates::

    python scripts/benchmark.py translate --checkpoint rnn=outputs/rnn/checkpoints/best.pt \\
        --checkpoint transformer=outputs/tf/checkpoints/best.pt --data ../multi30k --beams 1 5

``epochs``: the first epochs of one model from scratch, each epoch's target tokens per second (the
first pays for whatever a device does the first time: allocations, kernels loaded, new shapes),
then greedy validation (twice: cold and warm) and the test splits decoded at each beam size, as a
run's evaluations and its end do::

    python scripts/benchmark.py epochs --data ../multi30k --model transformer --epochs 3 --device cuda

A ``PATH`` that is a folder of ``scripts/export_ctranslate2.py`` runs ``translate.py --engine
ctranslate2`` (the deployment comparison of docs/deployment.md)::

    python scripts/benchmark.py translate --data ../multi30k --threads 2 --checkpoint ours=RUN/checkpoints/best.pt \\
        --checkpoint ct2-float32=exports/f32 --checkpoint ct2-int8=exports/int8

Each decoding case runs ``--repeats`` times; the table shows the fastest run (the least disturbed
by other work on the machine), the peak resident memory of its process, and BLEU of its output,
a check that the outputs are real translations; then each model's speed against the first.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent


FLOP_BATCHES = 8  # batches whose FLOPs are counted (per target token)
PROFILED_STEPS = 5  # steps of the profile's split on CUDA
CPU_PROFILED_STEPS = 2  # on a CPU: its steps are long, and its profile records every operator


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    decoding = argparse.ArgumentParser(add_help=False)
    decoding.add_argument(
        "--data",
        default=os.environ.get("MULTI30K_DIR"),
        help="folder with {split}.{lang}[.gz] (default: $MULTI30K_DIR)",
    )
    decoding.add_argument("--split", default="test_2016_flickr")
    decoding.add_argument("--beams", type=int, nargs="+", default=[1, 5])
    decoding.add_argument("--batch-size", type=int, default=64)
    decoding.add_argument("--device", default="cpu")
    decoding.add_argument("--repeats", type=int, default=1)
    decoding.add_argument("--threads", type=int, default=0, help="translate.py --threads (0: its default)")
    tr = commands.add_parser("translate", parents=[decoding], help="decoding speed of translate.py")
    tr.add_argument(
        "--checkpoint",
        action="append",
        required=True,
        metavar="NAME=PATH",
        help="a checkpoint to time (repeatable)",
    )
    tr.add_argument("--out", default="benchmark_translate", help="writes OUT.json and OUT.md")
    tn = commands.add_parser(
        "train", parents=[decoding], help="training throughput, peak memory, epoch time (+ decoding)"
    )
    tn.add_argument(
        "--models",
        nargs="+",
        default=["rnn", "transformer"],
        help="model configs (conf/model), each with overrides of its own after commas "
        "(transformer,model.attention=additive)",
    )
    tn.add_argument("--warmup", type=int, default=20, help="steps before the clock starts")
    tn.add_argument("--steps", type=int, default=100, help="steps timed")
    tn.add_argument(
        "--batch-tokens", type=int, help="trainer.batch_tokens for every model (default: each one's own)"
    )
    tn.add_argument(
        "--checkpoint",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="also time decoding (repeatable)",
    )
    tn.add_argument("--out", default="benchmark_train", help="writes OUT.json and OUT.md")
    tn.add_argument(
        "overrides", nargs="*", help="more Hydra overrides for every model (e.g. trainer.num_threads=1)"
    )
    ep = commands.add_parser(
        "epochs", help="the first epochs' training rates, then the speed of validation and test decoding"
    )
    ep.add_argument("--data", default=os.environ.get("MULTI30K_DIR"), help="a Multi30k folder")
    ep.add_argument("--model", default="transformer", help="a model config (conf/model)")
    ep.add_argument("--epochs", type=int, default=3, help="epochs trained, each timed")
    ep.add_argument("--beams", type=int, nargs="+", default=[1, 5], help="beam sizes of the test decoding")
    ep.add_argument("--device", default="cpu")
    ep.add_argument("--out", default="benchmark_epochs", help="writes OUT.json and OUT.md")
    ep.add_argument("overrides", nargs="*", help="more Hydra overrides")
    one = commands.add_parser("train-one", help="internal: one model of `train`, in a process of its own")
    one.add_argument("--model", required=True)
    one.add_argument("--data", required=True)
    one.add_argument("--warmup", type=int, required=True)
    one.add_argument("--steps", type=int, required=True)
    one.add_argument("--device", default="cpu")
    one.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    if args.command in ("train", "translate", "epochs") and not args.data:
        parser.error("give --data DIR (a Multi30k folder) or set MULTI30K_DIR")
    if args.command in ("train", "train-one") and min(args.warmup, args.steps) < 1:
        parser.error("--warmup and --steps must be at least 1")
    if args.command == "epochs" and args.epochs < 1:
        parser.error("--epochs must be at least 1")
    return args


def read_split(folder: Path, split: str, lang: str) -> List[str]:
    from data.corpus import read_lines, split_files

    path = split_files(folder).get(split, {}).get(lang)
    if path is None:
        raise SystemExit(f"error: no {split}.{lang}[.gz] in {folder}")
    return read_lines(path)


def timed_run(command: List[str]) -> Tuple[float, float]:
    """Wall seconds and peak resident memory (MiB) of ``command``, a process of its own."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(process.pid, 0)  # this child's own rusage
        seconds = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)
        if process.returncode != 0:
            err.seek(0)
            raise SystemExit(
                f"error: {' '.join(command)} failed: {err.read().decode(errors='replace').strip()}"
            )
    return seconds, usage.ru_maxrss / 1024  # Linux: KiB


def model_under_test(path: Path) -> Tuple[str, Any, Dict[str, Any], Optional[int]]:
    """(engine, tokenizer, languages ``{"src", "tgt"}``, parameters) of a checkpoint or an export folder."""
    from inference.translator import load_model
    from models.build import count_parameters

    if path.is_dir():
        from inference.ctranslate2_engine import export_tokenizer
        from inference.ctranslate2_export import read_export

        info = read_export(path)
        return (
            "ctranslate2 " + info["quantization"],
            export_tokenizer(path, info),
            info.get("languages") or {},
            None,
        )
    model, tokenizer, payload = load_model(path)
    return "torch", tokenizer, (payload.get("config") or {}).get("data") or {}, count_parameters(model)


def bench_translate(args: argparse.Namespace) -> Dict[str, Any]:
    import sacrebleu

    from common.checkpoint import CheckpointError
    from inference.ctranslate2_export import ExportError

    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for spec in args.checkpoint:
            name, _, path = spec.partition("=")
            try:
                engine, tokenizer, data, params = model_under_test(Path(path))
            except (CheckpointError, ExportError) as error:
                raise SystemExit(f"error: {error}") from None
            if not data.get("src") or not data.get("tgt"):
                raise SystemExit(
                    f"error: {path} names no languages (data.src, data.tgt): not a run of train.py"
                )
            sources = read_split(Path(args.data), args.split, data["src"])
            references = read_split(Path(args.data), args.split, data["tgt"])
            src_file, empty = Path(scratch) / "src.txt", Path(scratch) / "empty.txt"
            src_file.write_text("".join(line + "\n" for line in sources), encoding="utf-8")
            empty.write_text("")
            for beam in args.beams:
                base = [sys.executable, "translate.py", "--checkpoint", str(Path(path).resolve())]
                base += [
                    "--engine",
                    engine.split()[0],
                    "--beam",
                    str(beam),
                    "--batch-size",
                    str(args.batch_size),
                ]
                base += ["--device", args.device, "--threads", str(args.threads)]
                out_file = Path(scratch) / "out.txt"
                runs = []
                for _ in range(args.repeats):
                    startup, _ = timed_run(base + ["--input", str(empty), "--output", str(out_file)])
                    total, peak = timed_run(base + ["--input", str(src_file), "--output", str(out_file)])
                    runs.append((total - startup, startup, total, peak))
                decode, startup, total, peak = min(runs)
                hyps = out_file.read_text(encoding="utf-8").splitlines()
                tokens = sum(
                    len(ids) + 1 for ids in tokenizer.encode_tgt(hyps)
                )  # subword tokens, EOS included
                timed = decode > 0  # a small input can decode faster than start-up varies: no rate then
                rows.append(
                    {
                        "model": name,
                        "engine": engine,
                        "params": params,
                        "beam": beam,
                        "sentences": len(sources),
                        "startup_s": round(startup, 2),
                        "decode_s": round(decode, 2),
                        "total_s": round(total, 2),
                        "sentences_per_s": round(len(sources) / decode, 1) if timed else None,
                        "tokens_per_s": round(tokens / decode, 1) if timed else None,
                        "peak_memory_mib": round(peak, 1),
                        "bleu": round(sacrebleu.corpus_bleu(hyps, [references]).score, 2),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    return {
        "benchmark": "translate",
        "split": args.split,
        "batch_size": args.batch_size,
        "threads": args.threads,
        "device": args.device,
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        "rows": rows,
    }


def machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return f"{os.cpu_count()} CPU cores ({cpu}){gpu}, torch {torch.__version__}, {torch.get_num_threads()} threads"


def benchmark_config(args: argparse.Namespace, *limits: str) -> Any:
    """The composed config of ``args.model`` on ``args.data`` and ``args.device``, with no evaluation
    or log line during the training, the training ``limits`` and the user's overrides."""
    from hydra import compose, initialize_config_dir

    from training.config import register_configs

    register_configs()
    overrides = [
        f"model={args.model}",
        f"data.root={args.data}",
        f"device={args.device}",
        "trainer.eval_every=1000000000",
        "trainer.log_every=1000000000",
        *limits,
        *args.overrides,
    ]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=overrides)


def measure_training(args: argparse.Namespace) -> Dict[str, Any]:
    """Train one model for ``warmup + steps`` steps (no evaluation) and time the last ``steps``."""
    import resource

    import torch

    from data.corpus import TRAIN
    from training.trainer import Trainer

    # max_steps: the run a fitted schedule decays over
    cfg = benchmark_config(args, "trainer.max_epochs=null", f"trainer.max_steps={args.warmup + args.steps}")
    with tempfile.TemporaryDirectory() as scratch:
        trainer = Trainer(cfg, Path(scratch))
        p = trainer.progress
        trainer.fit(max_steps=args.warmup, evaluate_last=False)  # warm-up: allocator, caches, first batches
        seconds, tokens = p.step_seconds, p.tgt_tokens
        trainer.fit(max_steps=args.warmup + args.steps, evaluate_last=False)
        seconds, tokens = p.step_seconds - seconds, p.tgt_tokens - tokens
        epoch_tokens = int(
            trainer.setup.data.datasets[TRAIN].tgt_lengths().sum()
        )  # target tokens + EOS of one epoch
        if trainer.setup.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(trainer.setup.device)
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
        use = utilisation(trainer, tokens / seconds)  # after the peak: its passes are not training's
        trainer.close()  # after the profile's steps: a skipped step logs to the board
        return {
            "model": args.model,
            "params": trainer.setup.params,
            "device": str(trainer.setup.device),
            "threads": torch.get_num_threads(),
            "batch_tokens": trainer.setup.tc.batch_tokens,
            "warmup_steps": args.warmup,
            "steps": args.steps,
            "tgt_tokens_per_batch": round(tokens / args.steps, 1),
            "seconds_per_step": round(seconds / args.steps, 4),
            "tgt_tokens_per_s": round(tokens / seconds, 1),
            "peak_memory_mib": round(peak / 2**20, 1),
            "memory_kind": "peak CUDA allocated"
            if trainer.setup.device.type == "cuda"
            else "peak resident set (process)",
            "epoch_tgt_tokens": epoch_tokens,
            "epoch_minutes": round(epoch_tokens / (tokens / seconds) / 60, 2),
            **use,
        }


def compiled_label(row: Dict[str, Any]) -> str:
    """What the precision cell adds for a compiled model: ", compiled", with its mode unless torch's
    default (rows of older reports have no mode)."""
    if not row["compile"]:
        return ""
    mode = row.get("compile_mode") or "default"
    return ", compiled" if mode == "default" else f", compiled {mode}"


def utilisation(trainer: Any, tokens_per_second: float) -> Dict[str, Any]:
    """The precision and compilation of ``trainer``'s steps, their model FLOPs per target token
    (counted on ``FLOP_BATCHES`` batches of the epoch), the FLOP/s at ``tokens_per_second``, the
    MFU where the device's peak is known and a profile's split of ``PROFILED_STEPS`` steps (on
    CUDA its kernels', on a CPU its operators', with the matrix products' own rate there:
    ``training/efficiency.py``)."""
    import torch

    from training.efficiency import (
        CPU_KINDS,
        cpu_profile,
        mfu,
        peak_tflops,
        profiled_kernels,
        split,
        step_flops,
    )

    device, tc = trainer.setup.device, trainer.setup.tc
    batches = [trainer.collate(b, trainer.progress.epoch) for b in list(trainer.sampler)[:FLOP_BATCHES]]
    flops = step_flops(trainer.setup.model, batches, tc, trainer.setup.world, device, trainer.setup.autocast)
    per_token = flops / sum(b.n_tgt_tokens for b in batches)
    precision = trainer.setup.precision
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = peak_tflops(name, precision)
    achieved = per_token * tokens_per_second
    result = {
        "precision": precision,
        "compile": bool(tc.compile),
        "compile_mode": tc.compile_mode if tc.compile else None,
        "gflops_per_tgt_token": round(per_token / 1e9, 4),
        "tflops_per_s": round(achieved / 1e12, 3),
        "peak_tflops": peak,
        "mfu": None if peak is None else round(mfu(achieved, peak), 4),
    }
    steps = batches[: PROFILED_STEPS if device.type == "cuda" else CPU_PROFILED_STEPS]
    if device.type == "cuda":
        kernels, wall = profiled_kernels(lambda: [trainer.train_step([b]) for b in steps])
        result["profile"] = {kind: round(share, 3) for kind, share in split(kernels, wall).items()}
        result["profile_seconds_per_step"] = round(wall / len(steps), 4)
    elif device.type == "cpu":
        found = cpu_profile(lambda: [trainer.train_step([b]) for b in steps], len(steps))
        result["profile"] = {kind: round(found[kind], 3) for kind in CPU_KINDS}
        result["profile_seconds_per_step"] = round(found["seconds_per_step"], 4)
        result["ops_per_step"] = round(found["ops_per_step"])
        result["matmul_gflops"] = round(found["matmul_gflops"], 1)
        # the model's FLOP/s over those of its matrix products alone: how near the step is to them
        result["of_matmul_rate"] = (
            round(achieved / 1e9 / found["matmul_gflops"], 3) if found["matmul_gflops"] else None
        )
    return result


def measure_epochs(args: argparse.Namespace) -> Dict[str, Any]:
    """Train ``args.epochs`` epochs from scratch (no evaluation), each one's target tokens per second
    (its steps alone); then the greedy validation of the trained model twice (the first run pays
    for whatever a device does the first time) and each test split decoded at each of ``args.beams``,
    as a run's evaluations and end do (``trainer.setup.eval_batch_tokens``)."""
    import torch

    from data.corpus import VALID
    from inference.decoding import decode_ids
    from training.trainer import Trainer
    from training.validation import validate

    cfg = benchmark_config(args, f"trainer.max_epochs={args.epochs}", "trainer.max_steps=null")
    with tempfile.TemporaryDirectory() as scratch:
        trainer = Trainer(cfg, Path(scratch))
        p, tc = trainer.progress, trainer.setup.tc
        steps_per_epoch = -(-len(trainer.sampler) // tc.accumulate)
        epochs = []
        for epoch in range(1, args.epochs + 1):
            seconds, tokens, tick = p.step_seconds, p.tgt_tokens, time.perf_counter()
            trainer.fit(max_steps=epoch * steps_per_epoch, evaluate_last=False)
            seconds, tokens = p.step_seconds - seconds, p.tgt_tokens - tokens
            wall = time.perf_counter() - tick
            epochs.append(
                {"epoch": epoch, "tgt_tokens_per_s": round(tokens / seconds, 1), "seconds": round(wall, 2)}
            )
            print(json.dumps(epochs[-1]), flush=True)  # what a run stopped at its time limit has done
        trainer.close()
        setup = trainer.setup
        model, data, device, batch_tokens = setup.model, setup.data, setup.device, setup.eval_batch_tokens

        def timed(decode: Any) -> float:
            tick = time.perf_counter()
            decode()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return round(time.perf_counter() - tick, 3)

        validation = [timed(lambda: validate(setup)) for _ in range(2)]
        decoding = []
        for split in data.test_splits:
            dataset = data.datasets[split]
            for beam in args.beams:
                decode = partial(decode_ids, model, dataset, batch_tokens, device, beam, tc.length_penalty)
                seconds = timed(partial(decode, autocast=setup.autocast))
                decoding.append(
                    {
                        "split": split,
                        "beam": beam,
                        "sentences": len(dataset),
                        "seconds": seconds,
                        "sentences_per_s": round(len(dataset) / seconds, 1),
                    }
                )
        return {
            "benchmark": "epochs",
            "machine": machine(),
            "date": time.strftime("%Y-%m-%d"),
            "model": args.model,
            "device": str(device),
            "overrides": args.overrides,
            "batch_tokens": tc.batch_tokens,
            "eval_batch_tokens": batch_tokens,
            "epochs": epochs,
            "first_to_last": round(epochs[0]["tgt_tokens_per_s"] / epochs[-1]["tgt_tokens_per_s"], 3),
            "validation_sentences": len(data.datasets[VALID]),
            "validation_seconds": validation,
            "decoding": decoding,
        }


def epochs_table(result: Dict[str, Any]) -> str:
    lines = [
        f"The first {len(result['epochs'])} epochs of {result['model']}, device {result['device']}; "
        f"{result['machine']}; {result['date']}; batch_tokens {result['batch_tokens']}"
        + (f"; overrides: {' '.join(result['overrides'])}" if result["overrides"] else ""),
        "",
        "| epoch | tgt tok/s (steps) | seconds (wall) |",
        "| ---: | ---: | ---: |",
        *[f"| {e['epoch']} | {e['tgt_tokens_per_s']:,.0f} | {e['seconds']:.1f} |" for e in result["epochs"]],
        "",
        f"The first epoch's rate is {result['first_to_last']:.2f}x the last one's.",
        "",
        f"Greedy validation of {result['validation_sentences']} sentences (batches of "
        f"{result['eval_batch_tokens']} tokens): {result['validation_seconds'][0]:.2f} s the first time, "
        f"{result['validation_seconds'][1]:.2f} s the second.",
        "",
        "| test split | beam | sentences | seconds | sentences/s |",
        "| --- | ---: | ---: | ---: | ---: |",
        *[
            f"| {d['split']} | {d['beam']} | {d['sentences']} | {d['seconds']:.2f} | {d['sentences_per_s']:,.1f} |"
            for d in result["decoding"]
        ],
    ]
    return "\n".join(lines) + "\n"


def bench_train(args: argparse.Namespace) -> Dict[str, Any]:
    rows = []
    for spec in args.models:
        model, *own = spec.split(",")  # the model config, then overrides of this model alone
        extra = (
            list(args.overrides)
            + own
            + ([f"trainer.batch_tokens={args.batch_tokens}"] if args.batch_tokens else [])
        )
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "train-one",
            "--model",
            model,
            "--data",
            str(Path(args.data).resolve()),
            "--warmup",
            str(args.warmup),
            "--steps",
            str(args.steps),
            "--device",
            args.device,
            "--",
            *extra,
        ]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            last = (
                done.stderr.strip().splitlines()[-1]
                if done.stderr.strip()
                else f"exit code {done.returncode}"
            )
            raise SystemExit(f"error: training {model} failed: {last}")
        rows.append(dict(json.loads(done.stdout.strip().splitlines()[-1]), model=spec))
        print(json.dumps(rows[-1]), flush=True)
        result = {
            "benchmark": "train",
            "machine": machine(),
            "date": time.strftime("%Y-%m-%d"),
            "device": args.device,
            "overrides": args.overrides,
            "rows": rows,
        }
        write_outputs(args.out, result, train_table)  # each model's row as soon as it is measured
    if args.checkpoint:
        result["translate"] = bench_translate(args)
    return result


def train_table(result: Dict[str, Any]) -> str:
    lines = [
        f"Training on Multi30k train, device {result['device']}; {result['machine']}; {result['date']}"
        + (f"; overrides: {' '.join(result['overrides'])}" if result["overrides"] else ""),
        "",
        "| model | params | precision | batch_tokens | tgt tokens/batch | steps timed | s/step | tgt tok/s "
        "| GFLOP/tgt token | TFLOP/s | MFU | peak memory MiB | epoch (min) |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in result["rows"]:
        precision = r["precision"] + compiled_label(r)
        use = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        lines.append(
            f"| {r['model']} | {r['params']:,} | {precision} | {r['batch_tokens']} | {r['tgt_tokens_per_batch']:,.0f} | "
            f"{r['steps']} (after {r['warmup_steps']}) | {r['seconds_per_step']:.3f} | {r['tgt_tokens_per_s']:,.0f} | "
            f"{r['gflops_per_tgt_token']:.3f} | {r['tflops_per_s']:.2f} | {use} | "
            f"{r['peak_memory_mib']:,.0f} | {r['epoch_minutes']:.1f} |"
        )
    kinds = sorted({r["memory_kind"] for r in result["rows"]})
    lines.append(
        f"\nPeak memory: {', '.join(kinds)}. Epoch: the target tokens of one training epoch at the measured "
        "rate (steps only, no evaluation). GFLOP/tgt token: the matrix products of a forward and backward "
        "pass, counted by torch's FlopCounterMode on real batches (padding included); MFU: TFLOP/s over "
        "the device's dense peak in that precision (NVIDIA's data sheet; n/a: unknown, as for a CPU)."
    )
    for kind, rows in (("CUDA", "cuda"), ("CPU", "cpu")):
        profiled = [r for r in result["rows"] if "profile" in r and r["device"].startswith(rows)]
        if profiled:
            lines += ["", *profile_table(kind, profiled)]
    if "translate" in result:
        lines += ["", translate_table(result["translate"])]
    return "\n".join(lines) + "\n"


def profile_table(kind: str, rows: List[Dict[str, Any]]) -> List[str]:
    """The lines of the table of where the steps of ``rows`` (of one device kind) go."""
    cpu = kind == "CPU"
    what = (
        "operators of a profile of a few steps, each one's own time by kind (attention: fused attention; the "
        "RNN's is plain operators); outside operators: the host's own work, the profiler's own recording included "
        "(s/step profiled against s/step above); ops/step: the outermost operators "
        "of the forward, backward and optimizer; matmul GFLOP/s: the matrix products' own rate in the profile; "
        "of it: the model's FLOP/s over that rate"
        if cpu
        else "kernels of a profile of a few steps, by kind; idle: no kernel ran"
    )
    kinds = list(rows[0]["profile"])
    extra = ["ops/step", "matmul GFLOP/s", "of it"] if cpu else []
    lines = [
        f"Where a step's time goes ({kind} {what}):",
        "",
        "| model | precision | s/step (profiled) | " + " | ".join(kinds + extra) + " |",
        "| --- | --- | ---: |" + " ---: |" * (len(kinds) + len(extra)),
    ]
    for r in rows:
        cells = [f"{100 * v:.0f}%" for v in r["profile"].values()]
        if cpu:
            share = r["of_matmul_rate"]
            cells += [
                str(r["ops_per_step"]),
                f"{r['matmul_gflops']:.1f}",
                "n/a" if share is None else f"{100 * share:.0f}%",
            ]
        precision = r["precision"] + compiled_label(r)
        lines.append(
            f"| {r['model']} | {precision} | {r['profile_seconds_per_step']:.4f} | {' | '.join(cells)} |"
        )
    return lines


def translate_table(result: Dict[str, Any]) -> str:
    threads = result.get("threads") or "default"
    lines = [
        f"translate.py on {result['split']}, batch {result['batch_size']}, device {result['device']}, "
        f"threads {threads}; {result['machine']}; {result['date']}",
        "",
        "| model | engine | beam | start-up s | decode s | sentences/s | tokens/s | peak MiB | BLEU |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in result["rows"]:
        rates = (
            f"{r['sentences_per_s']:.1f} | {r['tokens_per_s']:.0f}"
            if r["sentences_per_s"] is not None
            else "(below start-up noise) | -"
        )
        lines.append(
            f"| {r['model']} | {r.get('engine', 'torch')} | {r['beam']} | {r['startup_s']:.2f} | "
            f"{r['decode_s']:.2f} | {rates} | {r.get('peak_memory_mib', 0):,.0f} | {r['bleu']:.2f} |"
        )
    by_model: Dict[str, Dict[int, float]] = {}
    for r in result["rows"]:
        by_model.setdefault(r["model"], {})[r["beam"]] = r["decode_s"]
    for model, times in by_model.items():
        if 1 in times and len(times) > 1:
            ratios = ", ".join(f"beam {b}: {t / times[1]:.2f}x" for b, t in sorted(times.items()) if b != 1)
            lines.append(f"\n{model}: decode time against greedy: {ratios}")
    first = result["rows"][0]["model"] if result["rows"] else None
    for beam in sorted({r["beam"] for r in result["rows"]}):
        same = {r["model"]: r["decode_s"] for r in result["rows"] if r["beam"] == beam}
        if first not in same or len(same) < 2:
            continue
        if same[first] <= 0:  # the reference's own decoding took less than its start-up's spread
            speedups = f"{first} below start-up noise, no ratio"
        else:
            speedups = ", ".join(
                f"{m}: {same[first] / t:.2f}x" if t > 0 else f"{m}: below start-up noise"
                for m, t in same.items()
                if m != first
            )
        lines.append(f"\nbeam {beam}, speed against {first}: {speedups}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.command == "train-one":
        print(json.dumps(measure_training(args)))
        return
    commands = {
        "train": (bench_train, train_table),
        "translate": (bench_translate, translate_table),
        "epochs": (measure_epochs, epochs_table),
    }
    bench, table = commands[args.command]
    print(write_outputs(args.out, bench(args), table))


def write_outputs(out: str, result: Dict[str, Any], table: Any) -> str:
    """``OUT.json`` and ``OUT.md`` (by ``table``) of ``result``, each replaced whole (a process
    killed while writing leaves the earlier file: gpu_check.py stops its steps at their limits);
    the Markdown."""
    from common.files import AtomicFile

    markdown = table(result)
    for path, text in ((f"{out}.json", json.dumps(result, indent=1) + "\n"), (f"{out}.md", markdown)):
        with AtomicFile(Path(path)) as stream:
            stream.write(text)
    return markdown


if __name__ == "__main__":
    main()
