"""Each model family learns: trained for real on a slice of Multi30k, it translates that slice.

A model that can fit a couple of hundred training pairs (memorise them) scores far above 80 BLEU
on them with greedy decoding, while a model that learnt nothing scores near 0 and one that
learnt only frequent words or the length scores under 30: so 80 separates "the loss, the
gradients, the attention and decoding all work together" from "something is broken".
"""

import pytest

from data.corpus import TRAIN
from inference.decoding import translate_split
from training.metrics import corpus_scores

FAMILIES = ["rnn", "transformer"]


@pytest.mark.parametrize("family", FAMILIES)
def test_model_family_fits_a_slice_of_multi30k(family, trained_slice_models):
    """(The training itself is the ``trained_slice_models`` fixture in conftest.py: 300 steps on 200 pairs.)"""
    trainer, _, seconds = trained_slice_models[family]
    train = trainer.data.datasets[TRAIN]
    references = trainer.data.tokenizer.decode_tgt(train.tgt)  # the (normalised) training targets
    hypotheses = translate_split(trainer.model, train, trainer.data.tokenizer, 4000, trainer.device)
    bleu = corpus_scores(hypotheses, references)["bleu"]
    print(
        f"{family}: {trainer.progress.step} steps, {seconds:.0f} s, BLEU {bleu:.1f} on {len(train)} training pairs"
    )
    assert trainer.progress.step == 300
    assert bleu > 80.0, f"{family} reached only {bleu:.1f} BLEU on its own training pairs"
