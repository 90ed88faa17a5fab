"""Verdicts through the modal provider: HumanEval samples score exactly as on the local provider,
and the hack suite's tricks (tests/test_hacks.py) do not pay, their honest controls do."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[3])
if ROOT not in sys.path:  # the repository's tests package
    sys.path.insert(0, ROOT)
from tests.provider_verdicts import (  # noqa: E402
    check_humaneval_verdicts_are_the_local_providers,
    check_known_hacks_do_not_pay,
)

TAGS = {"trl-sandbox": "1", "trl-sandbox-run": "modal-verdicts"}


def test_humaneval_verdicts_equal_the_local_providers(fake, provider):
    check_humaneval_verdicts_are_the_local_providers(provider(), TAGS, size=2, live=fake.live)


def test_known_hacks_do_not_pay_through_modal(fake, provider):
    check_known_hacks_do_not_pay(provider(), TAGS, size=2, live=fake.live)
