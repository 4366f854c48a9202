"""Translate with a trained checkpoint: ``python translate.py --checkpoint PATH [SENTENCE ...]``.

Sentences come from the arguments, ``--input FILE`` or standard input (one a line); translations
go to standard output or ``--output FILE``, one a line in the input order (an empty line gives an
empty line). On a terminal with no sentences given, it prompts and translates line by line.
Within the tool, sentences are sorted by length and decoded ``--batch-size`` at a time.

- ``--beam N`` (default 5; 1 is greedy) with the length penalty ``--alpha`` (GNMT; default: the
  one the run was tested with, ``trainer.length_penalty``, else 1.0).
- ``--nbest N``: ``N`` lines ``index ||| hypothesis ||| score`` per sentence (index from 0, score the
  length-normalised log-probability), best first.
- ``--alignments``: a tab, then Pharaoh word alignments ``i-j`` (source word ``i``, output word
  ``j``, from 0) after each translation. They come from the attention while the model produces its
  output: the RNN's additive attention, or the Transformer's last decoder layer's cross-attention
  averaged over its heads. Subword weights are summed into words and every output word is aligned
  to its most-attended source word (``inference/alignment.py``).
- ``--plot DIR``: one PNG heatmap of that word attention per sentence, words on the axes.
- ``--checkpoint A.pt --checkpoint B.pt``: an ensemble. At every step the search scores tokens by
  the mean of the models' log-probabilities, each model with its own decoder state; the models
  may be of both families but must share their SentencePiece model (the runs of one sweep do),
  else one ``error:`` line. ``--alpha`` defaults to the mean of the runs' length penalties and
  ``--alignments`` come from the models' source attention averaged.
- ``--engine ctranslate2 --checkpoint EXPORT_DIR``: decode with CTranslate2 (C++, int8 on CPU) over
  a folder of ``scripts/export_ctranslate2.py`` instead of our own search over a checkpoint; the
  options and outputs are the same, but for ensembles and ``--dtype`` (``inference/ctranslate2_engine.py``
  says what it keeps equal).
  ``--threads N`` sets the CPU threads of either engine.

Bad input (missing or foreign checkpoint, bad option, unreadable file) prints one ``error:`` line
on standard error and exits with 1 (2 for a bad command line). Heavy libraries are imported only
after the command line has been checked, so mistakes are reported at once.

A thin command line over ``inference.translator.Translator`` (the Python API): this file reads the
input, formats the output and reports errors.
"""

import argparse
import logging
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterable, Iterator, List, Optional, Sequence

from data.errors import DataError  # no torch: data/errors.py imports nothing
from models.search_options import MAX_LEN_EXTRA, MAX_LEN_RATIO, option_problem  # no torch either

if TYPE_CHECKING:  # imported for real after the command line is checked (they need torch)
    from inference.translator import Translation, Translator

# The names of models/search_options.py's options on this command line.
OPTION_FLAGS = {
    "beam_size": "--beam",
    "nbest": "--nbest",
    "alpha": "--alpha",
    "max_len_ratio": "--max-len-ratio",
}


class UsageError(Exception):
    """A bad command line or input: reported as one ``error:`` line."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors: one line, no usage dump
        print(f"error: {message} (see python translate.py --help)", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="translate.py",
        description="Translate sentences with a checkpoint of train.py.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add(
        "sentences",
        nargs="*",
        metavar="SENTENCE",
        help="sentences to translate (default: read standard input)",
    )
    add(
        "--checkpoint",
        required=True,
        action="append",
        metavar="PATH",
        help="a checkpoint of train.py, e.g. outputs/.../checkpoints/best.pt (--engine ctranslate2: an export "
        "folder); given more than once, the checkpoints decode as an ensemble",
    )
    add(
        "--engine",
        choices=("torch", "ctranslate2"),
        default="torch",
        help="torch: our own search over a checkpoint; ctranslate2: a folder of scripts/export_ctranslate2.py",
    )
    add("--input", metavar="FILE", help="read sentences from FILE, one a line")
    add("--output", metavar="FILE", help="write translations to FILE (replaced only when all are done)")
    add("--beam", type=int, default=5, help="beam size; 1 is greedy search")
    add(
        "--alpha",
        type=float,
        default=None,
        help="GNMT length penalty (default: the run's trainer.length_penalty, else 1.0)",
    )
    add(
        "--nbest",
        type=int,
        default=None,
        help="print the N best hypotheses as 'index ||| hypothesis ||| score'",
    )
    add("--batch-size", type=int, default=64, help="sentences decoded together")
    add("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    add(
        "--dtype",
        choices=("auto", "float32", "bfloat16"),
        default="auto",
        help="precision of the torch engine: auto decodes as the run was validated and tested (its "
        "results.json's decode_dtype: bf16 for a CUDA run with trainer.amp, float32 for a CPU run); "
        "bfloat16 needs CUDA",
    )
    add("--threads", type=int, default=0, help="CPU threads (0: torch's or the engine's default)")
    add(
        "--max-len-ratio",
        type=float,
        default=MAX_LEN_RATIO,
        help="longest output: this times the source length ...",
    )
    add("--max-len-extra", type=int, default=MAX_LEN_EXTRA, help="... plus this many tokens")
    add("--alignments", action="store_true", help="append a tab and Pharaoh word alignments i-j")
    add("--plot", metavar="DIR", help="write one attention heatmap PNG per sentence into DIR")
    return parser


def check_args(args: argparse.Namespace) -> None:
    """Range and consistency checks that need no heavy import; raises ``UsageError``."""
    given = dict(
        beam_size=args.beam,
        nbest=args.nbest or 1,
        alpha=args.alpha or 0.0,
        max_len_ratio=args.max_len_ratio,
        max_len_extra=args.max_len_extra,
    )
    problem = option_problem(**given)
    if problem is not None:
        name, what = problem
        raise UsageError(f"{OPTION_FLAGS[name]} {given[name]}: {what}")
    if args.batch_size < 1:
        raise UsageError(f"--batch-size {args.batch_size}: must be at least 1")
    if args.sentences and args.input:
        raise UsageError("give sentences as arguments or --input FILE, not both")
    if args.threads < 0:
        raise UsageError(f"--threads {args.threads}: must be 0 (the default) or more")
    if args.engine == "ctranslate2" and args.dtype != "auto":
        raise UsageError(
            "--dtype is for the torch engine: a CTranslate2 export runs the type it was exported in"
        )
    if args.engine == "ctranslate2" and len(args.checkpoint) > 1:
        raise UsageError(
            "--engine ctranslate2 takes one export folder: ensembles decode with the torch engine"
        )
    for path in args.checkpoint:
        check_model_path(Path(path), args.engine)
    if args.input and not Path(args.input).is_file():
        raise UsageError(f"input file {args.input} does not exist")


def check_model_path(path: Path, engine: str) -> None:
    """A checkpoint file for the torch engine, an export folder for CTranslate2; ``UsageError`` else."""
    if not path.exists():
        raise UsageError(f"checkpoint {path} does not exist")
    if engine == "torch" and path.is_dir():
        from inference.ctranslate2_export import INFO_FILE  # no torch

        hint = (
            "a CTranslate2 export: add --engine ctranslate2" if (path / INFO_FILE).is_file() else "a folder"
        )
        raise UsageError(f"checkpoint {path} is {hint} (the torch engine takes a .pt file)")
    if engine == "ctranslate2" and not path.is_dir():
        raise UsageError(
            f"--engine ctranslate2 takes an export folder, not {path}: make one with "
            f"python scripts/export_ctranslate2.py {path} OUT_DIR"
        )


def load_translator(args: argparse.Namespace) -> "Translator":
    """The Translator of ``--checkpoint`` (several: an ensemble) on ``--device`` with ``--threads``, by
    ``--engine``."""
    if args.engine == "ctranslate2":
        from inference.ctranslate2_engine import load_translator as load_export

        return load_export(args.checkpoint[0], args.device, args.threads)
    from common.device import pick_device, set_threads
    from inference.translator import Translator

    if args.threads:
        set_threads(pick_device(args.device), args.threads)
    return Translator.from_checkpoints(args.checkpoint, args.device, args.dtype)


def translate_options(args: argparse.Namespace) -> Dict[str, Any]:
    """The keyword arguments of ``Translator.translate`` the command line sets."""
    return dict(
        beam=args.beam,
        alpha=args.alpha,
        nbest=args.nbest or 1,
        batch_size=args.batch_size,
        alignments=bool(args.alignments or args.plot),  # plots need the word attention too
        max_len_ratio=args.max_len_ratio,
        max_len_extra=args.max_len_extra,
    )


def read_input(args: argparse.Namespace) -> List[str]:
    """The sentences: the arguments, else the lines of ``--input FILE``, else of standard input."""
    from data.corpus import decode_lines

    if args.sentences:
        return list(args.sentences)
    if not args.input:
        return decode_lines(sys.stdin.buffer.read(), "standard input")
    try:
        raw = Path(args.input).read_bytes()
    except OSError as error:
        raise UsageError(f"cannot read input file {args.input}: {error.strerror}") from None
    return decode_lines(raw, f"input file {args.input}")


# the loggers whose warnings a user of translate.py sees: over-long inputs, a device fallen back to the CPU
WARNING_LOGGERS = ("inference.translator", "common.device", "inference.ctranslate2_engine")


@contextmanager
def show_warnings() -> Iterator[None]:
    """While inside, the warnings of ``WARNING_LOGGERS`` are ``warning: ...`` lines on standard
    error and go nowhere else; the loggers are as they were afterwards, so ``main`` leaves no trace
    in a process that calls it."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("warning: %(message)s"))
    loggers = [logging.getLogger(name) for name in WARNING_LOGGERS]
    propagate = [logger.propagate for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.propagate = False
    try:
        yield
    finally:
        for logger, before in zip(loggers, propagate):
            logger.removeHandler(handler)
            logger.propagate = before


def format_lines(index: int, source: str, result: "Translation", nbest: bool, alignments: bool) -> List[str]:
    """Output lines of input sentence ``index``, ``source``, translated as ``result`` (a ``Translation``).

    With ``alignments`` every line is 'translation, tab, pairs', also for an empty translation; only a
    blank input line stays an empty line (without ``nbest``).
    """
    from inference.alignment import pharaoh
    from inference.translator import is_blank

    lines = []
    for t in result.nbest if nbest else [result]:
        line = f"{index} ||| {t.text} ||| {t.score:.4f}" if nbest else t.text
        if alignments and (nbest or not is_blank(source)):
            line += "\t" + pharaoh(t.alignment or [])
        lines.append(line)
    return lines


def write_plots(folder: Path, results: List["Translation"], first_index: int = 0) -> None:
    """One heatmap per sentence: ``<index>.png``, output words by source words, the best hypothesis."""
    import matplotlib.pyplot as plt

    from inference.figures import attention_figure

    folder.mkdir(parents=True, exist_ok=True)
    width = max(4, len(str(first_index + len(results))))
    for offset, best in enumerate(results):
        if best.words is None or not best.out_words:
            continue
        index = first_index + offset
        title = f"sentence {index}: word attention (output x source)"
        fig = attention_figure(
            best.words, best.src_words, best.out_words, title, "source", "output", card_px=None
        )  # a file of its own: as wide as every source word's label needs
        fig.savefig(folder / f"{index:0{width}d}.png")
        plt.close(fig)


class OutputFile:
    """``--output FILE`` written through a temporary file in the same folder and renamed at the end,
    so a failed run leaves an earlier FILE as it was; standard output otherwise."""

    def __init__(self, path: Optional[str]):
        self.file = None
        if not path:
            self.stream = sys.stdout
            return
        if Path(path).is_dir():
            raise UsageError(f"--output {path} is a folder, not a file")
        from common.files import AtomicFile

        try:
            self.file = AtomicFile(Path(path))
        except OSError as error:
            raise UsageError(f"cannot write --output {path}: {error.strerror}") from None
        self.stream = self.file.stream

    def write_lines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.stream.write(line + "\n")

    def commit(self) -> None:
        self.stream.flush()
        if self.file is not None:
            self.file.commit()

    def discard(self) -> None:
        if self.file is not None:
            self.file.discard()


def interactive(translator: "Translator", out: OutputFile, args: argparse.Namespace) -> None:
    """A prompt on the terminal: each line entered is translated at once; Ctrl-D ends."""
    print("Type a sentence and press Enter to translate it; Ctrl-D ends.", file=sys.stderr)
    index = 0
    while True:
        print("> ", end="", file=sys.stderr, flush=True)  # the prompt is not part of the output
        line = sys.stdin.readline()
        if not line:  # Ctrl-D
            print(file=sys.stderr)
            return
        line = line.rstrip("\r\n")
        results = translator.translate([line], first_line=index + 1, **translate_options(args))
        out.write_lines(format_lines(index, line, results[0], args.nbest is not None, args.alignments))
        out.stream.flush()
        if args.plot:
            write_plots(Path(args.plot), results, index)
        index += 1


def translate_all(translator: "Translator", out: OutputFile, args: argparse.Namespace) -> None:
    """Every input line (the arguments, the input file or piped standard input) into ``out``."""
    lines = read_input(args)
    results = translator.translate(lines, **translate_options(args))
    for index, (line, result) in enumerate(zip(lines, results)):
        out.write_lines(format_lines(index, line, result, args.nbest is not None, args.alignments))
    if args.plot:
        write_plots(Path(args.plot), results)


def run(args: argparse.Namespace) -> None:
    out = OutputFile(args.output)
    try:
        with show_warnings():
            translator = load_translator(args)
            if not args.sentences and not args.input and sys.stdin.isatty():
                interactive(translator, out, args)
            else:
                translate_all(translator, out, args)
        out.commit()
    finally:
        out.discard()


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_args(args)
        from common.checkpoint import CheckpointError
        from inference.ctranslate2_export import ExportError

        try:
            run(args)
        except (CheckpointError, ExportError) as error:
            raise UsageError(str(error)) from None
    except (UsageError, DataError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. piped into `head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
