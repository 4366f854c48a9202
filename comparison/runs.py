"""Which runs there are and how they group: finding the finished run folders below a PATH,
reading each one (``results.json``, ``.hydra/``) into a ``Run``, grouping runs that differ only
by their seed, and the runs' test splits and scores.
"""

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from common.settings import NOT_SETTINGS, flatten

RESULTS = "results.json"
REQUIRED = ("model", "params", "steps", "epochs", "train_seconds", "train_tokens_per_second", "valid", "test")
# Keys left out of groups and their labels: the shared NOT_SETTINGS (where data, caches and
# checkpoints lie) and, for comparisons only, the seed (runs that differ only by it form a group),
# the device and hydra.* overrides (where and how a run was launched). Elsewhere these are settings:
# a resume must repeat the seed, which decides the batches.
NOT_A_SETTING = (*NOT_SETTINGS, "seed", "device", "hydra.")


class CompareError(Exception):
    """Runs that cannot be compared; the message is one line for the user."""


@dataclass
class Run:
    path: Path
    name: str  # as shown in the tables
    results: Dict[str, Any]
    config: Optional[Dict[str, Any]] = None  # the run's .hydra/config.yaml, when there is one
    overrides: List[str] = field(default_factory=list)  # its .hydra/overrides.yaml

    @property
    def seed(self) -> Optional[int]:
        return (self.config or {}).get("seed")

    def settings(self) -> List[str]:
        """The overrides that make this configuration (not the seed, paths or the model group)."""
        return [
            o
            for o in self.overrides
            if not override_key(o).startswith(NOT_A_SETTING) and override_key(o) != "model"
        ]

    def model_name(self) -> str:
        """The model config (``model=transformer_base``), else the family in results.json."""
        chosen = [o.split("=", 1)[1] for o in self.overrides if override_key(o) == "model"]
        return chosen[-1] if chosen else self.results["model"]

    def group_key(self) -> str:
        if self.config is None:
            return str(self.path)  # nothing to compare with: a group of its own
        settings = {k: v for k, v in flatten(self.config).items() if not k.startswith(NOT_A_SETTING)}
        return json.dumps(settings, sort_keys=True, default=str)


def override_key(override: str) -> str:
    """The key an override sets (``+trainer.lr=3e-3`` -> ``trainer.lr``)."""
    return override.split("=", 1)[0].lstrip("+~")


def _job_order(path: Path) -> Tuple:
    """Hydra multirun subfolders are ``<job number>_<overrides>``: sort by the number, then by name."""
    head = path.name.split("_", 1)[0]
    return (int(head), path.name) if head.isdigit() else (math.inf, path.name)


def _sorted_runs(folders: Sequence[Path]) -> List[Path]:
    return sorted(folders, key=lambda p: [_job_order(Path(part)) for part in p.parts])


def find_runs(path: Path) -> List[Path]:
    """The finished run folders at or below ``path``, in job order."""
    if not path.exists():
        raise CompareError(f"{path} does not exist")
    if (path / RESULTS).is_file():
        return [path]
    if not path.is_dir():
        raise CompareError(f"{path} is not a run folder or a folder of runs")
    finished = _sorted_runs([p.parent for p in path.rglob(RESULTS)])
    if not finished:
        started = unfinished_runs(path)
        detail = (
            f" ({len(started)} run folder(s) without {RESULTS}: still training, interrupted or failed)"
            if started
            else ""
        )
        raise CompareError(
            f"{path} holds no finished run: no {RESULTS} below it{detail}; "
            "a run writes it when training and testing are done"
        )
    return finished


def unfinished_runs(path: Path) -> List[Path]:
    """Run folders below ``path`` that Hydra started (``.hydra/config.yaml``) and that wrote no results."""
    return [
        p.parent
        for p in path.rglob(".hydra")
        if (p / "config.yaml").is_file() and not (p.parent / RESULTS).is_file()
    ]


def read_run(folder: Path, name: str) -> Run:
    from omegaconf import OmegaConf

    path = folder / RESULTS
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CompareError(f"{path}: not a readable results file ({error})") from None
    missing = [key for key in REQUIRED if key not in results]
    if missing:
        raise CompareError(f"{path}: missing {', '.join(missing)}: not a results.json written by train.py")
    config, overrides = None, []
    hydra_dir = folder / ".hydra"
    if (hydra_dir / "config.yaml").is_file():
        config = OmegaConf.to_container(OmegaConf.load(hydra_dir / "config.yaml"), resolve=False)
    if (hydra_dir / "overrides.yaml").is_file():
        overrides = [str(o) for o in OmegaConf.to_container(OmegaConf.load(hydra_dir / "overrides.yaml"))]
    return Run(folder, name, results, config, overrides)


def collect_runs(paths: Sequence[Path]) -> List[Run]:
    """Every finished run under ``paths``, named relative to its PATH (with the PATH's own name in
    front when two PATHs hold runs of the same name, as two sweeps do)."""
    found, seen = [], set()
    for path in paths:
        for folder in find_runs(path):
            if folder.resolve() not in seen:
                seen.add(folder.resolve())
                found.append((path, folder))
        for folder in unfinished_runs(path) if path.is_dir() else []:
            print(
                f"warning: {folder} has no {RESULTS} (still training, interrupted or failed): left out",
                file=sys.stderr,
            )
    names = [folder.name if folder == path else str(folder.relative_to(path)) for path, folder in found]
    if len(set(names)) < len(names):
        names = [
            str(Path(path.resolve().name) / name)
            if folder != path
            else str(Path(folder.resolve().parent.name) / name)
            for (path, folder), name in zip(found, names)
        ]
    return [read_run(folder, name) for (_, folder), name in zip(found, names)]


def test_splits(runs: Sequence[Run]) -> List[str]:
    """Every test split of any run, in the order they first appear."""
    splits: List[str] = []
    for run in runs:
        splits += [s for s in run.results["test"] if s not in splits]
    return splits


def group_labels(groups: Sequence[List[Run]]) -> List[str]:
    """A name per group: its model and the settings that not every run shares."""
    common = set.intersection(*(set(run.settings()) for group in groups for run in group))
    return [" ".join([g[0].model_name(), *(o for o in g[0].settings() if o not in common)]) for g in groups]


def groups_of(runs: Sequence[Run]) -> List[List[Run]]:
    """Runs whose configs differ only by ``seed``, in the order of their first run."""
    groups: Dict[str, List[Run]] = {}
    for run in runs:
        groups.setdefault(run.group_key(), []).append(run)
    return list(groups.values())


def seed_pairs(base: Sequence[Run], other: Sequence[Run]) -> List[Tuple[Any, Run, Run]]:
    """``(seed, run of base, run of other)`` for every seed both groups have (a seed's first run), by seed."""
    firsts: Dict[Any, Run] = {}
    for run in other:
        firsts.setdefault(run.seed, run)
    pairs, seen = [], set()
    for run in base:
        if run.seed in firsts and run.seed not in seen:
            seen.add(run.seed)
            pairs.append((run.seed, run, firsts[run.seed]))
    return sorted(pairs, key=lambda pair: pair[0])


def score_of(run: Run, split: str, key: str) -> Optional[float]:
    """The run's ``key`` score (bleu, chrf) on test ``split``, None when it has none."""
    return run.results["test"].get(split, {}).get(key)


def valid_scores(runs: Sequence[Run], key: str) -> List[float]:
    """The validation ``key`` score (bleu, chrf) of each run that has one (a run stopped before its
    first evaluation has none)."""
    return [score for run in runs if (score := run.results["valid"].get(key)) is not None]


def seed_scores(runs: Sequence[Run], split: str, key: str) -> List[float]:
    """The ``key`` score on test ``split`` of each run that has one: a group's per-seed scores."""
    return [v for v in (score_of(run, split, key) for run in runs) if v is not None]
