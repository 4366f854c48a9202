"""One source for each default: the dataclass schemas (``TrainerConfig``, ``RNNConfig``,
``TransformerConfig``, ``DataConfig``) hold the default recipe's values, and each file of
conf/trainer, conf/model and conf/data sets only what differs from what it extends (its schema, or
the option its defaults list names). A value written in both places agrees today and drifts
tomorrow: these tests fail as soon as one is."""

import copy
import dataclasses
import re
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from data.config import DataConfig, data_config
from models.config import TransformerConfig
from training.config import Config, TrainerConfig, model_config, register_configs, trainer_config

from helpers import ROOT, compose

CONF = ROOT / "conf"
GROUPS = ("trainer", "model", "data")
ABSENT = object()  # value_at of a path the tree does not have
REQUIRED = "???"  # OmegaConf's MISSING: a value the user must give, not a default that could drift


def options(group: str) -> List[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


FILES = [(group, name) for group in GROUPS for name in options(group)]
IDS = [f"{group}/{name}" for group, name in FILES]


def own_values(group: str, name: str) -> Dict[str, Any]:
    """What ``conf/<group>/<name>.yaml`` itself sets (its defaults list left out)."""
    values = OmegaConf.to_container(OmegaConf.load(CONF / group / f"{name}.yaml"), resolve=False)
    values.pop("defaults", None)
    return values


def extends(group: str, name: str) -> Optional[str]:
    """The one schema or option the file's defaults list puts under it (None: no defaults list)."""
    entries = OmegaConf.load(CONF / group / f"{name}.yaml").get("defaults", [])
    parents = [entry for entry in entries if entry != "_self_"]
    assert len(parents) <= 1, f"conf/{group}/{name}.yaml extends more than one config: {parents}"
    return parents[0] if parents else None


def schema_node(group: str, name: str) -> Optional[DictConfig]:
    """The schema (a ConfigStore node) the file's defaults list names, if it names one."""
    register_configs()
    parent, store = extends(group, name), ConfigStore.instance()
    if parent is not None and f"{parent}.yaml" in store.list(group):
        return store.load(f"{group}/{parent}.yaml").node
    return None


def base(group: str, name: str) -> DictConfig:
    """What the file's own values are merged over: the schema it names, the option it extends
    (composed), or, without a defaults list, the root ``Config``'s type for the group."""
    parent, schema = extends(group, name), schema_node(group, name)
    if schema is not None:
        return schema
    if parent is not None:
        return compose([f"{group}={parent}"])[group]
    return OmegaConf.structured({f.name: f.type for f in dataclasses.fields(Config)}[group])


def leaves(tree: Dict[str, Any], path: Tuple[str, ...] = ()) -> Iterator[Tuple[Tuple[str, ...], Any]]:
    """(path, value) of every value in a nested dict; a list or an empty dict is one value."""
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            yield from leaves(value, (*path, key))
        else:
            yield (*path, key), value


def without(tree: Dict[str, Any], path: Tuple[str, ...]) -> Dict[str, Any]:
    tree = copy.deepcopy(tree)
    node = tree
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return tree


def value_at(tree: Any, path: Tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return ABSENT
        tree = tree[key]
    return tree


def repeated_keys(group: str, name: str) -> List[str]:
    """The keys the file sets to the value the config would have without them."""
    own, start = own_values(group, name), base(group, name)
    repeated = []
    for path, value in leaves(own):
        if value == REQUIRED:
            continue
        rest = OmegaConf.to_container(OmegaConf.merge(start, without(own, path)), resolve=False)
        if value_at(rest, path) == value:
            repeated.append(".".join(path))
    return repeated


@pytest.mark.parametrize("group, name", FILES, ids=IDS)
def test_a_yaml_sets_only_what_differs_from_what_it_extends(group, name):
    repeated = repeated_keys(group, name)
    assert not repeated, (
        f"conf/{group}/{name}.yaml repeats the value it would get anyway ({extends(group, name) or 'its schema'}): "
        f"{', '.join(repeated)}; drop the line (a default lives in its dataclass only)"
    )


@pytest.mark.parametrize("group, name", FILES, ids=IDS)
def test_a_yaml_sets_only_keys_of_its_schema(group, name):
    start = base(group, name)
    schema = OmegaConf.get_type(start)
    unknown = sorted(set(own_values(group, name)) - {f.name for f in dataclasses.fields(schema)})
    assert not unknown, f"conf/{group}/{name}.yaml sets keys {schema.__name__} lacks: {', '.join(unknown)}"
    OmegaConf.merge(start, own_values(group, name))  # a nested unknown key raises, naming it


EMPTY = [(group, name) for group, name in FILES if not own_values(group, name) and schema_node(group, name)]


@pytest.mark.parametrize("group, name", EMPTY, ids=[f"{group}/{name}" for group, name in EMPTY])
def test_a_yaml_that_sets_nothing_composes_to_its_schemas_defaults(group, name):
    schema = OmegaConf.get_type(schema_node(group, name))
    assert OmegaConf.to_object(compose([f"{group}={name}"])[group]) == schema()


# Files that set nothing over another option: a name of their own for it (trainer/tiny_rnn.yaml is
# the recipe of trainer/rnn.yaml, so that model=tiny_rnn finds a trainer: conf/config.yaml).
ALIASES = [
    (group, name)
    for group, name in FILES
    if not own_values(group, name) and extends(group, name) and not schema_node(group, name)
]


@pytest.mark.parametrize("group, name", ALIASES, ids=[f"{group}/{name}" for group, name in ALIASES])
def test_a_yaml_that_sets_nothing_composes_to_the_option_it_extends(group, name):
    assert compose([f"{group}={name}"])[group] == compose([f"{group}={extends(group, name)}"])[group]


@pytest.mark.parametrize("name", options("model"))
def test_every_model_option_has_a_trainer_of_its_name(name):
    """conf/config.yaml picks ``trainer: ${model}``: a model option without a trainer of the same
    name composes only with ``trainer=NAME`` given."""
    assert name in options("trainer")


def test_the_default_recipe_is_the_dataclasses_defaults():
    """``python train.py`` trains with ``TrainerConfig()`` and ``TransformerConfig()`` and reads
    ``DataConfig()``'s data set: their YAML files set nothing but the data set's hub."""
    cfg = compose([], hydra_config=True)
    choices = cfg.hydra.runtime.choices
    assert own_values("trainer", choices.trainer) == {}
    assert own_values("model", choices.model) == {}
    assert trainer_config(cfg.trainer) == TrainerConfig()
    assert model_config(cfg.model) == TransformerConfig()
    # A default hub in DataConfig would merge into every other data set's hub (the entries of
    # hub.splits add up), so the default data set names its hub in its own file, and only that.
    assert set(own_values("data", choices.data)) == {"hub"}
    assert dataclasses.replace(data_config(cfg.data), hub=None) == DataConfig()


DIRECTED = [name for name in options("data") if re.fullmatch(r".+_[a-z]{2}_[a-z]{2}", name)]


@pytest.mark.parametrize("name", DIRECTED)
def test_a_data_set_named_for_a_direction_composes_to_it(name):
    """``data=wmt14_de_en`` leaves src and tgt to ``DataConfig``'s defaults: this holds it to its name
    if those defaults change."""
    data = compose([f"data={name}"]).data
    assert name.endswith(f"_{data.src}_{data.tgt}")
