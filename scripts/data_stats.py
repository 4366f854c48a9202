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
from typing import Dict

ROOT = Path(__file__).resolve().parent.parent


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
    import torch
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from data.batching import TokenBucketSampler
    from data.config import data_config
    from data.corpus import TRAIN
    from data.errors import DataError
    from data.pipeline import batch_stats, format_stats, prepare_data
    from training import distributed
    from training.config import register_configs

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    register_configs()  # the schemas that conf/config.yaml and conf/model/*.yaml extend
    world = distributed.world_from_env()  # under torchrun: every rank prepares, rank 0 first
    distributed.init(world, torch.device("cpu"))
    before = memory_mib()
    try:
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            cfg = compose("config", overrides=args.overrides)
        start = time.perf_counter()
        with distributed.main_first(world):
            data = prepare_data(data_config(cfg.data))
        sampler_start = time.perf_counter()
        train = data.datasets[TRAIN]
        sampler = TokenBucketSampler(
            train.src_lengths(),
            train.tgt_lengths(),
            args.batch_tokens,
            seed=cfg.seed,
            multiple=cfg.data.pad_multiple,
        )
        data.stats["batches"] = batch_stats(sampler)
        data.stats["seconds"]["sampler epoch"] = time.perf_counter() - sampler_start
        data.stats["seconds"]["ready"] = time.perf_counter() - start
    except (HydraException, OmegaConfBaseException, DataError, ValueError) as error:
        print(f"error: {one_line(error)}", file=sys.stderr)
        return 1
    if world.main:
        print(format_stats(data.stats))
    print(memory_line(world, before, memory_mib()), flush=True)
    distributed.close()
    return 0


def memory_mib() -> Dict[str, float]:
    """This process's memory now, in MiB, from ``/proc/self/smaps_rollup`` (Linux): ``Rss``, and
    ``Anonymous`` (its own heap, which no other process shares; the rest of ``Rss`` is pages of
    files, such as the token store's memory maps, shared with every process that maps them)."""
    try:
        lines = Path("/proc/self/smaps_rollup").read_text().splitlines()
    except OSError:
        return {}
    fields = {line.split(":")[0]: line.split()[1] for line in lines if line.endswith("kB")}
    return {name: int(fields[name]) / 1024 for name in ("Rss", "Anonymous") if name in fields}


def memory_line(world, before: Dict[str, float], after: Dict[str, float]) -> str:
    """Peak resident memory (``ru_maxrss``, KiB on Linux; the largest encoding worker's too), and
    the private memory that the data added."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
    line = f"  peak memory: {peak:.2f} GiB" + (
        f" (largest encoding worker {workers:.2f} GiB)" if workers else ""
    )
    if before and after:
        line += (
            f"; private memory added by the data {after['Anonymous'] - before['Anonymous']:.0f} MiB, "
            f"file pages mapped {after['Rss'] - after['Anonymous']:.0f} MiB"
        )
    return (f"rank {world.rank}:" if world.distributed else "") + line


if __name__ == "__main__":
    sys.exit(main())
