"""Speed benchmarks of the toolkit; JSON and Markdown out.

``translate``: sentences/s and output tokens/s of ``translate.py`` (run as users run it, one
process per case) on a test split, per checkpoint and beam size. Start-up (imports and loading
the checkpoint) is timed separately, as a run on an empty input, and left out of the rates::

    python scripts/benchmark.py translate --checkpoint rnn=outputs/rnn/checkpoints/best.pt \\
        --checkpoint transformer=outputs/tf/checkpoints/best.pt --data ../multi30k --beams 1 5

Each case runs ``--repeats`` times; the table shows the fastest run (the least disturbed by other
work on the machine) and BLEU of its output, a check that the outputs are real translations.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    tr = commands.add_parser("translate", help="decoding speed of translate.py")
    tr.add_argument("--checkpoint", action="append", required=True, metavar="NAME=PATH", help="a checkpoint to time (repeatable)")
    tr.add_argument("--data", default=os.environ.get("MULTI30K_DIR"), help="folder with {split}.{lang}[.gz] (default: $MULTI30K_DIR)")
    tr.add_argument("--split", default="test_2016_flickr")
    tr.add_argument("--beams", type=int, nargs="+", default=[1, 5])
    tr.add_argument("--batch-size", type=int, default=64)
    tr.add_argument("--device", default="cpu")
    tr.add_argument("--repeats", type=int, default=1)
    tr.add_argument("--out", default="benchmark_translate", help="writes OUT.json and OUT.md")
    return parser.parse_args(argv)


def read_split(folder: Path, split: str, lang: str) -> List[str]:
    from data.corpus import read_lines, split_files

    path = split_files(folder).get(split, {}).get(lang)
    if path is None:
        raise SystemExit(f"error: no {split}.{lang}[.gz] in {folder}")
    return read_lines(path)


def timed_run(command: List[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(command)} failed: {done.stderr.strip()}")
    return seconds


def bench_translate(args: argparse.Namespace) -> Dict[str, Any]:
    import sacrebleu

    from models.build import count_parameters
    from training.checkpoint import load_model

    if not args.data:
        raise SystemExit("error: give --data DIR (a Multi30k folder) or set MULTI30K_DIR")
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for spec in args.checkpoint:
            name, _, path = spec.partition("=")
            model, tokenizer, payload = load_model(Path(path))
            data = payload["config"]["data"]
            sources = read_split(Path(args.data), args.split, data["src"])
            references = read_split(Path(args.data), args.split, data["tgt"])
            src_file, empty = Path(scratch) / "src.txt", Path(scratch) / "empty.txt"
            src_file.write_text("".join(line + "\n" for line in sources), encoding="utf-8")
            empty.write_text("")
            for beam in args.beams:
                base = [sys.executable, "translate.py", "--checkpoint", str(Path(path).resolve()), "--beam", str(beam),
                        "--batch-size", str(args.batch_size), "--device", args.device]
                out_file = Path(scratch) / "out.txt"
                runs = []
                for _ in range(args.repeats):
                    startup = timed_run(base + ["--input", str(empty), "--output", str(out_file)])
                    total = timed_run(base + ["--input", str(src_file), "--output", str(out_file)])
                    runs.append((total - startup, startup, total))
                decode, startup, total = min(runs)
                hyps = out_file.read_text(encoding="utf-8").splitlines()
                tokens = sum(len(ids) + 1 for ids in tokenizer.encode_tgt(hyps))  # subword tokens, EOS included
                rows.append({
                    "model": name, "params": count_parameters(model), "beam": beam,
                    "sentences": len(sources), "startup_s": round(startup, 2), "decode_s": round(decode, 2),
                    "total_s": round(total, 2), "sentences_per_s": round(len(sources) / decode, 1),
                    "tokens_per_s": round(tokens / decode, 1),
                    "bleu": round(sacrebleu.corpus_bleu(hyps, [references]).score, 2),
                })
                print(json.dumps(rows[-1]), flush=True)
    return {"benchmark": "translate", "split": args.split, "batch_size": args.batch_size, "device": args.device,
            "machine": machine(), "date": time.strftime("%Y-%m-%d"), "rows": rows}


def machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return f"{os.cpu_count()} CPU cores ({cpu}){gpu}, torch {torch.__version__}, {torch.get_num_threads()} threads"


def translate_table(result: Dict[str, Any]) -> str:
    lines = [
        f"translate.py on {result['split']}, batch {result['batch_size']}, device {result['device']}; "
        f"{result['machine']}; {result['date']}",
        "",
        "| model | beam | start-up s | decode s | sentences/s | tokens/s | BLEU |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in result["rows"]:
        lines.append(f"| {r['model']} | {r['beam']} | {r['startup_s']:.2f} | {r['decode_s']:.2f} | "
                     f"{r['sentences_per_s']:.1f} | {r['tokens_per_s']:.0f} | {r['bleu']:.2f} |")
    by_model: Dict[str, Dict[int, float]] = {}
    for r in result["rows"]:
        by_model.setdefault(r["model"], {})[r["beam"]] = r["decode_s"]
    for model, times in by_model.items():
        if 1 in times and len(times) > 1:
            ratios = ", ".join(f"beam {b}: {t / times[1]:.2f}x" for b, t in sorted(times.items()) if b != 1)
            lines.append(f"\n{model}: decode time against greedy: {ratios}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    args = parse_args(argv)
    result = bench_translate(args)
    markdown = translate_table(result)
    Path(f"{args.out}.json").write_text(json.dumps(result, indent=1) + "\n")
    Path(f"{args.out}.md").write_text(markdown)
    print(markdown)


if __name__ == "__main__":
    main()
