"""Learning-rate schedules (training/schedule.py): pure functions of the step."""

import pytest

from training.schedule import SCHEDULES, lr_at

LR, WARMUP = 1e-3, 100


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_linear_warmup_to_the_peak(schedule):
    rates = [lr_at(step, schedule, LR, WARMUP) for step in range(1, WARMUP + 1)]
    assert rates[0] == pytest.approx(LR / WARMUP)
    assert rates[WARMUP // 2 - 1] == pytest.approx(LR / 2)
    assert rates[-1] == pytest.approx(LR)
    assert all(a < b for a, b in zip(rates, rates[1:]))
    assert max(lr_at(step, schedule, LR, WARMUP) for step in range(1, 1000)) == pytest.approx(LR)


def test_inverse_sqrt_halves_at_four_times_the_warmup():
    assert lr_at(4 * WARMUP, "inverse_sqrt", LR, WARMUP) == pytest.approx(LR / 2)
    assert lr_at(16 * WARMUP, "inverse_sqrt", LR, WARMUP) == pytest.approx(LR / 4)


def test_inverse_sqrt_without_warmup():
    assert lr_at(1, "inverse_sqrt", LR, 0) == pytest.approx(LR)
    assert lr_at(4, "inverse_sqrt", LR, 0) == pytest.approx(LR / 2)


def test_exponential_halves_every_decay_steps_after_the_warmup():
    rate = lambda step: lr_at(step, "exponential", LR, WARMUP, decay_rate=0.5, decay_steps=300)  # noqa: E731
    assert rate(WARMUP + 300) == pytest.approx(LR / 2)
    assert rate(WARMUP + 600) == pytest.approx(LR / 4)
    assert rate(WARMUP + 150) == pytest.approx(LR / 2**0.5)


def test_constant_stays_at_the_peak():
    assert lr_at(10 * WARMUP, "constant", LR, WARMUP) == LR


@pytest.mark.parametrize("schedule", ["inverse_sqrt", "exponential"])
def test_min_lr_floor_after_warmup(schedule):
    floor = 1e-4
    late = lr_at(10**7, schedule, LR, WARMUP, decay_steps=100, min_lr=floor)
    assert late == floor
    assert lr_at(10**7, schedule, LR, WARMUP, decay_steps=100) < floor
    # The floor does not lift the warm-up.
    assert lr_at(1, schedule, LR, WARMUP, min_lr=floor) == pytest.approx(LR / WARMUP)


def test_unknown_schedule_raises():
    with pytest.raises(ValueError, match="cosine"):
        lr_at(10, "cosine", LR, WARMUP)


def test_step_zero_is_the_first_step():
    assert lr_at(0, "inverse_sqrt", LR, WARMUP) == lr_at(1, "inverse_sqrt", LR, WARMUP)
