"""The attention viewer (viewer/): its stored format, its writing at every evaluation, and its
TensorBoard plugin served by a real TensorBoard with either loader (the fast data server and
``--load_fast=false``)."""

import base64
import http.client
import importlib.metadata
import json
import re
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from alignment.heads import row_entropy
from training.board import Board
from viewer.format import PLUGIN_NAME, SCALE, decode, spans, summary_of
from viewer.plugin import AttentionLoader, at_step, sentence_number
from viewer.summaries import Texts, encode, head_stats_of, words_of

from helpers import TINY_RNN, TINY_TRANSFORMER, compose, tiny_model_config, tiny_run

EVALS = 12  # steps of the synthetic run: more than TensorBoard keeps of a tag by default (10)
TEXTS = Texts("Ein Mann.", "A man.", "A man.")


def softmax(*shape):
    return torch.rand(*shape).softmax(-1)


def transformer_attention(batch=2, heads=2, layers=2, t=6, s=7):
    """A Transformer's attention (models/seq2seq.py) over a padded batch; the decoder's is causal."""
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    return {
        "cross": [softmax(batch, heads, t, s) for _ in range(layers)],
        "encoder_self": [softmax(batch, heads, s, s) for _ in range(layers)],
        "decoder_self": [
            torch.rand(batch, heads, t, t).masked_fill(~causal, float("-inf")).softmax(-1)
            for _ in range(layers)
        ],
    }


def maps_of(header, weights: bytes):
    """``{(kind, layer): (heads, rows, cols) uint8 array}`` of a stored sentence."""
    flat = np.frombuffer(weights, dtype=np.uint8)
    return {
        (m["kind"], m["layer"]): flat[offset : offset + size].reshape(m["heads"], m["rows"], m["cols"])
        for m, (offset, size) in zip(header["maps"], spans(header))
    }


# ----- the stored format -----
def test_a_sentence_round_trips_through_its_summary_with_every_map_cut_to_its_tokens():
    attention = transformer_attention()
    src, out = ["▁Ein", "▁Mann", ".", "</s>"], ["▁A", "▁m", "an", "</s>"]  # shorter than the padded batch
    header, weights = encode(attention, 1, src, out, TEXTS, "transformer")
    value = summary_of("nmt_attention/sent1", header, weights).value[0]
    assert value.metadata.plugin_data.plugin_name == PLUGIN_NAME
    assert json.loads(value.metadata.plugin_data.content) == {"version": 1}
    header_blob, weights_blob = value.tensor.string_val
    stored = decode(header_blob, weights_blob)
    assert stored == header and stored["src_tokens"] == src and stored["out_tokens"] == out
    assert stored["in_tokens"] == ["<s>", "▁A", "▁m", "an"]
    assert (stored["source"], stored["reference"], stored["hypothesis"]) == TEXTS
    assert stored["src_words"] == [0, 1, 1, 2] and stored["out_words"] == [
        0,
        1,
        1,
        2,
    ]  # EOS: a word of its own
    maps = maps_of(stored, weights_blob)
    assert [(m["kind"], m["layer"]) for m in stored["maps"]] == [
        (kind, layer) for kind in ("cross", "encoder_self", "decoder_self") for layer in (1, 2)
    ]
    sizes = {"cross": (4, 4), "encoder_self": (4, 4), "decoder_self": (4, 4)}
    for (kind, layer), array in maps.items():
        assert array.shape == (2, *sizes[kind])
        expected = (attention[kind][layer - 1][1, :, :4, :4] * SCALE).round().to(torch.uint8).numpy()
        assert np.array_equal(array, expected), (kind, layer)
    assert not maps[("decoder_self", 2)][:, np.triu_indices(4, 1)[0], np.triu_indices(4, 1)[1]].any()


def test_the_rnn_has_one_cross_map_with_one_head_whose_rows_sum_to_about_the_scale():
    attention = {"cross": [softmax(1, 1, 5, 9)], "encoder_self": [], "decoder_self": []}
    src, out = ["▁a", "b", "▁c", "</s>"] * 2 + ["</s>"], ["▁x", "▁y", "z", "▁w", "</s>"]
    header, weights = encode(attention, 0, src, out, TEXTS, "rnn")
    assert [(m["kind"], m["layer"], m["heads"], m["rows"], m["cols"]) for m in header["maps"]] == [
        ("cross", 1, 1, 5, 9)
    ]
    rows = maps_of(header, weights)[("cross", 1)].astype(int).sum(-1)
    assert (abs(rows - SCALE) <= 9 / 2).all()  # each of the 9 entries rounds by at most 1/2


def test_words_follow_the_alignment_word_boundaries_and_eos_ends_them():
    assert words_of(["▁Ein", "▁Mann", "es", "</s>"]) == [0, 1, 1, 2]
    assert words_of(["▁A", "b"]) == [0, 0]  # no EOS: an output cut at the length limit
    assert words_of(["</s>"]) == [0]


def test_a_weights_blob_that_does_not_match_its_header_is_refused():
    header, weights = encode(transformer_attention(), 0, ["▁a", "</s>"], ["▁b", "</s>"], TEXTS, "transformer")
    with pytest.raises(ValueError, match="bytes of weights"):
        decode(json.dumps(header).encode(), weights[:-1])
    with pytest.raises(ValueError, match="version"):
        decode(json.dumps(dict(header, version=2)).encode(), weights)


OPTIONAL = ("gold", "links", "links_method", "head_stats")  # the header's optional fields


def test_gold_links_and_head_stats_round_trip_and_a_sentence_without_them_stays_as_it_was():
    attention = transformer_attention()
    src, out = ["▁Ein", "▁Mann", ".", "</s>"], ["▁A", "▁m", "an", "</s>"]  # 3 words each, EOS included
    entropy = {
        kind: [row_entropy(layer[1, :, :4, :4]).mean(-1).tolist() for layer in attention[kind]]
        for kind in attention
    }
    importance = {"cross": [[0.031, None], [-0.002, 0.5]]}  # the other kinds: not measured
    gold = {"sure": [(0, 0), (1, 1)], "possible": [(1, 1), (1, 0)]}  # one possible link is also sure
    header, weights = encode(
        attention,
        1,
        src,
        out,
        TEXTS,
        "transformer",
        gold=gold,
        links=[(0, 0), (1, 1), (1, 1)],
        links_method="layer 2, mean of heads",
        head_stats=head_stats_of(entropy, importance),
    )
    stored = decode(*summary_of("nmt_attention/sent1", header, weights).value[0].tensor.string_val)
    assert stored == header
    assert stored["gold"] == {"sure": [[0, 0], [1, 1]], "possible": [[1, 1], [1, 0]]}
    assert stored["links"] == [[0, 0], [1, 1]] and stored["links_method"] == "layer 2, mean of heads"
    # one entry per map, in the maps' order, with the entropy of that map's head
    for m, per_map in zip(stored["maps"], stored["head_stats"]):
        assert [h["entropy"] for h in per_map] == entropy[m["kind"]][m["layer"] - 1]
        rises = importance.get(m["kind"], [[None, None]] * 2)[m["layer"] - 1]
        assert [h["importance"] for h in per_map] == rises, (m["kind"], m["layer"])

    plain, plain_weights = encode(attention, 1, src, out, TEXTS, "transformer")
    assert plain_weights == weights and not set(OPTIONAL) & set(plain)
    assert {k: v for k, v in stored.items() if k not in OPTIONAL} == plain
    assert decode(json.dumps(plain).encode(), weights) == plain


def test_optional_fields_that_do_not_fit_the_sentence_are_refused():
    src, out = ["▁a", "▁b", "</s>"], ["▁c", "</s>"]  # 3 source words, 2 output words
    header, weights = encode(transformer_attention(), 0, src, out, TEXTS, "transformer")
    stats = [[{"entropy": 1.0, "importance": None}] * m["heads"] for m in header["maps"]]
    for bad in (
        {"links": [[3, 0]]},  # no source word 3
        {"gold": {"sure": [[0, 2]], "possible": []}},  # no output word 2
        {"gold": {"sure": [[0]]}},
        {"gold": [[0, 0]]},
        {"head_stats": stats[1:]},  # one map without its heads
        {"head_stats": [[{"entropy": float("nan"), "importance": None}] * 2] + stats[1:]},
    ):
        with pytest.raises(ValueError, match="attention summary"):
            decode(json.dumps(dict(header, **bad)).encode(), weights)
    with pytest.raises(ValueError, match="links link"):
        encode(transformer_attention(), 0, src, out, TEXTS, "transformer", links=[(0, 2)])


def test_steps_must_be_plain_numbers_and_sentences_sort_by_number():
    from tensorboard import errors

    for step in ("²", "-1", "1.5", "x"):
        with pytest.raises(errors.InvalidArgumentError):
            at_step([], step)
    tags = [f"{PLUGIN_NAME}/sent{i}" for i in (10, 2, 0, 1)]
    assert sorted(tags, key=sentence_number) == [f"{PLUGIN_NAME}/sent{i}" for i in (0, 1, 2, 10)]
    mixed = [f"{PLUGIN_NAME}/sent1", f"{PLUGIN_NAME}/gold10", f"{PLUGIN_NAME}/sent0", f"{PLUGIN_NAME}/gold2"]
    assert sorted(mixed, key=sentence_number) == [
        mixed[3],
        mixed[1],
        mixed[2],
        mixed[0],
    ]  # gold2, gold10, sent0, sent1


def test_the_plugin_side_imports_no_torch():
    code = "import sys, viewer.plugin; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_tensorboard_finds_the_plugin_and_keeps_all_its_steps_unless_told_otherwise():
    found = importlib.metadata.entry_points(group="tensorboard_plugins", name=PLUGIN_NAME)
    assert found, (
        "no tensorboard_plugins entry point nmt_attention: install the project (make, or pip install -e .)"
    )
    assert next(iter(found)).load() is AttentionLoader

    class Flags:
        samples_per_plugin = {"images": 50}

    AttentionLoader().fix_flags(Flags)
    assert Flags.samples_per_plugin == {"images": 50, PLUGIN_NAME: 0}
    Flags.samples_per_plugin[PLUGIN_NAME] = 3
    AttentionLoader().fix_flags(Flags)
    assert Flags.samples_per_plugin[PLUGIN_NAME] == 3


# ----- written by training, served by TensorBoard -----
@pytest.fixture(scope="module")
def logdir(multi30k_slice, tmp_path_factory):
    """Two runs: ``real`` a tiny Transformer trained for 4 steps with 2 evaluations of 2 attention
    samples each; ``many`` a Board given an RNN-shaped attention at ``EVALS`` steps."""
    from training.trainer import Trainer

    root = tmp_path_factory.mktemp("viewer")
    overrides = [
        o
        for o in tiny_run(root / "real", multi30k_slice, root / "cache", "trainer.batch_tokens=1000")
        if o not in TINY_RNN and not o.startswith("hydra.")
    ]
    extra = ["trainer.max_steps=4", "trainer.eval_every=2", "trainer.attention_samples=2"]
    trainer = Trainer(compose([*overrides, *TINY_TRANSFORMER, *extra]), root / "real")
    trainer.fit()
    trainer.close()
    board = Board(root / "many")
    attention = {"cross": [softmax(1, 1, 3, 4)], "encoder_self": [], "decoder_self": []}
    for step in range(1, EVALS + 1):
        board.attention_summaries(
            "rnn", attention, [["▁a", "▁b", "c", "</s>"]], [["▁x", "y", "</s>"]], [TEXTS], step
        )
    board.close()
    return root


def written(run_dir: Path):
    """``{(tag, step): (header blob, weights blob)}`` of the viewer's summaries in a run's event files."""
    found = {}
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == PLUGIN_NAME or value.tag.startswith(PLUGIN_NAME):
                    found[value.tag, event.step] = tuple(value.tensor.string_val)
    return found


class Server:
    """A TensorBoard process on 127.0.0.1 (a free port), its data routes read with plain HTTP."""

    def __init__(self, logdir: Path, load_fast: str, log: Path):
        self.log = log.open("w")
        args = ["--logdir", str(logdir), "--host", "127.0.0.1", "--port", "0", "--load_fast", load_fast]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tensorboard.main", *args], stdout=self.log, stderr=subprocess.STDOUT
        )
        self.port = self._wait_for_port(log)

    def _wait_for_port(self, log: Path, seconds: float = 120) -> int:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            served = re.search(r"http://127\.0\.0\.1:(\d+)/", log.read_text())
            if served:
                return int(served.group(1))
            if self.process.poll() is not None:
                break
            time.sleep(0.2)
        self.close()
        raise AssertionError(f"TensorBoard did not start: {log.read_text()[-2000:]}")

    def get(self, path: str, **query):
        """``(status, content type, body)`` of ``/data/plugin/nmt_attention/<path>`` sent as written."""
        target = f"/data/plugin/{PLUGIN_NAME}/{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        return self.raw(target)

    def raw(self, target: str):
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.request("GET", target)
            response = connection.getresponse()
            return response.status, response.getheader("Content-Type", ""), response.read()
        finally:
            connection.close()

    def json(self, path: str, **query):
        status, kind, body = self.get(path, **query)
        assert status == 200 and kind.startswith("application/json"), (path, status, body[:300])
        return json.loads(body)

    def close(self):
        self.process.terminate()
        self.process.wait(timeout=30)
        self.log.close()


@pytest.fixture(scope="module", params=["true", "false"], ids=["fast_loader", "python_loader"])
def server(request, logdir, tmp_path_factory):
    """TensorBoard on ``logdir`` with the fast loader or ``--load_fast=false``, its data loaded."""
    server = Server(logdir, request.param, tmp_path_factory.mktemp("tb") / "tensorboard.log")
    try:
        end = time.monotonic() + 120
        while (
            len(server.json("runs")) < 2
            or len(server.json("steps", run="many", tag="nmt_attention/sent0")) < EVALS
        ):
            assert time.monotonic() < end, "TensorBoard did not load the runs"
            time.sleep(0.5)
    except BaseException:
        server.close()
        raise
    yield server
    server.close()


@pytest.mark.slow
def test_the_tab_is_listed_active_with_its_module(server):
    status, _, body = server.raw("/data/plugins_listing")
    listing = json.loads(body)[PLUGIN_NAME]
    assert status == 200 and listing["enabled"] and listing["tab_name"] == "Attention"
    assert listing["loading_mechanism"] == {
        "type": "IFRAME",
        "module_path": f"/data/plugin/{PLUGIN_NAME}/index.js",
    }


@pytest.mark.slow
def test_runs_steps_and_attention_are_what_training_wrote(server, logdir, multi30k_slice):
    sentences = ["nmt_attention/sent0", "nmt_attention/sent1"]
    assert server.json("runs") == [
        {"run": "many", "sentences": ["nmt_attention/sent0"]},
        {"run": "real/tb", "sentences": sentences},
    ]
    assert [s["step"] for s in server.json("steps", run="many", tag="nmt_attention/sent0")] == list(
        range(1, EVALS + 1)
    )
    stored = written(logdir / "real" / "tb")
    assert {key[0] for key in stored} == set(sentences)
    val_sources = (multi30k_slice / "val.de").read_text(encoding="utf-8").splitlines()
    for i, tag in enumerate(sentences):
        steps = server.json("steps", run="real/tb", tag=tag)
        assert [s["step"] for s in steps] == [2, 4] and all(s["wall_time"] > 0 for s in steps)
        for step in (2, 4):
            got = server.json("attention", run="real/tb", tag=tag, step=step)
            header_blob, weights = stored[tag, step]
            weights_got = base64.b64decode(got.pop("weights"))
            assert got == json.loads(header_blob) and weights_got == weights
            assert (
                got["model"] == "transformer" and got["source"] == val_sources[i]
            )  # the same sentences every run
            assert got["src_tokens"][-1] == "</s>" and len(got["src_words"]) == len(got["src_tokens"])
            assert_every_map_of_the_tiny_transformer(got, weights_got)
        assert server.json("attention", run="real/tb", tag=tag) == server.json(
            "attention", run="real/tb", tag=tag, step=4
        )


def assert_every_map_of_the_tiny_transformer(header, weights):
    n_src, n_out = len(header["src_tokens"]), len(header["out_tokens"])
    sizes = {"cross": (n_out, n_src), "encoder_self": (n_src, n_src), "decoder_self": (n_out, n_out)}
    maps = maps_of(header, weights)
    assert sorted(maps) == sorted((kind, layer) for kind in sizes for layer in (1, 2))
    heads = tiny_model_config("transformer").n_heads
    for (kind, _), array in maps.items():
        assert array.shape == (heads, *sizes[kind])
        assert (abs(array.astype(int).sum(-1) - SCALE) <= array.shape[-1] / 2).all()  # rows: the whole weight
    upper = np.triu_indices(n_out, 1)
    assert not maps[("decoder_self", 1)][:, upper[0], upper[1]].any()  # causal: no weight on later tokens


@pytest.mark.slow
@pytest.mark.parametrize(
    "path, query, status",
    [
        ("steps", {}, 400),
        ("steps", {"run": "real/tb"}, 400),
        ("steps", {"run": "nope", "tag": "nmt_attention/sent0"}, 404),
        ("steps", {"run": "real/tb", "tag": "nmt_attention/sent9"}, 404),
        ("attention", {"run": "real/tb", "tag": "nmt_attention/sent0", "step": "two"}, 400),
        ("attention", {"run": "real/tb", "tag": "nmt_attention/sent0", "step": "-2"}, 400),
        ("attention", {"run": "real/tb", "tag": "nmt_attention/sent0", "step": "3"}, 404),
        ("static/nothing.js", {}, 404),
    ],
)
def test_bad_requests_answer_a_json_error(server, path, query, status):
    got, kind, body = server.get(path, **query)
    assert (got, kind) == (status, "application/json") and json.loads(body)["error"]


@pytest.mark.slow
def test_static_files_are_the_static_folders_only(server):
    source = (Path(__file__).resolve().parent.parent / "viewer" / "static" / "index.js").read_bytes()
    status, kind, body = server.get("index.js")
    assert status == 200 and kind.split(";")[0] == "text/javascript" and body == source
    assert server.get("static/index.js")[2] == source
    secret = b"class AttentionPlugin"
    for target in (
        "static/../plugin.py",
        "static/%2e%2e/plugin.py",
        "static/%2e%2e%2fplugin.py",
        "static//etc/passwd",
    ):
        status, _, body = server.raw(f"/data/plugin/{PLUGIN_NAME}/{target}")
        assert 400 <= status < 500 and secret not in body and b"root:" not in body, target
