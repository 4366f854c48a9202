import logging

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigKeyError, ValidationError

from data.batching import TokenBucketSampler
from data.config import data_config
from data.corpus import folder_splits
from data.errors import DataError
from data.pipeline import batch_stats, format_stats, prepare_data
from data.tokenizer import normalize

from helpers import ROOT, compose, read_all

CONF = ROOT / "conf"


@pytest.fixture(scope="module")
def prepared(multi30k_config, tmp_path_factory):
    cfg = multi30k_config(tmp_path_factory.mktemp("cache"), train_limit=3000, vocab_size=1000, max_len=20)
    return prepare_data(cfg)


def test_long_training_pairs_are_dropped_but_evaluation_splits_stay_whole(prepared, multi30k_dir):
    train = prepared.datasets["train"]
    assert prepared.stats["dropped_long"] > 0
    assert len(train) == 3000 - prepared.stats["dropped_long"] - prepared.stats["dropped_empty"]
    assert all(len(s) <= 20 and len(t) <= 20 for s, t in zip(train.src, train.tgt))
    raw = read_all(folder_splits(multi30k_dir, "de", "en"))
    for split in ("val", "test_2016_flickr"):
        assert prepared.sources[split] == [s for s, _ in raw[split]]
        assert prepared.references[split] == [t for _, t in raw[split]]
        decoded = prepared.tokenizer.decode_tgt(prepared.datasets[split].tgt)
        assert decoded == [normalize(t) for _, t in raw[split]]
    assert prepared.test_splits == ["test_2016_flickr"]


def test_stats_block_reports_splits_drops_vocabulary_and_padding(prepared):
    train = prepared.datasets["train"]
    sampler = TokenBucketSampler(train.src_lengths(), train.tgt_lengths(), 2000)
    prepared.stats["batches"] = batch_stats(sampler)
    block = format_stats(prepared.stats)
    assert "test_2016_flickr" in block and "1014 pairs" in block
    assert f"{prepared.stats['dropped_long']} too long" in block
    assert "vocabulary: 1000 (joint)" in block
    assert 0.0 < prepared.stats["batches"]["padding_ratio"] < 0.3


def test_empty_training_split_is_an_error(tmp_path):
    root = tmp_path / "d"
    root.mkdir()
    for lang in ("xx", "yy"):
        (root / f"train.{lang}").write_text("\n  \n\n")
        (root / f"val.{lang}").write_text("a\n")
    cfg = data_config({"root": str(root), "src": "xx", "tgt": "yy", "cache_dir": str(tmp_path / "c")})
    with pytest.raises(DataError, match="holds no non-empty pair"):
        prepare_data(cfg)


def hub_config(tmp_path, path, splits=None):
    hub = {"path": str(path), "field": "translation"}
    if splits:
        hub["splits"] = splits
    return data_config({"hub": hub, "cache_dir": str(tmp_path / "cache")})


def test_an_unreachable_hub_fails_before_a_build_is_announced(tmp_path, monkeypatch, caplog):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "https://hub.invalid")  # unreachable anywhere
    for name in ("HTTPS_PROXY", "https_proxy", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    with caplog.at_level(logging.INFO), pytest.raises(DataError, match="cannot reach the Hugging Face hub"):
        prepare_data(hub_config(tmp_path, "bentrevett/multi30k"))
    assert "building the token store" not in caplog.text
    assert not (tmp_path / "cache" / "store").exists()


def test_a_missing_hub_split_fails_before_a_build_is_announced(tmp_path, caplog):
    import datasets

    hub = tmp_path / "hub"  # a data set in a local folder: load_dataset reads it as from the hub
    hub.mkdir()
    records = {"translation": [{"de": f"Satz {i}", "en": f"sentence {i}"} for i in range(20)]}
    for split in ("train", "validation"):
        datasets.Dataset.from_dict(records).to_parquet(str(hub / f"{split}.parquet"))
    cfg = hub_config(tmp_path, hub, {"train": "train", "val": "validation", "test_x": "nope"})
    with caplog.at_level(logging.INFO), pytest.raises(DataError, match="could not load split 'nope'"):
        prepare_data(cfg)
    assert "loading split 'train'" in caplog.text and "building the token store" not in caplog.text


def compose_data(overrides):
    return compose(overrides)


@pytest.mark.parametrize("option", sorted(p.stem for p in (CONF / "data").glob("*.yaml")))
def test_every_data_config_composes_and_matches_the_schema(option):
    extra = [
        "data.files.train.src=a",
        "data.files.train.tgt=b",
        "data.files.val.src=c",
        "data.files.val.tgt=d",
    ]
    cfg = data_config(compose_data([f"data={option}"] + (extra if option == "files" else [])).data)
    assert cfg.name == option and cfg.vocab_size > 0
    assert cfg.hub is not None or cfg.files is not None


def test_typos_and_wrong_types_fail_when_composed():
    with pytest.raises(ConfigCompositionException, match="vocab_sise"):
        compose_data(["data.vocab_sise=10"])
    with pytest.raises(ConfigKeyError):  # a forced new key (+) gets past Hydra, not past the schema
        data_config(compose_data(["+data.vocab_sise=10"]).data)
    with pytest.raises(ConfigCompositionException, match="vocab_size"):
        compose_data(["data.vocab_size=many"])


def test_data_config_checks_a_plain_node_too():
    with pytest.raises(ConfigKeyError):
        data_config({"vocab_sise": 10})
    with pytest.raises(ValidationError):
        data_config({"vocab_size": "many"})
