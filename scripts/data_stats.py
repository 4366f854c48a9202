"""Prepare a data set as training would and print its stats block with timings.

    python scripts/data_stats.py data.root=../data/multi30k               # Multi30k de-en
    python scripts/data_stats.py data.root=DIR data.src=fr data.tgt=en --batch-tokens 8192

Arguments other than --batch-tokens are Hydra overrides of conf/config.yaml (``seed=N`` seeds the
batch order as in training). A bad override or data set is one ``error:`` line (exit 1).
"""
import argparse
import logging
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from data.batching import TokenBucketSampler  # noqa: E402
from data.config import data_config  # noqa: E402
from data.corpus import TRAIN  # noqa: E402
from data.errors import DataError  # noqa: E402
from data.pipeline import batch_stats, format_stats, prepare_data  # noqa: E402
from training.config import register_configs  # noqa: E402

CONF_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf")


def one_line(error: BaseException) -> str:
    """The error and its cause (Hydra wraps OmegaConf's error, which names the key) on one line."""
    parts = [str(error)] + ([str(error.__cause__)] if error.__cause__ and str(error.__cause__) not in str(error) else [])
    return " ".join(" ".join(parts).split())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. data.root=DIR data.src=fr")
    args = parser.parse_args()
    if args.batch_tokens < 1:
        parser.error("--batch-tokens must be at least 1")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    register_configs()  # the schemas conf/config.yaml and conf/model/*.yaml extend
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose("config", overrides=args.overrides)
        data = prepare_data(data_config(cfg.data))
        start = time.perf_counter()
        train = data.datasets[TRAIN]
        sampler = TokenBucketSampler(train.src_lengths(), train.tgt_lengths(), args.batch_tokens, seed=cfg.seed)
        data.stats["batches"] = batch_stats(sampler)
        data.stats["seconds"]["batches"] = time.perf_counter() - start
    except (HydraException, OmegaConfBaseException, DataError, ValueError) as error:
        print(f"error: {one_line(error)}", file=sys.stderr)
        return 1
    print(format_stats(data.stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
