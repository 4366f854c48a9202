"""Export images of a run's TensorBoard events as PNG files (TensorBoard's own event reader).

    python scripts/tb_images.py RUN/tb --list                            # image tags and their steps
    python scripts/tb_images.py RUN/tb --tag attention/sent1/cross_layer1 --out cross.png   # last step
    python scripts/tb_images.py RUN/tb --tag attention/sent1/cross_layer3_mean --step 478 --out mean.png

Tags are those of ``training/board.py`` (``cross_layer1`` is an RNN's additive attention,
``cross_layer3_mean`` the last layer of a 3-layer Transformer, heads averaged).

The PNG is the image as TensorBoard shows it (the heatmap with tokens on the axes), byte for byte.
"""

import argparse
import sys
from pathlib import Path

from common.files import AtomicFile


def load_images(tb_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tb_dir), size_guidance={"images": 0})  # 0: keep every image
    events.Reload()
    return events


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("tb_dir", type=Path, help="a run's tb/ folder")
    parser.add_argument("--list", action="store_true", help="print the image tags and their steps")
    parser.add_argument("--tag", help="the image tag to export")
    parser.add_argument("--step", type=int, help="the step to export (default: the last)")
    parser.add_argument("--out", type=Path, help="the PNG file to write")
    args = parser.parse_args(argv)
    if not args.list and not (args.tag and args.out):
        parser.error("give --list, or --tag and --out")
    if not args.tb_dir.is_dir():
        print(f"error: {args.tb_dir} is not a folder (give a run's tb/ folder)", file=sys.stderr)
        return 1
    events = load_images(args.tb_dir)
    tags = events.Tags().get("images", [])
    if args.list:
        for tag in tags:
            print(tag, " ".join(str(image.step) for image in events.Images(tag)))
        return 0
    if args.tag not in tags:
        print(
            f"error: no image tag {args.tag!r} in {args.tb_dir} (--list shows the {len(tags)} there)",
            file=sys.stderr,
        )
        return 1
    images = {image.step: image for image in events.Images(args.tag)}
    step = max(images) if args.step is None else args.step
    if step not in images:
        print(
            f"error: {args.tag} has no image at step {step}; steps: {' '.join(map(str, sorted(images)))}",
            file=sys.stderr,
        )
        return 1
    try:
        with AtomicFile(args.out, "wb") as out:
            out.write(images[step].encoded_image_string)
    except OSError as error:
        print(f"error: cannot write {args.out}: {error.strerror}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}: {args.tag} at step {step}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
