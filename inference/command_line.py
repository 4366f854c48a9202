"""What ``translate.py`` reads and writes around the translator: its model paths checked, its input
lines, its output (``Output``: the lines of ``inference.translator.Translation.lines`` into standard
output or a file replaced only when complete, and attention plots) and its warnings on standard
error.

Imports no torch: ``translate.py`` checks its command line with it before it loads a model, so
mistakes are reported at once. A bad path, input or output is a ``UsageError``: one ``error:``
line.
"""

import logging
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, List, Optional

from common.files import AtomicFile
from data.corpus import decode_lines
from inference.ctranslate2_export import INFO_FILE

if TYPE_CHECKING:  # the result type only: importing the translator imports torch
    from inference.translator import Translation

# the loggers whose warnings a user of translate.py sees: over-long inputs, a device fallen back to the CPU
WARNING_LOGGERS = ("inference.translator", "common.device", "inference.ctranslate2_engine")


class UsageError(Exception):
    """A bad command line or input: reported as one ``error:`` line."""


def check_model_path(path: Path, engine: str) -> None:
    """A checkpoint file for the torch engine (``inference/translator.py`` loads it), an export
    folder for CTranslate2 (``inference/ctranslate2_export.py``); ``UsageError`` else."""
    if not path.exists():
        raise UsageError(f"checkpoint {path} does not exist")
    if engine == "torch" and path.is_dir():
        hint = (
            "a CTranslate2 export: add --engine ctranslate2" if (path / INFO_FILE).is_file() else "a folder"
        )
        raise UsageError(f"checkpoint {path} is {hint} (the torch engine takes a .pt file)")
    if engine == "ctranslate2" and not path.is_dir():
        raise UsageError(
            f"--engine ctranslate2 takes an export folder, not {path}: make one with "
            f"python scripts/export_ctranslate2.py {path} OUT_DIR"
        )


def read_input(sentences: List[str], input_file: Optional[str]) -> List[str]:
    """The sentences to translate: ``sentences`` (the arguments), else the lines of ``input_file``, else
    of standard input."""
    if sentences:
        return list(sentences)
    if not input_file:
        return decode_lines(sys.stdin.buffer.read(), "standard input")
    try:
        raw = Path(input_file).read_bytes()
    except OSError as error:
        raise UsageError(f"cannot read input file {input_file}: {error.strerror}") from None
    return decode_lines(raw, f"input file {input_file}")


class Output:
    """Where and how ``translate.py`` writes its translations: their lines (``Translation.lines``:
    the text, or n-best lines, with alignments when asked) into ``--output FILE`` or standard output,
    and with ``plot`` one attention heatmap per sentence into that folder.

    FILE is written through a temporary file in the same folder and renamed at the end, so a failed
    run leaves an earlier FILE as it was. As a context manager it commits on success and discards on
    an exception."""

    def __init__(
        self, path: Optional[str], nbest: bool = False, alignments: bool = False, plot: Optional[str] = None
    ):
        self.nbest, self.alignments = nbest, alignments
        self.plot = Path(plot) if plot else None
        self.file = None
        if not path:
            self.stream = sys.stdout
            return
        if Path(path).is_dir():
            raise UsageError(f"--output {path} is a folder, not a file")
        try:
            self.file = AtomicFile(Path(path))
        except OSError as error:
            raise UsageError(f"cannot write --output {path}: {error.strerror}") from None
        self.stream = self.file.stream

    def write(self, first_index: int, sources: List[str], results: List["Translation"]) -> None:
        """The lines of ``results``, the translations of the input lines ``first_index`` on, at once
        (flushed), then their plots."""
        for index, (source, result) in enumerate(zip(sources, results), first_index):
            for line in result.lines(index, source, self.nbest, self.alignments):
                self.stream.write(line + "\n")
        self.stream.flush()
        if self.plot is not None:
            write_plots(self.plot, results, first_index)

    def commit(self) -> None:
        self.stream.flush()
        if self.file is not None:
            self.file.commit()

    def discard(self) -> None:
        if self.file is not None:
            self.file.discard()

    def __enter__(self) -> "Output":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.commit()
        else:
            self.discard()


def write_plots(folder: Path, results: List["Translation"], first_index: int = 0) -> None:
    """One heatmap per sentence: ``<index>.png``, output words by source words, the best hypothesis."""
    # matplotlib only with --plot (it is slow to import), and not before the command line is checked
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


@contextmanager
def show_warnings() -> Iterator[None]:
    """While inside, the warnings of ``WARNING_LOGGERS`` are ``warning: ...`` lines on standard
    error and go nowhere else; the loggers are as they were afterwards, so ``translate.main`` leaves
    no trace in a process that calls it."""
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
