"""Translate with a trained checkpoint: ``python translate.py --checkpoint PATH [SENTENCE ...]``.

Sentences come from the arguments, ``--input FILE`` or standard input (one a line); translations
go to standard output or ``--output FILE``, one a line in the input order (an empty line gives an
empty line). On a terminal with no sentences given, it prompts and translates line by line.
Within the tool, sentences are sorted by length and decoded ``--batch-size`` at a time.

- ``--beam N`` (default 5; 1 is greedy) with the GNMT length penalty ``--alpha`` (default: the
  run's ``trainer.length_penalty``, else 1.0).
- ``--nbest N``: ``N`` lines ``index ||| hypothesis ||| score`` per sentence (index from 0, score the
  length-normalised log-probability), best first.
- ``--alignments``: a tab, then Pharaoh word alignments ``i-j`` (source word ``i``, output word
  ``j``, from 0) after each translation, from the model's cross-attention over its own output fed
  back teacher-forced (``inference/forced_alignment.py``), summed into words
  (``inference/alignment.py``). ``--plot DIR``: one PNG heatmap of it per sentence.
  ``--align-layer N|all``, ``--align-heads N[,N]|all`` and ``--align-reading predict|read`` choose
  the maps (``inference/align_method.py``; without them each family's measured default).
- ``--checkpoint A.pt --checkpoint B.pt``: an ensemble (``models/ensemble.py``: the mean of the
  models' log-probabilities, each model with its own decoder state) of models that share their
  SentencePiece model, else one ``error:`` line; ``--alpha`` defaults to the runs' mean.
- ``--engine ctranslate2 --checkpoint EXPORT_DIR``: decode with CTranslate2 over a folder of
  ``scripts/export_ctranslate2.py``, with the same options and outputs but for ensembles and
  ``--dtype`` (``inference/ctranslate2_engine.py``). ``--threads N``: the CPU threads of either engine.

Bad input (missing or foreign checkpoint, bad option, unreadable file) prints one ``error:`` line
on standard error and exits with 1 (2 for a bad command line). Torch and the models are imported
only after the command line has been checked, so mistakes are reported at once.

A thin command line over ``inference.translator.Translator`` (the Python API) and
``inference/command_line.py`` (model paths, input, output file, plots, warnings): this file parses
and checks the arguments, runs the loop and turns errors into exit codes.
"""

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence

# None of these imports torch: the command line is checked before torch and the models load.
from data.errors import DataError
from inference.align_method import READINGS, Method, parse_method
from inference.command_line import Output, UsageError, check_model_path, read_input, show_warnings
from inference.ctranslate2_export import ExportError
from models.search_options import MAX_LEN_EXTRA, MAX_LEN_RATIO, SearchOptionError, SearchOptions

if TYPE_CHECKING:  # imported for real once the command line is checked (they need torch)
    from inference.translator import Translator

# The names of models/search_options.py's options on this command line.
OPTION_FLAGS = {
    "beam_size": "--beam",
    "nbest": "--nbest",
    "alpha": "--alpha",
    "max_len_ratio": "--max-len-ratio",
}


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
    add(
        "--batch-size",
        type=int,
        default=None,
        help="sentences decoded together (default: 64 on the CPU, 1024 on a GPU)",
    )
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
    add("--align-layer", metavar="N|all", help="alignments from this decoder layer (all: their mean)")
    add("--align-heads", metavar="N[,N]|all", help="... from these heads (all: their mean)")
    add(
        "--align-reading",
        choices=READINGS,
        help="... at the step that predicts a word or the one that reads it",
    )
    return parser


def check_args(args: argparse.Namespace) -> None:
    """Range and consistency checks that need no heavy import; raises ``UsageError``."""
    try:
        SearchOptions(
            beam_size=args.beam,
            alpha=args.alpha or 0.0,  # None: the run's, which the Translator checks once it is loaded
            nbest=args.nbest or 1,
            max_len_ratio=args.max_len_ratio,
            max_len_extra=args.max_len_extra,
        )
    except SearchOptionError as error:
        raise UsageError(f"{OPTION_FLAGS[error.name]} {error.value}: {error.problem}") from None
    if args.batch_size is not None and args.batch_size < 1:
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
    method = align_method(args)  # checked here, before torch loads
    if method is not None and not (args.alignments or args.plot):
        raise UsageError(
            "--align-layer/--align-heads/--align-reading choose the maps of --alignments or --plot: give one"
        )
    if args.engine == "ctranslate2" and method is not None:
        raise UsageError(
            "--align-layer/--align-heads/--align-reading choose among our engine's maps: use --engine torch "
            "(a CTranslate2 export gives its alignment layer only)"
        )
    if args.input and not Path(args.input).is_file():
        raise UsageError(f"input file {args.input} does not exist")


def align_method(args: argparse.Namespace) -> Optional[Method]:
    """The ``--align-*`` choice (a flag left out: all layers, all heads, predict), or None when none
    is given (each family's default method)."""
    if args.align_layer is None and args.align_heads is None and args.align_reading is None:
        return None
    try:
        return parse_method(
            args.align_layer or "all", args.align_heads or "all", args.align_reading or "predict"
        )
    except ValueError as error:
        raise UsageError(str(error)) from None


def translate_options(args: argparse.Namespace) -> Dict[str, Any]:
    """The keyword arguments of ``Translator.translate`` the command line sets."""
    return dict(
        beam=args.beam,
        alpha=args.alpha,
        nbest=args.nbest or 1,
        batch_size=args.batch_size,
        alignments=bool(args.alignments or args.plot),  # plots need the word attention too
        align_method=align_method(args),
        max_len_ratio=args.max_len_ratio,
        max_len_extra=args.max_len_extra,
    )


def interactive(translator: "Translator", out: Output, args: argparse.Namespace) -> None:
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
        out.write(index, [line], results)
        index += 1


def translate_all(translator: "Translator", out: Output, args: argparse.Namespace) -> None:
    """Every input line (the arguments, the input file or piped standard input) into ``out``."""
    lines = read_input(args.sentences, args.input)
    out.write(0, lines, translator.translate(lines, **translate_options(args)))


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_args(args)
        # The one deferred import: torch and the models load only once the command line is known to be good.
        from common.checkpoint import CheckpointError
        from inference.engines import translator_for

        try:
            with (
                Output(args.output, args.nbest is not None, args.alignments, args.plot) as out,
                show_warnings(),
            ):
                translator = translator_for(
                    args.engine, args.checkpoint, args.device, args.dtype, args.threads
                )
                if args.alignments or args.plot:
                    translator.check_alignment(align_method(args))  # before the first line, also at a prompt
                if not args.sentences and not args.input and sys.stdin.isatty():
                    interactive(translator, out, args)
                else:
                    translate_all(translator, out, args)
        except CheckpointError as error:
            raise UsageError(str(error)) from None
    except (UsageError, DataError, ValueError, ExportError) as error:
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
