"""Prepare a data set as training would and print its stats block with timings.

    python scripts/data_stats.py data.root=../data/multi30k               # Multi30k de-en
    python scripts/data_stats.py data.root=DIR data.src=fr data.tgt=en --batch-tokens 8192

Arguments other than --batch-tokens are Hydra overrides of conf/config.yaml (``seed=N`` seeds the
batch order as in training). The block ends with the token store's size, the time of each step
(``store`` alone when the store was there already: nothing was read or encoded), the sampler's
epoch, the time until training could start, and the process's peak memory (resident set, as
``ru_maxrss``). A bad override or data set is one ``error:`` line (exit 1).
"""

import argparse
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def one_line(error: BaseException) -> str:
    """The error and its cause (Hydra wraps OmegaConf's error, which names the key) on one line."""
    cause = error.__cause__
    parts = [str(error)] + ([str(cause)] if cause is not None and str(cause) not in str(error) else [])
    return " ".join(" ".join(parts).split())


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch-tokens", type=int, default=4096, help="tokens per batch (default 4096)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. data.root=DIR data.src=fr")
    args = parser.parse_intermixed_args(argv)  # overrides before and after --batch-tokens N
    if args.batch_tokens < 1:
        parser.error("--batch-tokens must be at least 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)  # before the imports below (torch): --help and mistakes answer at once
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from data.batching import TokenBucketSampler
    from data.config import data_config
    from data.corpus import TRAIN
    from data.errors import DataError
    from data.pipeline import batch_stats, format_stats, prepare_data
    from training.config import register_configs

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    register_configs()  # the schemas that conf/config.yaml and conf/model/*.yaml extend
    try:
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            cfg = compose("config", overrides=args.overrides)
        start = time.perf_counter()
        data = prepare_data(data_config(cfg.data))
        sampler_start = time.perf_counter()
        train = data.datasets[TRAIN]
        sampler = TokenBucketSampler(
            train.src_lengths(), train.tgt_lengths(), args.batch_tokens, seed=cfg.seed
        )
        data.stats["batches"] = batch_stats(sampler)
        data.stats["seconds"]["sampler epoch"] = time.perf_counter() - sampler_start
        data.stats["seconds"]["ready"] = time.perf_counter() - start
    except (HydraException, OmegaConfBaseException, DataError, ValueError) as error:
        print(f"error: {one_line(error)}", file=sys.stderr)
        return 1
    print(format_stats(data.stats))
    print(f"  peak memory: {peak_memory_gib():.2f} GiB")
    return 0


def peak_memory_gib() -> float:
    """This process's peak resident set size (Linux reports ``ru_maxrss`` in KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


if __name__ == "__main__":
    sys.exit(main())
