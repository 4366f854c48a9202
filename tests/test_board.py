"""TensorBoard images (training/board.py): one attention structure, the same kinds of images for both families."""

import os
from pathlib import Path

import pytest
import torch

from training.board import Board, NullBoard, attention_maps, hparam_values


def softmax(*shape):
    return torch.rand(*shape).softmax(-1)


def test_one_additive_layer_with_one_head_is_one_image_per_sentence():
    attention = {"cross": [softmax(2, 1, 5, 7)], "encoder_self": [], "decoder_self": []}  # the RNN's
    maps = list(attention_maps(attention, 2))
    assert [(m.b, m.tag, m.title) for m in maps] == [
        (0, "cross_layer1", "cross-attention, layer 1"),
        (1, "cross_layer1", "cross-attention, layer 1"),
    ]
    assert torch.equal(maps[1].weights, attention["cross"][0][1, 0])  # (T, S)


def test_several_heads_give_means_every_head_of_the_last_layer_and_the_encoder():
    cross = [softmax(1, 4, 5, 7), softmax(1, 4, 5, 7)]
    encoder = [softmax(1, 4, 7, 7), softmax(1, 4, 7, 7)]
    maps = list(attention_maps({"cross": cross, "encoder_self": encoder}, 1))
    assert [m.tag for m in maps] == [
        "cross_layer1_mean",
        "cross_layer2_mean",
        "cross_layer2_head1",
        "cross_layer2_head2",
        "cross_layer2_head3",
        "cross_layer2_head4",
        "encoder_self_layer2_mean",
    ]
    assert torch.allclose(maps[1].weights, cross[1][0].mean(0))
    assert torch.equal(maps[3].weights, cross[1][0, 1])
    assert maps[-1].kind == "encoder_self" and torch.allclose(maps[-1].weights, encoder[1][0].mean(0))


def test_null_board_has_the_boards_methods_and_no_others():
    public = {name for name in dir(Board) if not name.startswith("_")}
    assert public <= {name for name in dir(NullBoard) if not name.startswith("_")}
    NullBoard().scalars({"a": 1.0}, 1)
    with pytest.raises(AttributeError):
        NullBoard().scalar({"a": 1.0}, 1)  # a misspelt method fails on every rank, not only on rank 0


def test_hparam_values_are_flat_and_of_the_types_tensorboard_takes():
    values = hparam_values(
        {"model": {"d_model": 256, "norm": "pre"}, "trainer": {"max_steps": None, "betas": [0.9, 0.98]}}
    )
    assert values == {
        "model.d_model": 256,
        "model.norm": "pre",
        "trainer.max_steps": "null",
        "trainer.betas": "[0.9, 0.98]",
    }


def test_attention_images_are_drawn_in_a_worker_and_written_at_their_evaluations_step(tmp_path):
    """The maps go to a worker process at once (``training/drawing.py``); the images it draws are
    written at the step of their evaluation, however late they come back: ``close`` waits for them."""
    import io
    import os

    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = Board(tmp_path / "tb")
    tokens = ([["▁a", "▁b", "c", "</s>"]], [["▁x", "y", "</s>"]])
    for step in (3, 6):
        attention = {"cross": [softmax(1, 2, 3, 4)], "encoder_self": [], "decoder_self": []}
        board.attention(attention, *tokens, step)
    worker = next(iter(board.drawing.pool._processes.values()))
    assert worker.pid != os.getpid()
    board.close()
    assert board.drawing.pool is None  # the worker ended with the board
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0})
    events.Reload()
    tags = [
        "attention/sent0/cross_layer1_mean",
        "attention/sent0/cross_layer1_head1",
        "attention/sent0/cross_layer1_head2",
    ]
    assert sorted(events.Tags()["images"]) == sorted(tags)
    for tag in tags:
        images = events.Images(tag)
        assert [i.step for i in images] == [3, 6]
        png = Image.open(io.BytesIO(images[0].encoded_image_string))
        assert png.size == (images[0].width, images[0].height) and png.width == 580  # a card's width, twice


def test_a_worker_that_dies_is_a_warning_and_the_next_evaluation_draws_again(tmp_path, caplog):
    import logging
    from multiprocessing.connection import wait

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = Board(tmp_path / "tb")
    tokens = ([["▁a", "▁b", "</s>"]], [["▁x", "</s>"]])
    attention = {"cross": [softmax(1, 1, 2, 3)], "encoder_self": [], "decoder_self": []}
    board.attention(attention, *tokens, 1)
    worker = next(iter(board.drawing.pool._processes.values()))
    worker.kill()  # SIGKILL, as the kernel's OOM killer would
    assert wait([worker.sentinel], timeout=30)  # (the pool's own thread may reap it first)
    with caplog.at_level(logging.WARNING, logger="training.drawing"):
        assert board.drawing.finished(wait=True) == []  # nothing drawn, nothing raised
    assert "the attention images of step 1 were not drawn" in caplog.text
    board.attention(attention, *tokens, 2)  # a new worker
    board.close()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0})
    events.Reload()
    assert [i.step for i in events.Images("attention/sent0/cross_layer1")] == [2]


ORPHAN = """
import os, sys, torch
from training.board import Board
from training.run_folder import lock_run_folder
folder = sys.argv[1]
lock_run_folder(folder)
board = Board(os.path.join(folder, "tb"))
attention = {"cross": [torch.rand(1, 1, 2, 3).softmax(-1)], "encoder_self": [], "decoder_self": []}
board.attention(attention, [["a", "</s>"]], [["x", "</s>"]], 1)
print(next(iter(board.drawing.pool._processes)), flush=True)
os._exit(1)  # a trainer that dies without closing its board (a second Ctrl-C, a crash)
"""


def test_a_trainer_that_dies_leaves_no_drawing_worker_and_no_lock_on_its_folder(tmp_path):
    """The worker dies with the trainer and has let go of the run folder's lock: a resumed run can
    take the folder at once."""
    import fcntl
    import subprocess
    import sys
    import time

    from helpers import ROOT

    # a worker that outlived the trainer would hold its output open: the run would time out
    command = [sys.executable, "-c", ORPHAN, str(tmp_path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr[-2000:]
    worker = int(done.stdout.split()[0])
    end = time.monotonic() + 30
    while Path(f"/proc/{worker}").exists() and time.monotonic() < end:
        time.sleep(0.1)
    assert not Path(f"/proc/{worker}").exists()
    holder = os.open(tmp_path, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if anything still holds it
    finally:
        os.close(holder)
