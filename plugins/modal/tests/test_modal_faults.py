"""The seeded fault matrix and the verdicts on the modal provider, on the fake Modal.

The chaos fails creates and exec starts at random (UNAVAILABLE, INTERNAL, a throttle with Modal's
retry policy, or a reset stream) and reclaims sandboxes: Modal's client retries the transient ones
itself, the provider turns what outlasts those retries into trl-sandbox's errors, and the pool
rides them out within its budget."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trl_sandbox.plugins import testing

TAGS = {"trl-sandbox": "1", "trl-sandbox-run": "modal-matrix"}


@pytest.mark.parametrize("seeds", [(1, 2, 3), (4, 5, 6)])
def test_seeded_fault_matrix(fake, provider, seeds):
    """20% faults on creates and exec starts, 5% vanishing sandboxes: every seed scores at least 90%
    of 41 programs, none wrongly, with every sandbox tagged and none left alive."""
    report = testing.check_rides_out_faults(
        provider, TAGS, chaos=fake.chaos, live=fake.live, created_tags=lambda: fake.created_tags, seeds=seeds)
    print(report)
    assert sum(row["create_failures"] + row["kept"] + row["replaced"] for row in report) > 0  # faults happened


def test_fault_matrix_positive_control_a_pool_that_gives_up_loses_programs(fake, provider):
    """The matrix's bar is not vacuous: with one attempt per job (no retry, no keeping) the same
    faults, made heavier where the SDK's own retries would hide them, cost more than 10%."""
    heavy = lambda seed: fake.chaos(seed, transient=0.2, vanish=0.2)  # noqa: E731
    with pytest.raises(AssertionError, match="only"):
        testing.check_rides_out_faults(provider, TAGS, chaos=heavy, live=fake.live,
                                       created_tags=lambda: fake.created_tags, seeds=(1,),
                                       settings=replace(testing.MATRIX, max_attempts=1))
