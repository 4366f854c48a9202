"""RNN encoder-decoder with attention (Bahdanau et al. 2015): additive by default, or any of
``models/attention.py``'s functions (``model.attention``).

Encoder: a bidirectional GRU (or LSTM) over the source; its states ``h_j = [fwd_j; bwd_j]`` are
the keys and values of attention. A bridge ``tanh(W_b [fwd_final; bwd_final])`` gives the
decoder's initial state.

Decoder, at target step ``t`` (the paper's appendix A.2, with a tanh readout instead of maxout):

    c_t, a_t = Attention(query=s_{t-1}, keys=values=h)      context and weights over the source
    s_t      = RNN([E y_{t-1}; c_t], s_{t-1})                the context is fed into the step
    o_t      = Dropout(tanh(W_o [s_t; c_t; E y_{t-1}]))      readout from state, context, embedding
    logits_t = W_out o_t                                      W_out optionally tied to E

``Attention`` is ``model.attention``, one of ``models/attention.py``'s classes (each with its
formula): ``additive`` (Bahdanau's), ``general`` (Luong's bilinear score), ``scaled_dot`` (one
head) or ``multihead`` (``model.attention_heads`` heads, ``W_O`` back to ``2D``). The
query is the state before the step, ``s_{t-1}``, for every choice (Bahdanau's data flow, not
Luong's ``s_t``), so the choice changes the score and nothing else. What does not depend on the
query (the key projection, and the multi-head value projection) is computed once per sentence and
kept in the decoder state. Only the attention and the RNN cell run step by step; the readout and the output
layer run over all steps at once in a teacher-forced pass.

Shapes (the scheme of ``models/__init__.py``): ``D`` hidden size (the decoder state; the encoder
states are ``2D``, both directions), ``E`` embedding size, ``d_a`` attention size, ``L`` layers,
``H`` attention heads (1 but for ``multihead``).
"""

from typing import Dict, List, Tuple

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from models.attention import (
    AdditiveAttention,
    AttentionFunction,
    GeneralAttention,
    MultiHeadAttention,
    ScaledDotAttention,
    key_mask,
)
from models.config import RNNConfig
from models.dropout import Dropout
from models.embeddings import OutputLayer, TokenEmbedding
from models.seq2seq import Attention, Encoded

# cross_k (B, H, S, d_a), cross_v (B, H, S, .) the attention's projections of the encoder states,
# src_mask (B, S), hidden (B, L, D) [, cell (B, L, D) for an LSTM]
State = Dict[str, Tensor]


def make_rnn(
    cell: str, input_size: int, hidden_size: int, layers: int, dropout: float, bidirectional: bool
) -> nn.RNNBase:
    """A batch-first GRU or LSTM of ``layers`` layers, dropout between them (``cell``: checked by
    ``RNNConfig``)."""
    rnn_class = nn.GRU if cell == "gru" else nn.LSTM
    return rnn_class(
        input_size,
        hidden_size,
        layers,
        batch_first=True,
        dropout=dropout if layers > 1 else 0.0,
        bidirectional=bidirectional,
    )


def run_rnn(rnn: nn.RNNBase, inputs, hx=None):
    """Call ``rnn`` in float32 even under autocast: autocast runs cuDNN RNNs in float16 whatever
    dtype it was given (bfloat16 included), and an RNN's long recurrence loses precision there."""
    device_type = inputs.data.device.type  # a tensor's .data is itself; a PackedSequence's holds the values
    if not torch.is_autocast_enabled(device_type):
        return rnn(inputs, hx)
    with torch.autocast(device_type=device_type, enabled=False):
        return rnn(inputs, hx)


def cross_attention(cfg: RNNConfig) -> AttentionFunction:
    """The decoder's attention ``model.attention`` from its state (``D``) over the encoder states
    (``2D``); its context is ``2D`` whatever the choice."""
    query, memory, size = cfg.hidden_size, 2 * cfg.hidden_size, cfg.attention_size
    choices = {
        "additive": lambda: AdditiveAttention(query, memory, size),
        "general": lambda: GeneralAttention(query, memory, qk_norm=cfg.qk_norm),
        "scaled_dot": lambda: ScaledDotAttention(query, memory, size, qk_norm=cfg.qk_norm),
        "multihead": lambda: MultiHeadAttention(
            size, cfg.attention_heads, query_size=query, key_size=memory, out_size=memory, qk_norm=cfg.qk_norm
        ),
    }
    return choices[cfg.attention]()


class RNNEncoder(nn.Module):
    """Bidirectional GRU or LSTM over the embedded source."""

    def __init__(self, cfg: RNNConfig, embed: TokenEmbedding):
        super().__init__()
        self.embed = embed
        self.dropout = Dropout(cfg.dropout)
        self.rnn = make_rnn(
            cfg.cell, cfg.embed_dim, cfg.hidden_size, cfg.encoder_layers, cfg.dropout, bidirectional=True
        )

    def forward(self, src: Tensor, src_mask: Tensor) -> Tuple[Tensor, Tensor]:
        """``src`` ``(B, S)``, ``src_mask`` ``(B, S)`` -> states ``(B, S, 2D)`` (zero at padding) and the
        last layer's final states ``(B, 2D)`` (forward and backward)."""
        lengths = src_mask.sum(dim=1).clamp(min=1).cpu()  # (B,) an empty source still runs one step
        embedded = self.dropout(self.embed(src)).float()  # (B, S, E)
        packed = pack_padded_sequence(embedded, lengths, batch_first=True, enforce_sorted=False)
        outputs, final = run_rnn(self.rnn, packed)  # packed (B, S, 2D); (2L, B, D) per state
        memory, _ = pad_packed_sequence(outputs, batch_first=True, total_length=src.size(1))  # (B, S, 2D)
        hidden = final[0] if isinstance(final, tuple) else final  # (2L, B, D)
        top = torch.cat([hidden[-2], hidden[-1]], dim=-1)  # (B, 2D) last layer, forward and backward
        return memory, top


class RNNDecoder(nn.Module):
    """Bridge, attention, GRU or LSTM cell and readout; runs one step at a time (``step``)."""

    def __init__(self, cfg: RNNConfig, embed: TokenEmbedding, vocab_size: int):
        super().__init__()
        memory_size = 2 * cfg.hidden_size
        self.cell, self.layers, self.hidden_size = cfg.cell, cfg.decoder_layers, cfg.hidden_size
        self.embed = embed
        self.dropout = Dropout(cfg.dropout)
        self.bridge = nn.Linear(memory_size, cfg.decoder_layers * cfg.hidden_size)
        self.attention = cross_attention(cfg)
        self.rnn = make_rnn(
            cfg.cell, cfg.embed_dim + memory_size, cfg.hidden_size, cfg.decoder_layers, cfg.dropout, False
        )
        self.readout = nn.Linear(cfg.hidden_size + memory_size + cfg.embed_dim, cfg.embed_dim)
        self.output = OutputLayer(cfg.embed_dim, vocab_size, embed if cfg.tie_output else None)

    def start_state(self, encoded: Encoded) -> State:
        """The state before the first target token: bridged final encoder states, the attention's
        keys and values."""
        batch = encoded.memory.size(0)
        bridged = torch.tanh(self.bridge(encoded.final))  # (B, L * D)
        hidden = bridged.view(batch, self.layers, self.hidden_size)  # (B, L, D)
        cross_k, cross_v = self.attention.project_kv(encoded.memory, encoded.memory)  # once per sentence
        state = {
            "cross_k": cross_k,  # (B, H, S, d_a)
            "cross_v": cross_v,  # (B, H, S, .)
            "src_mask": encoded.src_mask,
            "hidden": hidden,
        }
        if self.cell == "lstm":
            state["cell"] = torch.zeros_like(hidden)  # (B, L, D)
        return state

    def step(self, embedded: Tensor, state: State) -> Tuple[Tensor, Tensor, Tensor, State]:
        """One recurrence step for embedded previous tokens ``(B, E)``.

        Returns the new top state ``s_t`` ``(B, D)``, context ``c_t`` ``(B, 2D)``, weights ``(B, H, S)``
        and the new state.
        """
        query = state["hidden"][:, -1:]  # (B, 1, D) s_{t-1} of the top layer
        mask = key_mask(state["src_mask"])  # (B, 1, 1, S)
        # the weights every step: forward(need_weights=True) takes them (the explicit
        # path, also for multihead: one query, so the fused kernel would save little)
        context, weights = self.attention.attend(
            query, state["cross_k"], state["cross_v"], mask, need_weights=True
        )  # (B, 1, 2D), (B, H, 1, S)
        rnn_input = torch.cat([embedded.unsqueeze(1), context], dim=-1).float()  # (B, 1, E + 2D)
        hidden = state["hidden"].transpose(0, 1).float().contiguous()  # (L, B, D)
        if self.cell == "lstm":
            cell = state["cell"].transpose(0, 1).float().contiguous()  # (L, B, D)
            output, (hidden, cell) = run_rnn(self.rnn, rnn_input, (hidden, cell))  # (B, 1, D), (L, B, D) x 2
        else:
            output, hidden = run_rnn(self.rnn, rnn_input, hidden)  # (B, 1, D), (L, B, D)
        new_state = dict(state, hidden=hidden.transpose(0, 1))  # (B, L, D)
        if self.cell == "lstm":
            new_state["cell"] = cell.transpose(0, 1)  # (B, L, D)
        return output[:, 0], context[:, 0], weights[:, :, 0], new_state  # (B, D), (B, 2D), (B, H, S)

    def logits(self, top: Tensor, context: Tensor, embedded: Tensor, project: bool = True) -> Tensor:
        """Readout: ``(..., D)``, ``(..., 2D)``, ``(..., E)`` -> logits ``(..., V)`` (``project=False``:
        the output layer's input ``(..., E)``)."""
        readout = torch.tanh(self.readout(torch.cat([top, context, embedded], dim=-1)))  # (..., E)
        readout = self.dropout(readout)  # (..., E)
        return self.output(readout) if project else readout  # (..., V) or (..., E)


class RNNModel(nn.Module):
    """RNN encoder-decoder following the contract in ``models/seq2seq.py``."""

    def __init__(self, cfg: RNNConfig, src_vocab_size: int, tgt_vocab_size: int, pad_id: int = 0):
        super().__init__()
        self.cfg, self.pad_id = cfg, pad_id
        self.max_positions = None  # no limit on the source or output length
        tgt_embed = TokenEmbedding(tgt_vocab_size, cfg.embed_dim, pad_id)
        share = cfg.share_embeddings and src_vocab_size == tgt_vocab_size
        src_embed = tgt_embed if share else TokenEmbedding(src_vocab_size, cfg.embed_dim, pad_id)
        self.encoder = RNNEncoder(cfg, src_embed)
        self.decoder = RNNDecoder(cfg, tgt_embed, tgt_vocab_size)

    @property
    def output_layer(self) -> OutputLayer:
        """The layer that makes the logits (``models/seq2seq.py``)."""
        return self.decoder.output

    def attention_modules(self) -> Dict[str, List[nn.Module]]:
        """Every attention of the model under its key in the attention dict: the decoder's one."""
        return {"cross": [self.decoder.attention], "encoder_self": [], "decoder_self": []}

    def encode(self, src: Tensor, src_mask: Tensor, need_weights: bool = False) -> Encoded:
        """``src`` ``(B, S)``, ``src_mask`` ``(B, S)`` -> memory ``(B, S, 2D)``, final ``(B, 2D)``.

        An RNN encoder has no attention: with ``need_weights`` its ``encoder_self`` list is empty.
        """
        memory, final = self.encoder(src, src_mask)  # (B, S, 2D), (B, 2D)
        attention: Attention = {"encoder_self": []} if need_weights else {}
        return Encoded(memory=memory, src_mask=src_mask, final=final, attention=attention)

    def start_state(self, encoded: Encoded) -> State:
        """The decoder state before the first target token (see ``State``)."""
        return self.decoder.start_state(encoded)

    def decode_step(self, tokens: Tensor, state: State) -> Tuple[Tensor, State]:
        """``tokens`` ``(B,)`` -> logits ``(B, V)`` and the new state."""
        embedded = self.decoder.dropout(self.decoder.embed(tokens))  # (B, E)
        top, context, _, state = self.decoder.step(embedded, state)  # (B, D), (B, 2D), (B, H, S)
        return self.decoder.logits(top, context, embedded), state  # (B, V)

    def forward(
        self,
        src: Tensor,
        src_mask: Tensor,
        tgt_in: Tensor,
        need_weights: bool = False,
        alignment: bool = False,
        project: bool = True,
    ) -> Tuple[Tensor, Attention]:
        """Teacher-forced pass: ``src`` ``(B, S)``, ``src_mask`` ``(B, S)``, ``tgt_in`` ``(B, T)`` ->
        logits ``(B, T, V)`` (``project=False``: the output layer's input ``(B, T, E)``) and the attention.

        With ``need_weights`` the attention (``models/seq2seq.py``) holds the decoder's attention as
        one layer, ``cross`` ``[(B, H, T, S)]`` (one head but for ``multihead``), and no
        self-attention; else ``{}``. With ``alignment`` it also holds ``alignment``: the heads that
        guided alignment trains, the first ``model.alignment_heads`` (``models/seq2seq.py``).
        """
        encoded = self.encode(src, src_mask, need_weights)
        state = self.start_state(encoded)
        embedded = self.decoder.dropout(self.decoder.embed(tgt_in))  # (B, T, E)
        tops, contexts, weights = [], [], []
        for t in range(tgt_in.size(1)):
            top, context, step_weights, state = self.decoder.step(embedded[:, t], state)
            tops.append(top)
            contexts.append(context)
            weights.append(step_weights)
        out = self.decoder.logits(
            torch.stack(tops, 1), torch.stack(contexts, 1), embedded, project
        )  # (B, T, V) logits, or (B, T, E)
        if not (need_weights or alignment):
            return out, {}
        cross = torch.stack(weights, 2)  # (B, H, T, S) one layer
        found = {"cross": [cross], "decoder_self": [], **encoded.attention} if need_weights else {}
        if alignment:
            found["alignment"] = [cross[:, : self.cfg.alignment_heads]]  # (B, H_a, T, S)
        return out, found
