"""The docs' screenshots of the Attention tab, taken from trained runs in a real browser.

    python scripts/viewer_screenshots.py --logdir LOGS --out docs

Takes a TensorBoard log folder with three runs (links to runs' ``tb/`` folders will do):
``transformer`` and ``rnn``, the default Transformer and RNN trained to the end (their attention
samples, ``nmt_attention/sent<i>``, at every evaluation), and ``gold_transformer``, what
``scripts/align.py --tensorboard DIR`` wrote for the Transformer in ``DIR`` (gold-set pairs,
``nmt_attention/gold<i>`` at step 0, with the gold links, the model's links and the heads'
numbers). Starts the venv's ``tensorboard`` on it (with the plugin) on a free port, opens the tab
in headless Chromium through selenium (as ``tests/test_viewer_browser.py`` does: Debian's
``chromium`` and ``chromium-driver``, ``pip install selenium``) and writes into ``--out``:

- ``attention_viewer.png``: the whole window; ``transformer``, sentence ``--sentence`` at its last
  step (the final evaluation), cross attention, the last layer (``--layer``), head ``--head`` large,
  in subwords;
- ``attention_viewer_side_by_side.png``: the panels; the Transformer beside the RNN on the same
  sentence, cross attention of layer 1 (the RNN has one), ``--side-head`` (the Transformer's mean
  of heads; the RNN's one map), in words;
- ``attention_gold.png``: the panel of ``gold_transformer``, pair ``--gold-pair``, cross attention
  of the layer (and head) that the model's links were read from (the last layer's mean of heads
  when they were read from all layers), in ``--gold-units``, with the gold boxes, the model's
  links and the numbers under each head.

The docs' images (2026-11-26) show the default runs of ``+experiment=attention_grid``, seed 1,
trained to the end (``RUNS``: the sweep's folder), and ``scripts/align.py --gold ... --tensorboard
ALIGN`` on that Transformer's checkpoint and the German-English gold set; they were made with

    mkdir LOGS; ln -s RUNS/9_model=transformer,model.attention=scaled_dot,seed=1/tb LOGS/transformer
    ln -s RUNS/0_model=rnn,model.attention=additive,seed=1/tb LOGS/rnn
    ln -s ALIGN LOGS/gold_transformer
    python scripts/viewer_screenshots.py --logdir LOGS --out docs --sentence 2 --head 3 --gold-pair 0

(sentence 2, the tab's "3: sent2", and head 3 of the last layer: the clearest of the four
validation sentences and one of the sharpest heads; gold pair 0: short. Its links came from all
layers, so the last layer's mean of heads shows.) Other runs in LOGS are left alone.
"""

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
RUNS = ("transformer", "rnn", "gold_transformer")
TAB_FRAME = "iframe[src*='nmt_attention']"  # TensorBoard shows the tab's page in this iframe
WAIT = 30  # seconds for the tab to show what a step asked for


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    add = parser.add_argument
    add("--logdir", type=Path, required=True, help="runs transformer, rnn and gold_transformer")
    add("--out", type=Path, default=Path("docs"), help="folder for the three PNG files")
    add("--sentence", type=int, default=2, help="the validation sentence: tag nmt_attention/sent<N>")
    add("--layer", type=int, help="the Transformer's layer in attention_viewer.png (None: its last)")
    add("--head", default="3", help="its head there: a number, mean or max")
    add("--side-head", default="mean", help="the head beside the RNN: mean, max or a number")
    add("--gold-pair", type=int, default=0, help="the gold-set pair: tag nmt_attention/gold<N>")
    add("--gold-units", default="words", choices=("words", "subwords"))
    add("--zoom", type=int, default=28, help="px per map cell (the tab's zoom, 14 to 48)")
    add("--window", default="1600x1300", help="the browser window, WIDTHxHEIGHT")
    add("--gold-window", default="1100x1500", help="the window for attention_gold.png")
    return parser.parse_args(argv)


# ----- the server and the browser ---------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


@contextmanager
def tensorboard(logdir: Path, log: Path, runs: Sequence[str] = RUNS):
    """The address of the venv's ``tensorboard`` on ``logdir``, once the plugin lists ``runs``."""
    exe = Path(sys.executable).parent / "tensorboard"
    port = free_port()
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [str(exe), "--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        found, deadline = set(), time.monotonic() + 120
        while not set(runs) <= found and time.monotonic() < deadline and server.poll() is None:
            try:
                found = {r["run"] for r in get_json(f"{url}/data/plugin/nmt_attention/runs")}
            except OSError:
                pass
            time.sleep(1)
        if not set(runs) <= found:
            sys.exit(f"tensorboard lists runs {sorted(found)}, not {list(runs)}; its log: {log}")
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


@contextmanager
def browser(url: str, window: str):
    """Headless Chromium on the Attention tab of ``url``, inside the tab's iframe."""
    os.environ["SE_OFFLINE"] = "true"  # selenium must not try to download a driver
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    width, height = window.split("x")
    for arg in ("--headless=new", "--no-sandbox", "--hide-scrollbars", f"--window-size={width},{height}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.get(f"{url}/#nmt_attention")
        WebDriverWait(driver, WAIT).until(lambda d: d.find_elements("css selector", TAB_FRAME))
        driver.switch_to.frame(driver.find_element("css selector", TAB_FRAME))
        WebDriverWait(driver, WAIT).until(lambda d: d.find_elements("css selector", "canvas.map"))
        yield driver
    finally:
        driver.quit()


# ----- driving the tab --------------------------------------------------------------------------


def settle(driver) -> None:
    """Wait until the tab has redrawn (it empties its status line), and fail on its error line."""
    from selenium.webdriver.support.ui import WebDriverWait

    status = driver.find_element("id", "status")
    WebDriverWait(driver, WAIT).until(lambda d: status.text == "" or "error" in status.get_attribute("class"))
    if status.text:
        sys.exit(f"the tab says: {status.text}")


def choose(driver, **controls: str) -> None:
    """Pick each value in its <select>, in order: ``choose(driver, run="rnn", kind="cross")``."""
    from selenium.webdriver.support.ui import Select

    for control, value in controls.items():
        Select(driver.find_element("id", f"{control}-select")).select_by_value(str(value))
        settle(driver)


def last_option(driver, control: str) -> str:
    from selenium.webdriver.support.ui import Select

    return Select(driver.find_element("id", f"{control}-select")).options[-1].get_attribute("value")


def set_slider(driver, slider: str, value: str) -> None:
    """Move a range input (``step-slider``, ``zoom-slider``) to ``value`` ("max": its end)."""
    driver.execute_script(
        """const s = document.getElementById(arguments[0]);
        s.value = arguments[1] === "max" ? s.max : arguments[1];
        s.dispatchEvent(new Event("input"));""",
        slider,
        str(value),
    )
    settle(driver)


def show(driver, run: str, tag: str, beside: str = "") -> None:
    """``run``'s sentence ``tag`` at its last step, ``beside`` next to it; cross attention."""
    choose(driver, run=run, compare=beside, sentence=tag)
    set_slider(driver, "step-slider", "max")  # the step of the run shown before stays otherwise
    choose(driver, kind="cross", order="number")


def warn_if_cut(driver, css: str, path: Path) -> None:
    """Say so when ``css`` runs past the bottom of the window: the screenshot lacks its end."""
    below = driver.execute_script(
        "return document.querySelector(arguments[0]).getBoundingClientRect().bottom - window.innerHeight;",
        css,
    )
    if below > 0:
        print(f"warning: {path.name} lacks the last {below:.0f} px of {css}: give a taller window")


def save_window(driver, path: Path) -> None:
    warn_if_cut(driver, "#panels", path)
    driver.switch_to.default_content()
    driver.save_screenshot(str(path))
    driver.switch_to.frame(driver.find_element("css selector", TAB_FRAME))
    print(f"wrote {path}")


def save_element(driver, css: str, path: Path) -> None:
    warn_if_cut(driver, css, path)
    driver.find_element("css selector", css).screenshot(str(path))
    print(f"wrote {path}")


def console_errors(driver) -> None:
    """Print the browser console's errors (TensorBoard's page and the tab's), if any."""
    errors = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    if errors:
        print("browser console errors:", *errors, sep="\n  ")


# ----- the three screenshots --------------------------------------------------------------------


def viewer(driver, args: argparse.Namespace) -> None:
    show(driver, "transformer", f"nmt_attention/sent{args.sentence}")
    choose(driver, units="subwords", layer=args.layer or last_option(driver, "layer"), head=args.head)
    save_window(driver, args.out / "attention_viewer.png")


def side_by_side(driver, args: argparse.Namespace) -> None:
    show(driver, "transformer", f"nmt_attention/sent{args.sentence}", beside="rnn")
    choose(driver, units="words", layer=1, head=args.side_head)
    save_element(driver, "#panels", args.out / "attention_viewer_side_by_side.png")


def gold(driver, url: str, args: argparse.Namespace) -> None:
    tag = f"nmt_attention/gold{args.gold_pair}"
    query = urllib.parse.urlencode({"run": "gold_transformer", "tag": tag, "step": 0})
    method = get_json(f"{url}/data/plugin/nmt_attention/attention?{query}").get("links_method", "")
    layer = re.search(r"\blayer (\d+)", method)  # "layer 3, head 2, predict": that map
    head = re.search(r"\bhead (\d+),", method)  # "all layers, all heads": the last layer's mean
    show(driver, "gold_transformer", tag)
    choose(driver, units=args.gold_units, layer=layer.group(1) if layer else last_option(driver, "layer"))
    choose(driver, head=head.group(1) if head else "mean")
    for toggle in driver.find_elements("css selector", "input.gold-toggle, input.links-toggle"):
        if not toggle.is_selected():
            toggle.click()
    print(f"gold pair {args.gold_pair}: model links by {method!r}")
    save_element(driver, "#panels", args.out / "attention_gold.png")


def main(argv=None) -> int:
    args = parse_args(argv)
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            sys.exit(f"{path} not found: apt-get install -y chromium chromium-driver")
    args.out.mkdir(parents=True, exist_ok=True)
    log = Path(tempfile.gettempdir()) / f"viewer_screenshots_tensorboard_{os.getpid()}.log"
    with tensorboard(args.logdir, log) as url:
        with browser(url, args.window) as driver:
            set_slider(driver, "zoom-slider", args.zoom)
            viewer(driver, args)
            side_by_side(driver, args)
            console_errors(driver)
        with browser(url, args.gold_window) as driver:  # narrower: the panel is one run's
            set_slider(driver, "zoom-slider", args.zoom)
            gold(driver, url, args)
            console_errors(driver)
    return 0


if __name__ == "__main__":
    sys.exit(main())
