"""Export a Transformer checkpoint to a CTranslate2 model folder that translates on its own.

The folder holds what the engine reads (``model.bin``, ``config.json``, the vocabularies as
``shared_vocabulary.json`` or ``source_``/``target_vocabulary.json``), the SentencePiece model(s)
(``sentencepiece.model``, or ``source.model`` and ``target.model``) and ``export.json``: what was
exported (checkpoint, step, model config, quantization) and what translating needs beside the
engine (the default length penalty, the longest input, whether the vocabulary is joint, the languages,
the alignment layer and heads).

The engine aligns by one layer's first heads (``export_method``): a checkpoint trained with guided
alignment keeps its supervised layer and heads; another one aligns by its last layer's mean of heads
(the mean over every layer that ``translate.py`` takes by default is not one the engine offers).

The folder is written under a temporary name beside ``OUT_DIR`` and renamed into place when
complete, so a failed export leaves nothing half-written, and an existing ``OUT_DIR`` is never
replaced.
"""

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

from alignment.method import Method
from common.files import AtomicFolder

INFO_FILE = "export.json"
FORMAT = 1
QUANTIZATIONS = ("int8", "int16", "float32")  # the weight types an export may store
JOINT_SPM, SOURCE_SPM, TARGET_SPM = "sentencepiece.model", "source.model", "target.model"
INFO_KEYS = ("joint_vocabulary", "max_positions", "length_penalty")  # what translating reads in export.json


class ExportError(Exception):
    """A checkpoint that cannot be exported or a folder that is not an export; the message says why."""


def export_problem(model_config: Dict[str, Any]) -> Optional[str]:
    """Why a model of ``model_config`` (a checkpoint's ``model_config``) cannot run in CTranslate2, or None.

    Every Transformer of ``models/transformer.py`` with scaled dot-product attention can (both
    norms, both position kinds, tied or not, joint or separate vocabularies); a config it could not
    build is refused by ``load_model``."""
    name = model_config.get("name")
    if name == "rnn":
        return "model rnn: CTranslate2 runs Transformers only, not RNN encoder-decoders (translate it with translate.py)"
    if name != "transformer":
        return f"model {name!r}: only a transformer can be exported"
    if model_config.get("attention", "scaled_dot") != "scaled_dot":
        return (
            f"model.attention={model_config['attention']}: CTranslate2's Transformer has scaled dot-product "
            "attention only (translate it with translate.py)"
        )
    if model_config.get("qk_norm"):
        return (
            "model.qk_norm=true: CTranslate2's attention scales by 1/sqrt(d_k), not a learned scale over "
            "normalised queries and keys (translate it with translate.py)"
        )
    return None


def export_method(payload: Dict[str, Any]) -> Method:
    """How an export of the checkpoint ``payload`` aligns: its supervised heads when it was trained with
    guided alignment, else its last layer's mean of heads; at the predicting step."""
    from inference.translator import checkpoint_method, trained_with_guidance

    if trained_with_guidance(payload):
        return checkpoint_method(payload)
    return Method(layer=int(payload["model_config"]["decoder_layers"]), reading="predict")


def info_method(info: Dict[str, Any]) -> Method:
    """The alignment method ``export.json`` records (an export without one: the last layer's mean of
    heads, predicting step)."""
    found = info.get("alignment") or {}
    layer = found.get("layer", int(info["model_config"]["decoder_layers"]))
    heads = found.get("heads")
    return Method(int(layer), None if heads is None else tuple(int(h) for h in heads), "predict")


def spm_files(joint: bool) -> List[str]:
    """The SentencePiece model files of an export: one for a joint vocabulary, else source and target."""
    return [JOINT_SPM] if joint else [SOURCE_SPM, TARGET_SPM]


def check_target(out_dir: Path) -> None:
    """Refuse an output folder that exists and is not empty, or whose parent is missing."""
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ExportError(f"{out_dir} already exists: give a new folder (an export never replaces one)")
    if not out_dir.parent.is_dir():
        raise ExportError(f"folder {out_dir.parent} does not exist: create it or give another OUT_DIR")


def export_info(
    payload: Dict[str, Any], checkpoint: Path, quantization: str, joint: bool, method: Method
) -> Dict[str, Any]:
    """The contents of ``export.json``."""
    import ctranslate2

    from inference.translator import default_alpha

    model_config = dict(payload["model_config"])
    data = (payload.get("config") or {}).get("data") or {}
    return {
        "format": FORMAT,
        "engine": f"ctranslate2 {ctranslate2.__version__}",
        "checkpoint": str(checkpoint),
        "step": (payload.get("progress") or {}).get("step"),
        "quantization": quantization,
        "model_config": model_config,
        "max_positions": int(model_config["max_positions"]),
        "length_penalty": default_alpha(payload),
        "joint_vocabulary": joint,
        "languages": {"src": data.get("src"), "tgt": data.get("tgt")},
        "alignment": {"layer": method.layer, "heads": None if method.heads is None else list(method.heads)},
    }


def write_folder(folder: Path, spec: Any, tokenizer: Any, info: Dict[str, Any]) -> None:
    """The engine's files, the SentencePiece model(s) and ``export.json`` into the new ``folder``."""
    spec.save(str(folder))
    models = [tokenizer.src_model] if tokenizer.joint else [tokenizer.src_model, tokenizer.tgt_model]
    for name, model in zip(spm_files(tokenizer.joint), models):
        (folder / name).write_bytes(model)
    (folder / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


def export_checkpoint(checkpoint: Path, out_dir: Path, quantization: str = "int8") -> Dict[str, Any]:
    """Export ``checkpoint`` (a Transformer of train.py) to the new folder ``out_dir``; returns its info.

    ``quantization``: the weight type stored (``int8``, ``int16`` or ``float32``); the engine may run
    a float32 export in int8 too (``compute_type``). Raises ``ExportError`` (and
    ``common.checkpoint.CheckpointError`` for an unreadable checkpoint) in one line.
    """
    if quantization not in QUANTIZATIONS:
        raise ExportError(f"quantization {quantization!r}: choose one of {', '.join(QUANTIZATIONS)}")
    check_target(out_dir)
    from common.checkpoint import load_checkpoint
    from inference.translator import model_of

    payload = load_checkpoint(checkpoint)
    problem = export_problem(dict(payload["model_config"]))
    if problem is not None:
        raise ExportError(f"{checkpoint} cannot be exported: {problem}")
    from inference.ctranslate2_spec import transformer_spec

    model, tokenizer, payload = model_of(payload, checkpoint)
    positions = model.positions.learned if model.cfg.positions == "learned" else model.positions.table
    src_vocab = tokenizer.src_pieces(range(tokenizer.src_vocab_size))
    tgt_vocab = tokenizer.tgt_pieces(range(tokenizer.tgt_vocab_size))
    method = export_method(payload)
    heads = model.cfg.n_heads if method.heads is None else len(method.heads)  # the first heads, from 1
    spec = transformer_spec(
        model.cfg,
        model.state_dict(),
        positions[: model.cfg.max_positions],
        src_vocab,
        tgt_vocab,
        (method.layer, heads),
    )
    try:
        spec.validate()
    except ValueError as error:  # a weight the spec does not take: a bug of the map, said in one line
        raise ExportError(f"{checkpoint}: CTranslate2 refuses the spec ({error})") from None
    spec.optimize(quantization=quantization)
    info = export_info(payload, checkpoint, quantization, tokenizer.joint, method)
    staging = AtomicFolder(out_dir)
    try:
        with staging as folder:  # replaces an empty out_dir only; one that filled meanwhile makes it fail
            write_folder(folder, spec, tokenizer, info)
    except OSError as error:
        raise ExportError(f"cannot write {out_dir}: {error.strerror or error}") from None
    return info


def read_export(folder: Path) -> Dict[str, Any]:
    """``export.json`` of an export folder, checked; ``ExportError`` naming what is missing."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ExportError(f"{folder} is not a folder: give the OUT_DIR of scripts/export_ctranslate2.py")
    path = folder / INFO_FILE
    if not path.is_file():
        raise ExportError(f"{folder} holds no {INFO_FILE}: not a folder of scripts/export_ctranslate2.py")
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ExportError(f"{path} cannot be read: {error}") from None
    found = info.get("format") if isinstance(info, dict) else None
    if found != FORMAT:
        raise ExportError(
            f"{path} has format {found!r}, this version reads {FORMAT}: export the checkpoint again"
        )
    keys = [key for key in INFO_KEYS if key not in info]
    if keys:
        raise ExportError(f"{path} lacks {', '.join(keys)}: export the checkpoint again")
    needed = ["model.bin", "config.json"] + spm_files(bool(info["joint_vocabulary"]))
    missing = [name for name in needed if not (folder / name).is_file()]
    if missing:
        raise ExportError(f"{folder} lacks {', '.join(missing)}: export the checkpoint again")
    return info
