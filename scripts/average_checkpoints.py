"""Average the weights of checkpoints into one ordinary checkpoint (for translate.py, compare.py).

    python scripts/average_checkpoints.py --out avg.pt RUN/checkpoints/step_0000800.pt RUN/checkpoints/step_0000900.pt
    python scripts/average_checkpoints.py --out avg.pt --run RUN --last 5

``--run RUN --last N`` takes the ``N`` newest ``checkpoints/step_*.pt`` of a run folder, the ones
``trainer.keep_last`` (or ``trainer.average_last``) kept. The checkpoints must hold the same model
and vocabulary; the average keeps the last one's config and progress, and no optimizer state (it
translates, it does not resume). ``--out`` is never one of the inputs and never replaced: an
existing file is refused. A bad input is one ``error:`` line (exit 1).
"""

import argparse
import sys
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoints", nargs="*", type=Path, help="checkpoints to average")
    parser.add_argument("--out", type=Path, required=True, help="where to write the average (a new file)")
    parser.add_argument("--run", type=Path, help="a run folder: average its last --last kept checkpoints")
    parser.add_argument("--last", type=int, help="with --run: how many of its newest step_*.pt")
    args = parser.parse_args(argv)
    if (args.run is None) != (args.last is None):
        parser.error("--run and --last go together")
    if args.run is not None and args.checkpoints:
        parser.error("give checkpoints or --run RUN --last N, not both")
    if args.run is None and len(args.checkpoints) < 2:
        parser.error("give at least two checkpoints (or --run RUN --last N)")
    if args.last is not None and args.last < 2:
        parser.error("--last must be at least 2")
    return args


def inputs(args: argparse.Namespace):
    """The checkpoints to average, oldest first; ValueError naming what is missing."""
    from training.averaging import last_checkpoints

    if args.run is None:
        return list(args.checkpoints)
    found = last_checkpoints(args.run / "checkpoints", args.last)
    if len(found) < args.last:
        raise ValueError(
            f"{args.run / 'checkpoints'} holds {len(found)} step_*.pt checkpoints, not {args.last}: train with "
            f"trainer.keep_last={args.last} (or trainer.average_last={args.last}), or ask for fewer"
        )
    return found


def main(argv=None) -> int:
    args = parse_args(argv)  # before torch is imported: --help and mistakes answer at once
    from common.checkpoint import CheckpointError, save_checkpoint
    from training.averaging import average_checkpoints

    try:
        paths = inputs(args)
        if args.out.exists():
            raise ValueError(f"{args.out} exists: remove it or choose another --out (it is never replaced)")
        averaged = average_checkpoints(paths)
        save_checkpoint(averaged, args.out)
    except (CheckpointError, ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"{args.out}: the mean of {len(paths)} checkpoints ({', '.join(str(p) for p in paths)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
