"""Token embeddings, positions and the output layer (models/embeddings.py)."""

import math

import pytest
import torch

from models.embeddings import OutputLayer, PositionalEncoding, TokenEmbedding, sinusoidal_table

pytestmark = pytest.mark.usefixtures("seed")  # torch seeded before each test (conftest.py)


@pytest.mark.parametrize("dim", [8, 16])
def test_sinusoidal_table_follows_the_formula(dim):
    table = sinusoidal_table(50, dim)
    assert table.shape == (50, dim)
    for position in (0, 1, 7, 49):
        for i in range(dim // 2):
            angle = position / 10000 ** (2 * i / dim)
            assert table[position, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert table[position, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)


@pytest.mark.parametrize("kind", ["sinusoidal", "learned"])
def test_offset_positions_equal_a_slice_of_a_longer_pass(kind):
    positions = PositionalEncoding(16, kind, max_positions=32)
    x = torch.randn(2, 10, 16)
    full = positions(x)
    for offset in (0, 3, 9):
        torch.testing.assert_close(
            positions(x[:, offset : offset + 1], offset=offset), full[:, offset : offset + 1]
        )
    torch.testing.assert_close(positions(x[:, 4:], offset=4), full[:, 4:])


def test_positions_differ_between_steps():
    positions = PositionalEncoding(16)
    zeros = torch.zeros(1, 5, 16)
    out = positions(zeros)[0]
    assert all(not torch.allclose(out[i], out[j]) for i in range(5) for j in range(i + 1, 5))


def test_sinusoidal_positions_extend_beyond_the_table():
    positions = PositionalEncoding(16, "sinusoidal", max_positions=4)
    x = torch.zeros(1, 3, 16)
    torch.testing.assert_close(positions(x, offset=10)[0], sinusoidal_table(13, 16)[10:13])


def test_learned_positions_beyond_max_positions_raise():
    positions = PositionalEncoding(16, "learned", max_positions=8)
    positions(torch.zeros(1, 8, 16))
    with pytest.raises(ValueError, match="max_positions"):
        positions(torch.zeros(1, 9, 16))
    with pytest.raises(ValueError, match="max_positions"):
        positions(torch.zeros(1, 1, 16), offset=8)


def test_unknown_position_kind_raises():
    with pytest.raises(ValueError, match="positions"):
        PositionalEncoding(16, "rotary")


@pytest.mark.parametrize("scale", [False, True])
def test_token_embedding_pad_row_is_zero_and_scaling(scale):
    embedding = TokenEmbedding(20, 16, pad_id=0, scale=scale)
    assert (embedding.weight[0] == 0).all()
    ids = torch.tensor([[0, 5, 7]])
    out = embedding(ids)
    assert out.shape == (1, 3, 16)
    assert (out[0, 0] == 0).all()
    factor = math.sqrt(16) if scale else 1.0
    torch.testing.assert_close(out[0, 1:], embedding.weight[[5, 7]] * factor)


def test_pad_row_gets_no_gradient():
    embedding = TokenEmbedding(20, 16, pad_id=0, scale=True)
    embedding(torch.tensor([[0, 5, 0]])).sum().backward()
    assert (embedding.weight.grad[0] == 0).all()
    assert (embedding.weight.grad[5] != 0).any()


def test_tied_output_layer_shares_the_embedding_weight():
    embedding = TokenEmbedding(20, 16)
    output = OutputLayer(16, 20, tie_to=embedding)
    assert output.proj.weight is embedding.weight
    states = torch.randn(2, 3, 16)
    torch.testing.assert_close(output(states), states @ embedding.weight.T)


def test_output_layer_refuses_an_embedding_of_another_shape():
    with pytest.raises(ValueError, match="tie"):
        OutputLayer(16, 30, tie_to=TokenEmbedding(20, 16))
