"""A config as settings: nested dicts flattened to dotted keys, the keys that are not settings,
and the check of a node's keys against its schema. Standard library only (OmegaConf is imported
where a check raises its error type)."""

import dataclasses
from typing import Any, Dict, Mapping

# Where the data, the caches and the checkpoint to continue from lie: not what a run computes.
# Left out of the settings that decide the batches (resume checks), of the groups of
# scripts/compare.py and of the sweep folders' names (conf/config.yaml, through the resolver
# registered in training/config.py).
NOT_SETTINGS = ("data.root", "data.cache_dir", "trainer.resume")


def flatten(tree: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    """``{"trainer": {"lr": 1e-3}}`` as ``{"trainer.lr": 1e-3}`` (values other than mappings as they are)."""
    flat: Dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def check_keys(node: Mapping[str, Any], schema: type, prefix: str) -> None:
    """Refuse keys the dataclass ``schema`` does not have (Hydra lets a forced ``+key=`` through)."""
    from omegaconf.errors import ConfigKeyError

    known = {f.name for f in dataclasses.fields(schema)}
    unknown = sorted(set(node.keys()) - known)
    if unknown:
        raise ConfigKeyError(
            f"unknown config key {prefix}.{unknown[0]}: the keys of {prefix} are {', '.join(sorted(known))}"
        )
