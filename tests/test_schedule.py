"""Learning-rate schedules (training/schedule.py): pure functions of the step."""

import pytest

from training.schedule import FITTED, OPEN_ENDED, SCHEDULES, lr_at

LR, WARMUP = 1e-3, 100


HORIZON = 1000


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_linear_warmup_to_the_peak(schedule):
    rate = lambda step: lr_at(step, schedule, LR, WARMUP, horizon=HORIZON)  # noqa: E731
    rates = [rate(step) for step in range(1, WARMUP + 1)]
    assert rates[0] == pytest.approx(LR / WARMUP)
    assert rates[WARMUP // 2 - 1] == pytest.approx(LR / 2)
    assert rates[-1] == pytest.approx(LR)
    assert all(a < b for a, b in zip(rates, rates[1:]))
    assert max(rate(step) for step in range(1, HORIZON)) == pytest.approx(LR)


@pytest.mark.parametrize("schedule", FITTED)
@pytest.mark.parametrize("horizon", [7, 150, 1000, 99_991])
def test_fitted_schedules_end_at_min_lr_on_the_last_step(schedule, horizon):
    floor = 1e-5
    rates = [
        lr_at(step, schedule, LR, WARMUP, min_lr=floor, horizon=horizon) for step in range(1, horizon + 3)
    ]
    assert max(rates) == pytest.approx(LR)
    assert rates[horizon - 1] == pytest.approx(floor)  # step ``horizon``: the run's last
    assert rates[horizon - 2] > floor  # not before
    assert rates[horizon:] == [pytest.approx(floor)] * 2  # a longer run stays at the floor
    peak = rates.index(max(rates))
    assert all(a >= b for a, b in zip(rates[peak:], rates[peak + 1 :]))  # never up again


@pytest.mark.parametrize("schedule", FITTED)
def test_a_run_shorter_than_four_warmups_warms_up_over_a_quarter_of_it(schedule):
    horizon = 200  # the warm-up of 100 would be half the run
    rates = [lr_at(step, schedule, LR, WARMUP, horizon=horizon) for step in range(1, horizon + 1)]
    assert rates.index(max(rates)) == horizon // 4 - 1
    assert rates[0] == pytest.approx(LR / (horizon // 4))


def test_cosine_is_halfway_down_at_the_middle_of_the_decay_and_linear_too():
    middle = WARMUP + (HORIZON - WARMUP) // 2
    for schedule in FITTED:
        assert lr_at(middle, schedule, LR, WARMUP, horizon=HORIZON) == pytest.approx(LR / 2)
    # cosine stays higher early in the decay, lower late
    early, late = WARMUP + 100, HORIZON - 100
    assert lr_at(early, "cosine", LR, WARMUP, horizon=HORIZON) > lr_at(
        early, "linear", LR, WARMUP, horizon=HORIZON
    )
    assert lr_at(late, "cosine", LR, WARMUP, horizon=HORIZON) < lr_at(
        late, "linear", LR, WARMUP, horizon=HORIZON
    )


@pytest.mark.parametrize("schedule", FITTED)
def test_a_fitted_schedule_without_a_horizon_raises(schedule):
    with pytest.raises(ValueError, match="length in steps"):
        lr_at(10, schedule, LR, WARMUP)


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
        lr_at(10, "polynomial", LR, WARMUP)


@pytest.mark.parametrize("schedule", OPEN_ENDED)
def test_open_ended_schedules_ignore_the_horizon(schedule):
    assert lr_at(500, schedule, LR, WARMUP, horizon=600) == lr_at(500, schedule, LR, WARMUP)


def test_step_zero_is_the_first_step():
    assert lr_at(0, "inverse_sqrt", LR, WARMUP) == lr_at(1, "inverse_sqrt", LR, WARMUP)
