"""The translator of ``translate.py --engine``, by the engine's name: ``torch`` decodes checkpoints
with this project's search (``inference/translator.py``), ``ctranslate2`` an export folder
(``inference/ctranslate2_engine.py``, which alone needs the ctranslate2 library)."""

from pathlib import Path
from typing import Optional, Sequence, Union

from common.device import pick_device, set_threads
from inference.translator import Translator

ENGINES = ("torch", "ctranslate2")


def translator_for(
    engine: str,
    paths: Sequence[Union[str, Path]],
    device: str = "auto",
    dtype: Optional[str] = None,
    threads: int = 0,
) -> Translator:
    """``torch``: the checkpoints ``paths`` (``Translator.from_checkpoints``, an ensemble for
    several); ``ctranslate2``: the export folder ``paths[0]`` (``load_translator``, which takes no
    ``dtype``). ``threads``: the CPU threads of the engine (0: its default)."""
    if engine == "ctranslate2":
        # imported here: only this engine needs the ctranslate2 library
        from inference.ctranslate2_engine import load_translator

        return load_translator(paths[0], device, threads)
    if engine != "torch":
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if threads:
        set_threads(pick_device(device), threads)
    return Translator.from_checkpoints(paths, device, dtype)
