"""The toolkit on a CUDA device: training (bf16 autocast and float32), exact resume, decoding against
the CPU, translate.py, a NCCL process group and CTranslate2.

Every test here is marked ``gpu`` and skipped without CUDA, so the suite passes on a machine
without one (CI). ``scripts/gpu_check.py run`` runs them on a GPU machine (docs/gpu_check.md);
with CUDA at hand, ``python -m pytest -m gpu tests/test_gpu.py`` runs them directly. Every test
names its device (``device=cuda``, ``--device cuda``): a test that fell back to the CPU would
pass for the wrong reason.

The models are those of ``helpers.learning_overrides`` (300 steps on 200 pairs of the Multi30k
slice; the CPU suite trains its Transformer in ``trained_slice_transformer``, conftest.py), trained
here on CUDA, so the thresholds are those of the CPU tests (tests/test_ctranslate2.py: above 80
BLEU on the memorised pairs).
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
import sacrebleu
import torch

from data.corpus import TRAIN
from data.tokenizer import normalize
from inference.decoding import translate_split
from inference.translator import Translator
from training import distributed
from training.trainer import Trainer
from training.validation import corpus_scores

from helpers import (
    LEARNING_PAIRS,
    ROOT,
    assert_one_error_line,
    learning_overrides,
    scalars,
    tiny_run,
    translate_process,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="no CUDA device: the gpu tests run on a GPU machine (scripts/gpu_check.py)",
    ),
]

if torch.cuda.is_available():
    # cuBLAS is reproducible only with a fixed workspace, read when this process first uses it:
    # set before any test runs (the resume test asks for deterministic kernels).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

FAMILIES = ["rnn", "transformer"]
STEPS = 300  # LEARNING_FAMILIES' trainer.max_steps


def slice_run(slice_dir: Path, cache: Path, family: str, amp: bool):
    """The overrides of ``learning_overrides`` (helpers.py) on CUDA, with ``trainer.amp`` set
    and a loss logged every 50 steps."""
    return learning_overrides(
        slice_dir, cache, family, "device=cuda", "trainer.log_every=50", f"trainer.amp={str(amp).lower()}"
    )


@pytest.fixture(scope="module")
def cuda_run(multi30k_slice, compose_config, tmp_path_factory):
    """``cuda_run(family, amp) -> (trainer, last.pt)``: the family trained on CUDA for 300 steps,
    once per module for each (family, amp)."""
    runs = {}
    cache = tmp_path_factory.mktemp("cuda_cache")

    def get(family: str, amp: bool):
        if (family, amp) not in runs:
            out = tmp_path_factory.mktemp(f"cuda_{family}_{'amp' if amp else 'fp32'}")
            trainer = Trainer(compose_config(slice_run(multi30k_slice, cache, family, amp)), out)
            trainer.fit()  # trainer.max_steps, then one evaluation that writes last.pt and best.pt
            trainer.close()
            runs[family, amp] = trainer, out / "checkpoints" / "last.pt"
        return runs[family, amp]

    return get


@pytest.fixture(scope="module")
def pairs(multi30k_slice):
    """The memorised training pairs (source, reference)."""
    src = (multi30k_slice / "train.de").read_text(encoding="utf-8").splitlines()[:LEARNING_PAIRS]
    tgt = (multi30k_slice / "train.en").read_text(encoding="utf-8").splitlines()[:LEARNING_PAIRS]
    return list(zip(src, tgt))


@pytest.fixture(scope="module")
def unseen(multi30k_slice):
    """The 30 test sentences of the slice: never trained on, so the outputs are not all certain."""
    return (multi30k_slice / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ----- training ---------------------------------------------------------------------------------


@pytest.mark.parametrize("amp", [True, False], ids=["bf16", "fp32"])
@pytest.mark.parametrize("family", FAMILIES)
def test_model_family_learns_on_cuda(family, amp, cuda_run):
    """As the slice Transformer on the CPU: above 80 BLEU on its own 200 training pairs (greedy, in
    the run's precision), and the loss of the last 50 steps far below that of the first 50."""
    trainer, _ = cuda_run(family, amp)
    assert trainer.setup.device.type == "cuda" and next(trainer.setup.model.parameters()).is_cuda
    assert trainer.progress.step == STEPS and trainer.progress.skipped_steps == 0
    assert (trainer.setup.precision == "bfloat16") == amp
    losses = [loss for _, loss in scalars(trainer.setup.out_dir / "tb", "train/loss")]
    assert len(losses) == STEPS // 50 and losses[-1] < 0.25 * losses[0], losses
    train = trainer.setup.data.datasets[TRAIN]
    references = trainer.setup.data.tokenizer.decode_tgt(train.tgt)  # the (normalised) training targets
    hypotheses = translate_split(
        trainer.setup.model,
        train,
        trainer.setup.data.tokenizer,
        4000,
        trainer.setup.device,
        autocast=trainer.setup.autocast,
    )
    bleu = corpus_scores(hypotheses, references)["bleu"]
    print(
        f"{family} {trainer.setup.precision}: losses {losses}, BLEU {bleu:.1f} on {len(train)} training pairs"
    )
    assert bleu > 80.0, (
        f"{family} ({trainer.setup.precision}) reached only {bleu:.1f} BLEU on its own training pairs"
    )


@pytest.fixture
def deterministic_kernels():
    """Deterministic CUDA kernels while the test runs (where an operation has none, a warning)."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize(
    "family, extra",
    [
        ("transformer", []),  # with dropout: the CUDA generator's state must come back exactly
        # cuDNN keeps the RNN's dropout state where no checkpoint can hold it: no dropout
        ("rnn", ["model.dropout=0.0"]),
    ],
)
def test_a_run_stopped_and_resumed_on_cuda_ends_where_the_run_never_stopped_does(
    family, extra, multi30k_slice, compose_config, tmp_path, deterministic_kernels
):
    """20 steps in one go against 10, a stop (last.pt) and 10 more after ``resume()``, as
    tests/test_trainer.py does on the CPU, in bf16 autocast (``trainer.amp``'s default)."""
    common = [
        "device=cuda",
        f"data.root={multi30k_slice}",
        f"data.cache_dir={tmp_path / 'cache'}",
        "data.vocab_size=500",
        f"model={family}",
        *extra,
        "trainer.batch_tokens=1200",
        "trainer.warmup_steps=3",
        "trainer.log_every=1",
        "trainer.eval_every=1000000",
        "trainer.attention_samples=0",
        "trainer.max_epochs=null",
        "trainer.max_steps=20",
    ]

    def trainer(folder: Path, *more: str) -> Trainer:
        return Trainer(compose_config([*common, *more]), folder)

    weights = {}
    for name in ("straight", "again"):  # two runs never stopped: how far CUDA alone sets them apart
        run = trainer(tmp_path / name)
        run.fit(evaluate_last=False)
        run.close()
        weights[name] = run.setup.model.state_dict()
    first = trainer(tmp_path / "stopped")
    assert "max_steps" in first.fit(max_steps=10)  # evaluates and saves last.pt at step 10
    first.close()
    resumed = trainer(
        tmp_path / "stopped", f"trainer.resume={tmp_path / 'stopped' / 'checkpoints' / 'last.pt'}"
    )
    assert resumed.resume() and resumed.progress.step == 10
    resumed.fit(evaluate_last=False)
    resumed.close()
    assert resumed.setup.device.type == "cuda" and resumed.progress.step == 20
    # Not bitwise as on the CPU (tests/test_faults.py): a CUDA kernel that adds up with atomics may
    # add up in another order from call to call (docs/gpu_check.md says so), and torch has no
    # deterministic form of every kernel. So the resumed run must be as close to the run never
    # stopped as a second such run is (10 x that distance, plus float32's last bits), far closer
    # than a wrong resume leaves it: other dropout masks, batches or Adam moments move the weights
    # by about the learning rate (1e-3) and the losses in their third digit.
    losses = {name: dict(scalars(tmp_path / name / "tb", "train/loss")) for name in weights}
    stopped = dict(scalars(tmp_path / "stopped" / "tb", "train/loss"))
    assert sorted(stopped) == sorted(losses["straight"]) == list(range(1, 21))
    for step, expected in losses["straight"].items():
        noise = abs(losses["again"][step] - expected)
        assert abs(stopped[step] - expected) <= 10 * noise + 1e-5 * expected, (step, stopped[step], expected)
    for name, tensor in resumed.setup.model.state_dict().items():
        expected = weights["straight"][name].float()
        noise = (weights["again"][name].float() - expected).abs().max().item()
        off = (tensor.float() - expected).abs().max().item()
        assert off <= 10 * noise + 1e-5, (
            f"{name}: {off:.3g} from the run never stopped; two such runs: {noise:.3g}"
        )


def test_train_py_on_cuda_records_the_device_and_the_decoding_precision(multi30k_slice, tmp_path):
    """A whole ``train.py`` run (Hydra, test decoding, results.json) on CUDA: bf16 by default, and
    translate.py's ``--dtype auto`` decodes its checkpoint as its results were decoded."""
    run = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            *tiny_run(
                run,
                multi30k_slice,
                tmp_path / "cache",
                "device=cuda",
                "trainer.amp=auto",  # the default, which tiny_run pins to float32 for the CPU
                "trainer.max_steps=20",
                "trainer.eval_every=10",
            ),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((run / "results.json").read_text())
    assert results["device"].startswith("cuda") and results["steps"] == 20
    assert results["decode_dtype"] == "bfloat16"  # trainer.amp=auto (the default) on CUDA
    assert Translator.from_checkpoint(run / "checkpoints" / "best.pt", device="cuda").dtype == "bfloat16"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_ranks_on_two_gpus_train_like_one_process_with_the_same_global_batch(multi30k_slice, tmp_path):
    """tests/test_distributed.py's first test over NCCL: 2 ranks x 500 tokens against 1 process
    accumulating 2 x 500 tokens, in float32 (bf16 rounding would blur the comparison)."""

    def command(run: Path, *launcher: str, extra=()):
        return [
            *launcher,
            str(ROOT / "train.py"),
            *tiny_run(
                run,
                multi30k_slice,
                tmp_path / "cache",
                "device=cuda",
                "trainer.amp=false",
                "model.dropout=0.0",
                "trainer.schedule=constant",
                "trainer.warmup_steps=0",
                "trainer.lr=0.01",
                "trainer.log_every=1",
                "trainer.max_steps=6",
                "trainer.batch_tokens=500",
                *extra,
            ),
        ]

    single = subprocess.run(
        command(tmp_path / "single", sys.executable, extra=["trainer.accumulate=2"]),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert single.returncode == 0, single.stderr[-2000:]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    done = subprocess.run(
        command(tmp_path / "ddp", *torchrun), capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    one = scalars(tmp_path / "single" / "tb", "train/loss")
    two = scalars(tmp_path / "ddp" / "tb", "train/loss")
    assert [s for s, _ in two] == [s for s, _ in one] == list(range(1, 7))
    assert [v for _, v in two] == pytest.approx([v for _, v in one], rel=1e-3)
    log = (tmp_path / "ddp" / "train.log").read_text()
    assert "device cuda:0" in log and "world of 2 ranks (NCCL)" in log


# ----- decoding ---------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("beam", [1, 4])
def test_a_search_on_cuda_waits_for_the_device_once_every_8_steps(family, beam, cuda_run, unseen):
    """torch's own count of the synchronisations (``set_sync_debug_mode("warn")`` warns at each):
    32 steps more cost 4 more, as the CPU test's count of host reads says (tests/test_search.py)."""
    import warnings

    from data.specials import BOS_ID, EOS_ID, PAD_ID
    from models.search import SYNC_EVERY, search
    from models.search_options import SearchOptions

    trainer, _ = cuda_run(family, True)
    model = trainer.setup.model.eval()
    ids = [row + [EOS_ID] for row in trainer.setup.data.tokenizer.encode_src(unseen[:8])]
    width = max(map(len, ids))
    src = torch.tensor([row + [PAD_ID] * (width - len(row)) for row in ids], device="cuda")

    def syncs(steps: int) -> List[str]:
        """Where the search of ``steps`` steps waits for the device: a ``file:line`` each time."""
        options = SearchOptions(beam_size=beam, max_len=steps)
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                # never EOS: every sentence runs to max_len
                search(NeverEnds(model, EOS_ID), src, src != PAD_ID, BOS_ID, EOS_ID, options, PAD_ID)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return [f"{Path(w.filename).name}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)]

    assert SYNC_EVERY == 8
    # a first search may wait once more for a library's lazy set-up: on an H200 the RNN's greedy
    # search, measured first at 48 steps, waited once more than 4 over the 16-step one
    syncs(8)
    short, long = syncs(16), syncs(48)
    assert len(long) - len(short) == 4, f"16 steps wait at {short}, 48 steps at {long}"


class NeverEnds(torch.nn.Module):
    """A model whose EOS is never chosen (its logit is -1e4): every search runs to its limit."""

    def __init__(self, model: torch.nn.Module, eos_id: int):
        super().__init__()
        self.model, self.eos_id = model, eos_id

    def encode(self, src, src_mask, need_weights=False):
        return self.model.encode(src, src_mask, need_weights)

    def start_state(self, encoded):
        return self.model.start_state(encoded)

    def decode_step(self, tokens, state):
        logits, state = self.model.decode_step(tokens, state)
        logits[:, self.eos_id] = -1e4
        return logits, state


@pytest.mark.parametrize("family", FAMILIES)
def test_the_flops_of_a_step_on_cuda_are_the_cpus(family, cuda_run):
    """The model FLOPs counted on CUDA (bf16 autocast, cuDNN's RNN and fused attention kernels at
    hand) equal the CPU's count of the same batches (training/efficiency.py)."""
    import copy
    from contextlib import nullcontext

    from training.efficiency import step_flops

    trainer, _ = cuda_run(family, True)
    batches = [trainer.collate(b, 0) for b in list(trainer.sampler)[:2]]
    on_cuda = step_flops(
        trainer.setup.model,
        batches,
        trainer.setup.tc,
        trainer.setup.world,
        trainer.setup.device,
        trainer.setup.autocast,
    )
    cpu_model = copy.deepcopy(trainer.setup.model).cpu()
    on_cpu = step_flops(
        cpu_model, batches, trainer.setup.tc, trainer.setup.world, torch.device("cpu"), nullcontext
    )
    assert on_cuda == on_cpu > 0


def test_attention_on_cuda_never_takes_cudnn_kernels(cuda_run):
    """A training on CUDA turns cuDNN's attention off (a graph for every new shape)."""
    cuda_run("transformer", True)
    assert not torch.backends.cuda.cudnn_sdp_enabled()


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_decoding_on_cuda_agrees_with_the_cpu(family, cuda_run, unseen):
    """One checkpoint, greedy, float32 on both devices: the same text for nearly every sentence
    (the devices' kernels round differently, which may flip a near tie), on sentences the model
    never saw, where its choices are least certain."""
    _, checkpoint = cuda_run(family, True)
    gpu = Translator.from_checkpoint(checkpoint, device="cuda", dtype="float32")
    cpu = Translator.from_checkpoint(checkpoint, device="cpu", dtype="float32")
    assert gpu.engine.device.type == "cuda" and (gpu.dtype, cpu.dtype) == ("float32", "float32")
    on_gpu = [t.text for t in gpu.translate(unseen, beam=1)]
    on_cpu = [t.text for t in cpu.translate(unseen, beam=1)]
    same = sum(a == b for a, b in zip(on_gpu, on_cpu))
    assert len(on_gpu) == len(unseen) == 30 and sum(map(len, on_gpu)) > 0
    assert same >= 0.9 * len(unseen), [(a, b) for a, b in zip(on_gpu, on_cpu) if a != b]


@pytest.mark.parametrize("amp", [True, False], ids=["bf16", "fp32"])
def test_the_default_dtype_is_the_runs_precision_and_bfloat16_still_translates(amp, cuda_run, pairs):
    """``dtype=None`` decodes as the run was trained (results.json's ``decode_dtype``); bf16
    decoding of a run trained either way still gives back the memorised references."""
    trainer, checkpoint = cuda_run("transformer", amp)
    assert Translator.from_checkpoint(checkpoint, device="cuda").dtype == trainer.setup.precision
    assert Translator.from_checkpoint(checkpoint, device="cpu").dtype == "float32"
    bf16 = Translator.from_checkpoint(checkpoint, device="cuda", dtype="bfloat16")
    assert bf16.dtype == "bfloat16"
    chosen = pairs[:30]
    hyps = [t.text for t in bf16.translate([src for src, _ in chosen], beam=5)]
    bleu = sacrebleu.corpus_bleu(hyps, [[normalize(tgt) for _, tgt in chosen]]).score
    assert bleu > 70, f"bf16 decoding: BLEU {bleu:.1f} on memorised pairs; first lines {hyps[:3]}"


@pytest.mark.parametrize(
    "dtype", [[], ["--dtype", "float32"], ["--dtype", "bfloat16"]], ids=["auto", "float32", "bfloat16"]
)
def test_translate_py_runs_on_cuda(dtype, cuda_run, pairs, tmp_path):
    """translate.py as users run it, ``--device cuda``, beam 5: exit 0, one line per input line,
    the memorised references (BLEU above tests/test_translate.py's 70)."""
    _, checkpoint = cuda_run("transformer", True)
    chosen = pairs[:30]
    source = tmp_path / "in.de"
    source.write_text("".join(src + "\n" for src, _ in chosen), encoding="utf-8")
    done = translate_process("--checkpoint", checkpoint, "--device", "cuda", *dtype, "--input", source)
    assert done.returncode == 0, done.stderr
    hyps = done.stdout.splitlines()
    assert len(hyps) == len(chosen), done.stderr
    bleu = sacrebleu.corpus_bleu(hyps, [[normalize(tgt) for _, tgt in chosen]]).score
    assert bleu > 70, f"translate.py {dtype}: BLEU {bleu:.1f}; first lines {hyps[:3]}"


# ----- a process group over NCCL -----------------------------------------------------------------


def test_the_collectives_work_over_nccl_in_a_world_of_one():
    """training/distributed.py's collectives on a NCCL group of one rank (one GPU is enough):
    each gives back this rank's value, computed on the GPU."""
    device = torch.device("cuda", 0)
    torch.distributed.init_process_group(
        "nccl", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{free_port()}", device_id=device
    )
    try:
        assert distributed.active() and torch.distributed.get_backend() == "nccl"
        counted = distributed.total_on_device(7, device)
        assert counted.device == device and float(counted) == 7.0
        loss = torch.tensor(2.5, dtype=torch.float64, device=device)
        summed = distributed.total_on_device(loss, device)
        assert summed.dtype == torch.float64 and float(summed) == 2.5 and summed is not loss
        assert distributed.gather({"rank": 0}, device) == [{"rank": 0}]
        assert distributed.broadcast("outputs/run", device) == "outputs/run"
        assert distributed.agree_to_stop(15, False, device) == (15, False)
        assert distributed.agree_to_stop(None, True, device) == (None, True)
        assert distributed.agree_to_stop(None, False, device) == (None, False)
    finally:
        torch.distributed.destroy_process_group()
    assert not distributed.active()


# ----- CTranslate2 ------------------------------------------------------------------------------


def test_ctranslate2_translates_on_cuda_or_falls_back_to_the_cpu(cuda_run, pairs, tmp_path):
    """An export of the CUDA-trained Transformer, ``--engine ctranslate2``. ``--device auto`` always
    translates: on the GPU where CTranslate2's CUDA libraries load (4.8.5 needs CUDA 12's
    cuBLAS), else on the CPU with a warning; ``--device cuda`` then fails in one line that names
    the missing library."""
    ctranslate2 = pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed")
    from inference.ctranslate2_engine import missing_cuda_libraries
    from inference.ctranslate2_export import export_checkpoint

    _, checkpoint = cuda_run("transformer", True)
    export = tmp_path / "export"
    export_checkpoint(checkpoint, export, "float32")
    chosen = pairs[:30]
    sources = "".join(src + "\n" for src, _ in chosen)
    references = [normalize(tgt) for _, tgt in chosen]
    engine = ["--engine", "ctranslate2", "--checkpoint", export, "--beam", 5]
    on_cpu = translate_process(*engine, "--device", "cpu", stdin=sources)
    auto = translate_process(*engine, "--device", "auto", stdin=sources)
    cuda = translate_process(*engine, "--device", "cuda", stdin=sources)
    missing = missing_cuda_libraries()
    print(f"CTranslate2 {ctranslate2.__version__}: CUDA libraries missing here: {missing or 'none'}")
    assert ctranslate2.get_cuda_device_count() > 0, "CTranslate2 sees no GPU on a machine with CUDA"
    assert on_cpu.returncode == 0 and auto.returncode == 0, on_cpu.stderr + auto.stderr
    assert sacrebleu.corpus_bleu(auto.stdout.splitlines(), [references]).score > 70
    if missing:
        warnings = [line for line in auto.stderr.splitlines() if line.startswith("warning:")]
        assert any(missing[0] in line for line in warnings), auto.stderr
        assert auto.stdout == on_cpu.stdout  # the same engine on the same CPU
        assert_one_error_line(cuda, missing[0])
    else:
        assert cuda.returncode == 0, cuda.stderr
        assert cuda.stdout == auto.stdout  # auto took the GPU
        assert sacrebleu.corpus_bleu(cuda.stdout.splitlines(), [references]).score > 70
