"""Grid-search beam size and length penalty on a validation set, by BLEU (and time).

    python scripts/tune_decoding.py --checkpoint RUN/checkpoints/best.pt \\
        --src ../data/multi30k/val.de.gz --ref ../data/multi30k/val.en.gz \\
        [--beams 1 4 5 8] [--alphas 0.6 0.8 1.0 1.2] [--batch-size 64] [--threads N]

Prints one row per setting (beam, alpha, BLEU, chrF, seconds, sentences/s; greedy search has no
length penalty, so beam 1 is one row), then the line naming the best setting as translate.py
options. Use a validation set: a setting picked on the test set says nothing about new text. Ties
go to the smaller beam (faster), then to the alpha closer to 1. BLEU and chrF are sacrebleu's,
detokenized, against the raw references. A bad input is one ``error:`` line (exit 1).
"""

import argparse
import sys
import time
from pathlib import Path
from typing import Dict, List


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", type=Path, required=True, help="a checkpoint of train.py")
    parser.add_argument("--src", type=Path, required=True, help="validation source text, one sentence a line")
    parser.add_argument("--ref", type=Path, required=True, help="its reference translations, aligned")
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 4, 5, 8], help="beam sizes")
    parser.add_argument(
        "--alphas", type=float, nargs="+", default=[0.6, 0.8, 1.0, 1.2], help="length penalties (GNMT alpha)"
    )
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per decoding batch")
    parser.add_argument(
        "--threads", type=int, help="CPU threads for torch (default: all this process may use)"
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    args = parser.parse_args(argv)
    if min(args.beams) < 1:
        parser.error("--beams must be at least 1")
    if min(args.alphas) < 0:
        parser.error("--alphas must be 0 or more")
    if args.batch_size < 1:
        parser.error("--batch-size must be at least 1")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be at least 1")
    return args


def settings(beams: List[int], alphas: List[float]) -> List[Dict[str, float]]:
    """The grid: every (beam, alpha), with greedy search (beam 1) once, as it has no length penalty."""
    grid = []
    for beam in sorted(set(beams)):
        for alpha in sorted(set(alphas)) if beam > 1 else [None]:
            grid.append({"beam": beam, "alpha": alpha})
    return grid


def best_row(rows: List[Dict[str, float]]) -> Dict[str, float]:
    """The highest BLEU; on a tie the smaller beam, then the alpha closer to 1."""

    def nearness(alpha):  # greedy rows have no alpha
        return 0.0 if alpha is None else -abs(alpha - 1.0)

    return max(rows, key=lambda r: (round(r["bleu"], 2), -r["beam"], nearness(r["alpha"])))


def format_row(row: Dict[str, float]) -> str:
    alpha = "-" if row["alpha"] is None else f"{row['alpha']:g}"
    return (
        f"{row['beam']:>4}  {alpha:>5}  {row['bleu']:6.2f}  {row['chrf']:6.2f}  {row['seconds']:7.1f}  "
        f"{row['per_second']:8.1f}"
    )


def main(argv=None) -> int:
    args = parse_args(argv)  # before torch is imported: --help and mistakes answer at once
    from common.checkpoint import CheckpointError
    from common.device import set_threads
    from data.corpus import read_lines
    from data.errors import DataError
    from inference.translator import Translator
    from training.validation import corpus_scores

    try:
        sources, references = read_lines(args.src), read_lines(args.ref)
        if len(sources) != len(references):
            raise DataError(
                f"{args.src} has {len(sources)} lines, {args.ref} {len(references)}: they must be aligned"
            )
        translator = Translator.from_checkpoint(args.checkpoint, args.device)
        set_threads(translator.engine.device, args.threads)
    except (CheckpointError, DataError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"{args.checkpoint}: {len(sources)} sentences of {args.src}")
    print("beam  alpha    BLEU    chrF  seconds  sents/s")
    rows = []
    for setting in settings(args.beams, args.alphas):
        tick = time.perf_counter()
        found = translator.translate(
            sources, beam=setting["beam"], alpha=setting["alpha"], batch_size=args.batch_size
        )
        seconds = time.perf_counter() - tick
        row = dict(setting, **corpus_scores([t.text for t in found], references), seconds=seconds)
        row["per_second"] = len(sources) / max(seconds, 1e-9)
        rows.append(row)
        print(format_row(row), flush=True)
    best = best_row(rows)
    alpha = "" if best["alpha"] is None else f" --alpha {best['alpha']:g}"
    print(f"best: --beam {best['beam']}{alpha} (BLEU {best['bleu']:.2f}, chrF {best['chrf']:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
