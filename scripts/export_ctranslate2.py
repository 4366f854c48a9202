"""Export a Transformer checkpoint to a CTranslate2 model folder (for translate.py --engine ctranslate2).

    python scripts/export_ctranslate2.py RUN/checkpoints/best.pt exports/de-en-int8
    python scripts/export_ctranslate2.py RUN/checkpoints/best.pt exports/de-en-f32 --quantization float32
    python translate.py --engine ctranslate2 --checkpoint exports/de-en-int8 "Ein Mann schläft."

The folder holds the engine's model, the SentencePiece model(s) and export.json, so it translates
without the checkpoint. ``--quantization`` is the weight type stored: int8 (default: a quarter of
the size, the fastest on CPU), int16 or float32. OUT_DIR must be new (or empty): it is written
under a temporary name and renamed when complete, never replaced. An RNN checkpoint (CTranslate2
runs Transformers only) or a bad input is one ``error:`` line (exit 1).
"""

import argparse
import sys
from pathlib import Path

from inference.ctranslate2_export import QUANTIZATIONS  # no torch: answers --help at once


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoint", type=Path, help="a checkpoint of train.py (a Transformer)")
    parser.add_argument("out_dir", type=Path, metavar="OUT_DIR", help="the new export folder")
    parser.add_argument(
        "--quantization", choices=QUANTIZATIONS, default="int8", help="weight type stored (default: int8)"
    )
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from common.checkpoint import CheckpointError
    from inference.ctranslate2_export import ExportError, export_checkpoint

    try:
        info = export_checkpoint(args.checkpoint, args.out_dir, args.quantization)
    except (ExportError, CheckpointError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    size = sum(path.stat().st_size for path in args.out_dir.iterdir()) / 2**20
    print(
        f"{args.out_dir}: {info['quantization']} CTranslate2 model of {args.checkpoint} "
        f"(step {info['step']}), {size:.1f} MiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
