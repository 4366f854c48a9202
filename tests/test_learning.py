"""Each model family learns: trained for real on a slice of Multi30k, it translates that slice.

A model that can fit a couple of hundred training pairs (memorise them) scores far above 80 BLEU
on them with greedy decoding, while a model that learnt nothing scores near 0 and one that
learnt only frequent words or the length scores under 30: so 80 separates "the loss, the
gradients, the attention and decoding all work together" from "something is broken".
"""
import time

import pytest

from data.corpus import TRAIN
from training.board import Board
from training.evaluate import translate_split
from training.metrics import corpus_scores
from training.trainer import Trainer

PAIRS = 200
FAMILIES = {
    "transformer": ["model=transformer", "model.d_model=128", "model.n_heads=4", "model.ff_size=256",
                    "model.encoder_layers=2", "model.decoder_layers=2", "model.dropout=0.0",
                    "trainer.lr=2e-3", "trainer.max_steps=300"],
    "rnn": ["model=rnn", "model.embed_dim=128", "model.hidden_size=128", "model.attention_size=128",
            "model.dropout=0.0", "trainer.lr=5e-3", "trainer.max_steps=300"],
}


def slice_trainer(family, multi30k_slice, compose_config, tmp_path) -> Trainer:
    overrides = [
        f"data.root={multi30k_slice}", f"data.cache_dir={tmp_path / 'cache'}", f"data.train_limit={PAIRS}",
        "data.vocab_size=600", "trainer.batch_tokens=2000", "trainer.schedule=constant", "trainer.warmup_steps=20",
        "trainer.label_smoothing=0.0", "trainer.eval_every=1000000", "trainer.log_every=1000000", "trainer.patience=null",
        "trainer.max_epochs=null", *FAMILIES[family],
    ]
    trainer = Trainer(compose_config(overrides), tmp_path)
    trainer.board = Board(tmp_path / "tb")
    return trainer


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_model_family_fits_a_slice_of_multi30k(family, multi30k_slice, compose_config, tmp_path):
    trainer = slice_trainer(family, multi30k_slice, compose_config, tmp_path)
    start = time.perf_counter()
    while trainer.train_epoch(start) is None:
        pass
    trainer.board.close()
    train = trainer.data.datasets[TRAIN]
    references = trainer.data.tokenizer.decode_tgt(train.tgt)  # the (normalised) training targets
    hypotheses = translate_split(trainer.model, train, trainer.data.tokenizer, 4000, trainer.device)
    bleu = corpus_scores(hypotheses, references)["bleu"]
    print(f"{family}: {trainer.progress.step} steps, {time.perf_counter() - start:.0f} s, BLEU {bleu:.1f} on {len(train)} training pairs")
    assert bleu > 80.0, f"{family} reached only {bleu:.1f} BLEU on its own training pairs"
