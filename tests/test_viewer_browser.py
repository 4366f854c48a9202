"""The attention viewer (``viewer/``) in a real browser: two tiny real training runs (the RNN and a
two-layer Transformer) write their attention summaries, a real ``tensorboard`` serves them with the
plugin, and headless Chromium opens the "Attention" tab.

The test checks what a user sees: the sentence's tokens as text, the weight shown on hover equal to
the weight training wrote for that cell, another map after picking another layer and head, both
runs side by side (and a note where the RNN has no such attention), a PNG export, and a browser
console without errors. A third run, ``with_gold``, holds one hand-made sentence with a gold
alignment, the model's own links and head statistics (as ``scripts/align.py --tensorboard`` writes
them); a second test checks their boxes, dots, toggles and the numbers under each head. (The
docs' screenshots of the tab come from trained runs: ``scripts/viewer_screenshots.py``.)

Needs Debian's ``chromium`` and ``chromium-driver`` and the ``selenium`` package; skipped, saying
which is missing, without them.
"""

import json
import math
import os
import re
import shutil
import struct
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from helpers import TINY_RNN, TINY_TRANSFORMER, load_script, tiny_run

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
INSTALL = "apt-get install -y chromium chromium-driver"
WINDOW = (1600, 1200)
WAIT = 20  # seconds for the page to show what a step asked for
TAG = "nmt_attention/sent0"

# The quick runs: a few steps of the tiny RNN and of the tiny Transformer (two layers of four
# heads: enough to switch layer and head). The RNN is evaluated at steps 2 and 4, the
# Transformer at step 4 only (its attention images take seconds), so the RNN's step 2 shows
# beside the Transformer's nearest step.
QUICK = {
    "rnn": ["trainer.max_steps=4", "trainer.eval_every=2"],
    "transformer": [*TINY_TRANSFORMER, "trainer.max_steps=4", "trainer.eval_every=4"],
}
SAMPLES = ["trainer.attention_samples=2", "trainer.batch_tokens=1000"]

# The gold run's sentence: pieces, their words (EOS a word of its own), a gold alignment whose
# possible links repeat one sure link, the model's links and the cross layers' head importance.
GOLD_SRC = ["▁Ein", "▁klein", "er", "▁Hund", "▁spring", "t", "▁.", "</s>"]  # Ein kleiner Hund springt .
GOLD_OUT = ["▁A", "▁small", "▁dog", "▁jump", "s", "▁.", "</s>"]  # A small dog jumps .
GOLD = {"sure": [(0, 0), (1, 1), (2, 2), (3, 3)], "possible": [(3, 3), (4, 4), (1, 2)]}
LINKS = [(0, 0), (2, 1), (2, 2), (3, 3), (4, 4)]
IMPORTANCE = [[0.012, 0.047, None, 0.031], [0.002, -0.004, 0.009, 0.001]]  # layer 1 by importance: 2, 4, 1, 3


def browser_or_skip() -> None:
    """Skip the test, saying what is missing and how to install it, without Chromium, its driver or selenium."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not found: install them with `{INSTALL}`")
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.skip("selenium is not installed: `pip install selenium`")


# ----- the runs and the server ------------------------------------------------------------------


@pytest.fixture(scope="module")
def logdir(multi30k_slice, compose_config, tmp_path_factory) -> Path:
    """A folder of two finished runs' events, ``rnn`` and ``transformer`` (the runs tensorboard lists)."""
    browser_or_skip()  # before the training, which a skipped test does not need
    from training.run import train

    root = tmp_path_factory.mktemp("viewer_runs")
    for family in QUICK:
        tiny = tiny_run(root / family, multi30k_slice, root / "cache", *SAMPLES)
        overrides = [o for o in tiny if not o.startswith("hydra.")]
        if family != "rnn":
            overrides = [o for o in overrides if o not in TINY_RNN]
        overrides += QUICK[family]
        train(compose_config(overrides), root / family)
        shutil.copytree(root / family / "tb", root / "logs" / family)
    write_gold_run(root / "logs" / "with_gold")
    return root / "logs"


def write_gold_run(folder: Path) -> None:
    """A run of one Transformer-shaped sentence (2 layers of 4 heads, every kind) at step 1 whose
    header has ``gold``, ``links`` and ``head_stats``; its cross attention leans on the sure links,
    sharper in later heads, so the map has dark and light cells."""
    import torch

    from alignment.heads import row_entropy
    from training.board import Board
    from viewer.summaries import Texts, head_stats_of, words_of

    generator = torch.Generator().manual_seed(0)
    src_words, out_words = words_of(GOLD_SRC), words_of(GOLD_OUT)
    sure = torch.tensor([[float((i, j) in GOLD["sure"]) for i in src_words] for j in out_words])  # (T, S)
    sharpness = torch.tensor([0.5, 1.0, 2.0, 4.0]).view(1, 4, 1, 1)  # per head

    def layers(rows: int, cols: int, prior=0.0):
        logits = [prior * 3 + torch.randn(1, 4, rows, cols, generator=generator) for _ in range(2)]
        return [(x * sharpness).softmax(-1) for x in logits]  # (1, H, rows, cols) per layer

    s, t = len(GOLD_SRC), len(GOLD_OUT)
    attention = {"cross": layers(t, s, sure), "encoder_self": layers(s, s), "decoder_self": layers(t, t)}
    entropy = {kind: [row_entropy(x[0]).mean(-1).tolist() for x in maps] for kind, maps in attention.items()}
    texts = Texts("Ein kleiner Hund springt .", "A small dog jumps .", "A small dog jumps .")
    extras = {
        "gold": GOLD,
        "links": LINKS,
        "links_method": "layer 2, mean of heads",
        "head_stats": head_stats_of(entropy, {"cross": IMPORTANCE}),
    }
    board = Board(folder)  # TAG, at step 1
    board.attention_summaries("transformer", attention, [GOLD_SRC], [GOLD_OUT], [texts], 1, extras=[extras])
    board.close()


SERVER = load_script("viewer_screenshots")  # tensorboard, get_json: the screenshots' own server helpers
get_json = SERVER.get_json


@pytest.fixture(scope="module")
def board(logdir, tmp_path_factory):
    """The address of a real ``tensorboard`` serving ``logdir``, once the plugin lists its three runs."""
    log = tmp_path_factory.mktemp("tensorboard") / "tensorboard.log"
    runs = ["rnn", "transformer", "with_gold"]
    with SERVER.tensorboard(logdir, log, runs) as url:
        assert [r["run"] for r in get_json(f"{url}/data/plugin/nmt_attention/runs")] == runs
        yield url


def written(logdir: Path, run: str, tag: str = TAG):
    """The summaries of ``tag`` that training wrote in ``run``, read from its events, by step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(logdir / run), size_guidance={"tensors": 0})
    events.Reload()
    return events.Tensors(tag)


def written_sample(logdir: Path, run: str) -> Tuple[Dict, bytes]:
    """The header and weights of the last evaluation's summary."""
    header, weights = written(logdir, run)[-1].tensor_proto.string_val
    return json.loads(header.decode("utf-8")), weights


def written_weight(sample: Tuple[Dict, bytes], kind: str, layer: int, head: int, row: int, col: int) -> float:
    header, weights = sample
    m = next(m for m in header["maps"] if m["kind"] == kind and m["layer"] == layer)
    return weights[m["offset"] + ((head - 1) * m["rows"] + row) * m["cols"] + col] / 255


# ----- the browser ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def driver(board, tmp_path_factory):
    """Headless Chromium on the Attention tab of ``board``, switched into the tab's iframe."""
    os.environ["SE_OFFLINE"] = "true"  # selenium must not try to download a driver
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", f"--window-size={WINDOW[0]},{WINDOW[1]}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    downloads = tmp_path_factory.mktemp("downloads")
    options.add_experimental_option("prefs", {"download.default_directory": str(downloads)})
    browser = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    browser.downloads = downloads
    try:
        browser.get(f"{board}/#nmt_attention")
        frame = WebDriverWait(browser, WAIT).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, "iframe[src*='nmt_attention']")
        )[0]
        browser.switch_to.frame(frame)
        WebDriverWait(browser, WAIT).until(lambda d: d.find_elements(By.CSS_SELECTOR, "canvas.map"))
        yield browser
    finally:
        browser.quit()


def pick(driver, control: str, value: str) -> None:
    """Choose ``value`` in the <select> ``control`` and wait until the page has redrawn."""
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element("id", control)).select_by_value(value)
    settle(driver)


def settle(driver) -> None:
    """Wait until no update is running: the page empties its status line when it has redrawn."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, WAIT).until(lambda d: d.find_element("id", "status").text == "")


def panels(driver) -> Dict[str, object]:
    return {p.get_attribute("data-run"): p for p in driver.find_elements("css selector", "section.panel")}


def texts(elements) -> List[str]:
    return [e.get_attribute("textContent") for e in elements]


def map_image(driver, panel) -> str:
    return driver.execute_script(
        "return arguments[0].toDataURL();", panel.find_element("css selector", "canvas.map")
    )


def hover(driver, panel, row: int, col: int) -> Tuple[Dict[str, str], str]:
    """Move the mouse over cell (row, col) of ``panel``'s large map; the hover line's data and text."""
    from selenium.webdriver.common.action_chains import ActionChains

    canvas = panel.find_element("css selector", "canvas.map")
    cell = int(driver.find_element("id", "zoom-slider").get_attribute("value"))
    # Scroll the map to its start and the cell to mid-height, then aim from the canvas's in-view
    # centre (the centre of its part inside the window: WebDriver's origin for an element).
    x, y = driver.execute_script(
        """const [canvas, x, y] = arguments;
        const box = canvas.closest(".map-scroll");
        box.scrollTop = 0;
        box.scrollLeft = 0;
        window.scrollBy(0, canvas.getBoundingClientRect().top + y - window.innerHeight / 2);
        const r = canvas.getBoundingClientRect();
        const cx = (Math.max(r.left, 0) + Math.min(r.right, window.innerWidth)) / 2;
        const cy = (Math.max(r.top, 0) + Math.min(r.bottom, window.innerHeight)) / 2;
        return [r.left + x - cx, r.top + y - cy];""",
        canvas,
        (col + 0.5) * cell,
        (row + 0.5) * cell,
    )
    title = panel.find_element(
        "css selector", "h2"
    )  # off the map first: a mouse that does not move sends no event
    ActionChains(driver).move_to_element(title).move_to_element_with_offset(
        canvas, round(x), round(y)
    ).perform()
    info = driver.find_element("id", "hover-info")
    data = {k: info.get_attribute(f"data-{k}") for k in ("run", "row", "col", "weight")}
    return data, info.text


def shown_weight(text: str) -> float:
    found = re.search(r"(\d+\.\d+)$", text)
    assert found, f"no weight at the end of the hover line {text!r}"
    return float(found.group(1))


def words(header: Dict, side: str) -> List[str]:
    """The words of the ``side`` ("src" or "out") tokens of a header: pieces of one word joined, "▁" dropped."""
    joined: Dict[int, str] = {}
    for piece, word in zip(header[f"{side}_tokens"], header[f"{side}_words"]):
        joined[word] = joined.get(word, "") + piece.replace("▁", "")
    return [joined[w] for w in sorted(joined)]


def download_done(folder: Path) -> bool:
    """Whether Chromium has finished a download into ``folder``: it reserves the file's name with
    an empty file and writes a ``.crdownload`` beside it, renamed over that name at the end."""
    files = list(folder.iterdir())
    return any(f.suffix == ".png" and f.stat().st_size > 0 for f in files) and not any(
        f.suffix == ".crdownload" for f in files
    )


def png_size(path: Path) -> Tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


# ----- the test ---------------------------------------------------------------------------------


def test_the_attention_tab_shows_the_written_maps_of_two_runs(driver, logdir):
    rnn, transformer = written_sample(logdir, "rnn"), written_sample(logdir, "transformer")

    # the first run (rnn) at its last step: its sentence as text, its tokens as the map's labels
    settle(driver)
    shown = panels(driver)["rnn"]
    header = rnn[0]
    assert shown.find_element("css selector", "dd.source").text == header["source"]
    assert shown.find_element("css selector", "dd.reference").text == header["reference"]
    assert texts(shown.find_elements("css selector", ".row-label")) == header["out_tokens"]
    assert texts(shown.find_elements("css selector", ".col-label")) == header["src_tokens"]

    # the Transformer, one head at a time: hovering a cell shows the weight written for it
    pick(driver, "run-select", "transformer")
    header = transformer[0]
    assert (
        texts(panels(driver)["transformer"].find_elements("css selector", ".row-label"))
        == header["out_tokens"]
    )
    pick(driver, "layer-select", "1")
    pick(driver, "head-select", "1")
    first_map = map_image(driver, panels(driver)["transformer"])
    row, col = 1, 2
    for layer, head in ((1, 1), (2, 2)):
        if layer == 2:  # the small map of layer 2, head 2 picks it
            panels(driver)["transformer"].find_element(
                "css selector", ".thumb[data-layer='2'][data-head='2']"
            ).click()
            settle(driver)
            assert map_image(driver, panels(driver)["transformer"]) != first_map
        data, text = hover(driver, panels(driver)["transformer"], row, col)
        assert (data["run"], data["row"], data["col"]) == ("transformer", str(row), str(col)), text
        expected = written_weight(transformer, "cross", layer, head, row, col)
        assert abs(shown_weight(text) - expected) <= 1 / 255, (layer, head, text, expected)
        assert f"{header['out_tokens'][row]} → {header['src_tokens'][col]}" in text

    # the RNN beside it: where it has no such map its panel says so, else both show their map
    pick(driver, "compare-select", "rnn")
    pick(driver, "kind-select", "encoder_self")
    both = panels(driver)
    assert set(both) == {"transformer", "rnn"}
    assert both["transformer"].find_elements("css selector", "canvas.map")
    assert "no encoder self attention" in both["rnn"].find_element("css selector", ".missing").text
    pick(driver, "kind-select", "cross")  # still layer 2: the RNN has one layer
    assert (
        "no layer 2 of cross attention" in panels(driver)["rnn"].find_element("css selector", ".missing").text
    )
    pick(driver, "layer-select", "1")
    pick(driver, "head-select", "mean")
    both = panels(driver)
    assert all(p.find_elements("css selector", "canvas.map") for p in both.values())
    assert texts(both["rnn"].find_elements("css selector", ".row-label")) == rnn[0]["out_tokens"]
    pick(driver, "units-select", "words")  # one row and one column per word
    both = panels(driver)
    assert texts(both["rnn"].find_elements("css selector", ".row-label")) == words(rnn[0], "out")
    assert texts(both["transformer"].find_elements("css selector", ".col-label")) == words(
        transformer[0], "src"
    )
    pick(driver, "units-select", "subwords")
    both = panels(driver)

    # export: a PNG of the large map with its labels, so larger than the map's canvas
    canvas = both["transformer"].find_element("css selector", "canvas.map")
    both["transformer"].find_element("css selector", "button.export").click()
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline and not download_done(driver.downloads):
        time.sleep(0.2)
    exported = list(driver.downloads.glob("*.png"))
    assert len(exported) == 1, list(driver.downloads.iterdir())
    width, height = png_size(exported[0])
    assert width > canvas.size["width"] and height > canvas.size["height"]

    # the RNN's first step as the main run: the Transformer beside it at its nearest step
    pick(driver, "run-select", "rnn")  # the runs swap places
    driver.execute_script(
        "const s = document.getElementById('step-slider'); s.value = 0; s.dispatchEvent(new Event('input'));"
    )
    settle(driver)
    first = written(logdir, "rnn")[0].step
    nearest = min((e.step for e in written(logdir, "transformer")), key=lambda s: (abs(s - first), s))
    both = panels(driver)
    assert list(both) == ["rnn", "transformer"]
    assert f"step {first}" in both["rnn"].find_element("css selector", ".meta").text
    assert f"step {nearest}" in both["transformer"].find_element("css selector", ".meta").text

    # the browser console has no errors (TensorBoard's page and the tab's)
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors


def test_gold_boxes_model_links_and_head_numbers_on_the_cross_map(driver, logdir):
    header, _ = written_sample(logdir, "with_gold")
    pick(driver, "run-select", "with_gold")
    for control, value in (
        ("compare-select", ""),
        ("kind-select", "cross"),
        ("layer-select", "1"),
        ("head-select", "mean"),
        ("units-select", "subwords"),
        ("order-select", "number"),
    ):
        pick(driver, control, value)
    shown = panels(driver)["with_gold"]

    # a box per gold link, a possible link that is also sure drawn once, as sure; a dot per model link
    def marks(selector: str):
        return shown.find_elements("css selector", f".overlay {selector}")

    assert len(marks(".gold-box.sure")) == 4 and len(marks(".gold-box.possible")) == 2
    assert len(marks(".model-link")) == len(LINKS)
    # a box covers every piece of its two words: "kleiner" (two pieces) x "small" (one)
    cell = int(driver.find_element("id", "zoom-slider").get_attribute("value"))
    box = next(b for b in marks(".gold-box.sure") if b.get_attribute("data-src") == "1")
    assert abs(box.size["width"] - 2 * cell) <= 6 and abs(box.size["height"] - cell) <= 6, box.size
    legend = shown.find_element("css selector", ".overlay-bar").text
    assert "sure (4)" in legend and "possible (2)" in legend and "layer 2, mean of heads" in legend

    # each toggle hides its own marks and only those
    def displayed(selector: str) -> List[bool]:
        return [m.is_displayed() for m in marks(selector)]

    shown.find_element("css selector", "input.gold-toggle").click()
    assert not any(displayed(".gold-box")) and all(displayed(".model-link"))
    shown.find_element("css selector", "input.links-toggle").click()
    assert not any(displayed(".model-link"))
    shown.find_element("css selector", "input.gold-toggle").click()
    shown.find_element("css selector", "input.links-toggle").click()
    assert all(displayed(".gold-box")) and all(displayed(".model-link"))

    # in words: one cell per word, the same links
    pick(driver, "units-select", "words")
    shown = panels(driver)["with_gold"]
    assert [len(marks(m)) for m in (".gold-box.sure", ".gold-box.possible", ".model-link")] == [4, 2, 5]
    pick(driver, "units-select", "subwords")

    # the numbers under each head of cross layer 1 (the first map), then the heads by importance
    stats = header["head_stats"][0]
    expected = {
        str(h): f"H {s['entropy']:.2f}" + ("" if s["importance"] is None else f" · Δ{s['importance']:+.3f}")
        for h, s in enumerate(stats, start=1)
    }

    def layer_one() -> List[Tuple[str, str, str]]:
        thumbs = panels(driver)["with_gold"].find_elements("css selector", ".thumb[data-layer='1']")
        return [
            (
                t.get_attribute("data-head"),
                *texts(t.find_elements("css selector", ".thumb-head, .thumb-numbers")),
            )
            for t in thumbs
        ]

    assert layer_one() == [(h, f"head {h}", expected[h]) for h in "1234"]
    pick(driver, "order-select", "importance")
    assert layer_one() == [(h, f"head {h}", expected[h]) for h in "2413"]  # unmeasured head 3 last
    pick(driver, "order-select", "number")

    # without head_stats or gold (the trained runs): this sentence's entropy, no overlay
    pick(driver, "compare-select", "transformer")
    other = panels(driver)["transformer"]
    assert not other.find_elements("css selector", ".overlay, .overlay-bar")
    t_header, t_weights = written_sample(logdir, "transformer")
    cross = next(m for m in t_header["maps"] if m["kind"] == "cross" and m["layer"] == 1)
    numbers = texts(other.find_elements("css selector", ".thumb[data-layer='1'] .thumb-numbers"))
    assert numbers == [
        f"H {stored_entropy(t_weights, cross, h):.2f} (this sentence)" for h in range(cross["heads"])
    ]
    pick(driver, "compare-select", "rnn")  # one map of one head
    numbers = texts(panels(driver)["rnn"].find_elements("css selector", ".thumb-numbers"))
    assert len(numbers) == 1 and numbers[0].endswith("(this sentence)")
    pick(driver, "compare-select", "")

    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors


def stored_entropy(weights: bytes, m: Dict, head: int) -> float:
    """The mean row entropy (nats) of head ``head`` (0-based) of map ``m`` from the stored bytes."""
    size = m["rows"] * m["cols"]
    ws = [b / 255 for b in weights[m["offset"] + head * size : m["offset"] + (head + 1) * size]]
    return -sum(w * math.log(w) for w in ws if w > 0) / m["rows"]
