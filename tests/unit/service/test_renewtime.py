"""Renewal timing: the default moment, ARI windows, re-asking, retries up to expiry."""

from __future__ import annotations

import random

import pytest

from certagent.service.renewtime import (
    ARI_DEFAULT_CHECK,
    LEASE_FLOOR,
    MAX_JITTER,
    RETRY_FLOOR,
    SHORT_LIFETIME,
    RenewPolicy,
    Scaled,
    cert_rng,
    lifetime_fraction,
)

DAY = 86400.0
T0 = 1_800_000_000.0


class Fixed(random.Random):
    """A random source that always draws ``value``."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


# --- the default moment ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lifetime", "fraction"),
    [
        (90 * DAY, 2 / 3),
        (47 * DAY, 2 / 3),
        (SHORT_LIFETIME, 2 / 3),
        (SHORT_LIFETIME - 1, 0.5),
        (6 * DAY, 0.5),
        (120.0, 0.5),
    ],
)
def test_lifetime_fraction_is_two_thirds_or_one_half_under_ten_days(
    lifetime: float, fraction: float
) -> None:
    assert lifetime_fraction(lifetime) == pytest.approx(fraction)


def test_default_without_jitter_is_two_thirds_of_ninety_days() -> None:
    at = RenewPolicy(jitter=0.0).default_at(T0, T0 + 90 * DAY, Fixed(0.9))
    assert at == pytest.approx(T0 + 60 * DAY)


def test_default_without_jitter_is_half_of_six_days() -> None:
    at = RenewPolicy(jitter=0.0).default_at(T0, T0 + 6 * DAY, Fixed(0.1))
    assert at == pytest.approx(T0 + 3 * DAY)


@pytest.mark.parametrize(("draw", "shift"), [(0.0, -1.0), (0.5, 0.0), (0.999999, 1.0)])
def test_default_jitter_moves_by_at_most_its_share_of_the_lifetime_either_way(
    draw: float, shift: float
) -> None:
    lifetime = 90 * DAY
    at = RenewPolicy(jitter=0.05).default_at(T0, T0 + lifetime, Fixed(draw))
    assert at == pytest.approx(T0 + 60 * DAY + shift * 0.05 * lifetime, abs=1.0)


def test_default_jitter_is_bounded_and_spread_over_many_certificates() -> None:
    policy = RenewPolicy(jitter=0.05)
    lifetime = 90 * DAY
    times = [
        policy.default_at(T0, T0 + lifetime, cert_rng(f"{serial:X}")) for serial in range(2000)
    ]
    low, high = T0 + 60 * DAY - 4.5 * DAY, T0 + 60 * DAY + 4.5 * DAY
    assert all(low <= t <= high for t in times)
    # spread, not bunched: every ninth of the jitter range holds some of them
    bins = [0] * 9
    for t in times:
        bins[min(8, int((t - low) / (high - low) * 9))] += 1
    assert min(bins) > 2000 / 9 * 0.6, bins


def test_default_is_the_same_for_one_certificate_on_every_node() -> None:
    policy = RenewPolicy()
    first = policy.default_at(T0, T0 + 90 * DAY, cert_rng("0ABC"))
    again = policy.default_at(T0, T0 + 90 * DAY, cert_rng("0ABC"))
    other = policy.default_at(T0, T0 + 90 * DAY, cert_rng("0ABD"))
    assert first == again != other


def test_default_with_the_largest_jitter_stays_inside_the_lifetime() -> None:
    policy = RenewPolicy(jitter=MAX_JITTER)
    for lifetime in (120.0, 6 * DAY, 90 * DAY):
        for draw in (0.0, 0.999999):
            at = policy.default_at(T0, T0 + lifetime, Fixed(draw))
            assert T0 + 0.3 * lifetime < at < T0 + 0.85 * lifetime


def test_default_of_a_certificate_without_lifetime_is_its_not_before() -> None:
    assert RenewPolicy().default_at(T0, T0, Fixed(0.5)) == T0
    assert RenewPolicy().default_at(T0, T0 - 5, Fixed(0.5)) == T0


# --- ARI ---------------------------------------------------------------------------------------


def test_ari_picks_a_uniform_moment_inside_the_window() -> None:
    policy = RenewPolicy()
    start, end = T0 + 100, T0 + 200
    assert policy.ari_at(start, end, T0, Fixed(0.0)) == start
    assert policy.ari_at(start, end, T0, Fixed(0.25)) == pytest.approx(T0 + 125)
    times = [policy.ari_at(start, end, T0, cert_rng(str(i))) for i in range(1000)]
    assert all(start <= t < end for t in times)
    assert sum(t < start + 50 for t in times) == pytest.approx(500, abs=80)


def test_ari_window_already_over_means_now() -> None:
    assert RenewPolicy().ari_at(T0 - 200, T0 - 100, T0, Fixed(0.5)) == T0
    assert RenewPolicy().ari_at(T0 - 200, T0, T0, Fixed(0.5)) == T0


def test_ari_moment_drawn_in_the_past_means_now() -> None:
    assert RenewPolicy().ari_at(T0 - 100, T0 + 100, T0, Fixed(0.1)) == T0
    assert RenewPolicy().ari_at(T0 - 100, T0 + 100, T0, Fixed(0.9)) == pytest.approx(T0 + 80)


def test_ari_window_without_width_means_now() -> None:
    assert RenewPolicy().ari_at(T0 + 100, T0 + 100, T0, Fixed(0.5)) == T0


@pytest.mark.parametrize(
    ("retry_after", "wait"),
    [
        (None, ARI_DEFAULT_CHECK),
        (3600.0, 3600.0),
        (1.0, 60.0),  # clamped up to ari_min
        (0.0, 60.0),
        (10 * DAY, DAY),  # clamped down to ari_max
    ],
)
def test_ari_is_asked_again_after_retry_after_clamped(
    retry_after: float | None, wait: float
) -> None:
    assert RenewPolicy().ari_check_at(T0, retry_after) == T0 + wait


def test_ari_check_clamps_follow_the_settings() -> None:
    policy = RenewPolicy(ari_min=2.0, ari_max=30.0)
    assert policy.ari_check_at(T0, 1.0) == T0 + 2.0
    assert policy.ari_check_at(T0, None) == T0 + 30.0
    assert policy.ari_check_at(T0, 5.0) == T0 + 5.0


# --- retries ----------------------------------------------------------------------------------


def test_retry_backoff_doubles_up_to_its_cap() -> None:
    policy = RenewPolicy(retry_min=60.0, retry_max=3600.0, margin=0.0)
    far = T0 + 365 * DAY
    waits = [policy.retry_at(T0, n, far, 0.0) - T0 for n in range(1, 10)]
    assert waits == [60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 3600.0, 3600.0, 3600.0]
    assert policy.retry_at(T0, 0, far, 0.0) == T0 + 60.0  # no failure yet counts as one


def test_retry_jitter_adds_at_most_a_tenth() -> None:
    policy = RenewPolicy(retry_min=100.0, retry_max=100.0)
    assert policy.retry_at(T0, 3, T0 + DAY, 0.999) == pytest.approx(T0 + 109.9)


@pytest.mark.parametrize("left", [100.0, 600.0, 2 * 3600.0, 7 * 3600.0, 8 * 3600.0, 5 * DAY])
def test_retry_is_never_planned_past_expiry_minus_the_margin(left: float) -> None:
    policy = RenewPolicy(retry_min=60.0, retry_max=6 * 3600.0, margin=3600.0)
    not_after = T0 + left
    margin = policy.scaled(T0, not_after, 0.0).margin
    for failures in range(1, 20):
        assert policy.retry_at(T0, failures, not_after, 0.999) <= not_after - margin


def test_retry_keeps_trying_every_retry_min_at_and_past_expiry() -> None:
    policy = RenewPolicy(retry_min=60.0, retry_max=6 * 3600.0, margin=3600.0)
    for not_after in (T0, T0 - DAY):
        assert policy.retry_at(T0, 9, not_after, 0.5) == T0 + 60.0


def test_retry_near_expiry_comes_within_an_eighth_of_what_is_left() -> None:
    policy = RenewPolicy(retry_min=60.0, retry_max=6 * 3600.0, margin=3600.0)
    not_after = T0 + 1800.0  # 30 minutes left: cap 225 s, margin 450 s
    assert policy.retry_at(T0, 9, not_after, 0.0) == T0 + 225.0
    assert policy.retry_at(T0, 1, not_after, 0.0) == T0 + 36.0  # the floor: 1/50 of it


# --- scaling with the remaining lifetime (issue 29) ------------------------------------------


def test_scaled_keeps_the_settings_for_certificates_with_days_left() -> None:
    policy = RenewPolicy(retry_min=60.0, retry_max=6 * 3600.0, margin=3600.0)
    for days in (3.0, 30.0, 60.0):  # a 6-day certificate at half, 47 and 90 days at 2/3
        assert policy.scaled(T0, T0 + days * DAY, 75.0) == Scaled(60.0, 6 * 3600.0, 3600.0, 75.0)


@pytest.mark.parametrize("left", [150.0, 300.0, 1800.0, 3 * 3600.0, DAY, 3 * DAY, 30 * DAY])
def test_scaled_timings_are_proportional_to_what_is_left(left: float) -> None:
    """Every timing is at most its share of the remaining lifetime (or its floor)."""
    policy = RenewPolicy(retry_min=60.0, retry_max=6 * 3600.0, margin=3600.0)
    s = policy.scaled(T0, T0 + left, 75.0)
    assert s.retry_min == min(60.0, max(RETRY_FLOOR, left / 50))
    assert s.retry_max == min(6 * 3600.0, max(s.retry_min, left / 8))
    assert s.margin == min(3600.0, left / 4)
    assert s.lease == min(75.0, max(LEASE_FLOOR, left / 6))
    # with the margin and one backoff cap, a retry still lands well before expiry
    assert s.margin + s.retry_max < left


def test_scaled_short_certificate_behaves_like_a_long_one_in_proportion() -> None:
    """300 s certificate renewing at half (150 s left) vs a 6-day one (3 days left)."""
    policy = RenewPolicy()
    short = policy.scaled(T0, T0 + 150.0, 75.0)
    assert short == Scaled(retry_min=5.0, retry_max=18.75, margin=37.5, lease=25.0)
    # a CA outage of 40 s (about a quarter of what is left) costs a few retries, not expiry
    now, failures = T0, 0
    while now < T0 + 40.0:
        failures += 1
        now = policy.retry_at(now, failures, T0 + 150.0, 0.5)
    assert now < T0 + 150.0 - 37.5
    assert failures <= 5


def test_scaled_past_or_unknown_expiry_keeps_the_settings() -> None:
    policy = RenewPolicy(retry_min=60.0, retry_max=600.0, margin=3600.0)
    for not_after in (0.0, T0, T0 - 10.0):
        assert policy.scaled(T0, not_after, 75.0) == Scaled(60.0, 600.0, 3600.0, 75.0)


def test_retry_with_unknown_expiry_is_plain_backoff() -> None:
    policy = RenewPolicy(retry_min=60.0, retry_max=600.0)
    assert policy.retry_at(T0, 5, 0.0, 0.0) == T0 + 600.0


def test_retries_until_expiry_are_a_bounded_count() -> None:
    """From the first failure to expiry: attempts grow with log + lifetime/retry_max, no loop."""
    policy = RenewPolicy(retry_min=60.0, retry_max=6 * 3600.0, margin=3600.0)
    not_after = T0 + 30 * DAY
    now, failures = T0, 0
    while now < not_after:
        failures += 1
        later = policy.retry_at(now, failures, not_after, 0.5)
        assert later > now
        now = later
    # about four a day once capped, then one a minute in the last hour: never a tight loop
    assert 100 < failures < 30 * 4 + 60 + 10


@pytest.mark.parametrize(
    "kwargs",
    [
        {"jitter": -0.1},
        {"jitter": MAX_JITTER + 0.01},
        {"ari_min": 0.0},
        {"ari_min": 10.0, "ari_max": 5.0},
        {"retry_min": 0.0},
        {"retry_min": 10.0, "retry_max": 5.0},
        {"margin": -1.0},
    ],
)
def test_renew_policy_refuses_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RenewPolicy(**kwargs)
