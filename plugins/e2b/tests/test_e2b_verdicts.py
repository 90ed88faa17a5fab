"""Verdicts through the e2b provider equal the local provider's: a HumanEval batch (passed, failed,
error, no code, timeout) and the hack suite's tricks (tests/test_hacks.py), none of which pays."""

from __future__ import annotations

import sys
from pathlib import Path

import e2b_testing
from e2b_testing import TAGS

ROOT = str(Path(__file__).resolve().parents[3])
if ROOT not in sys.path:  # the repository's tests package
    sys.path.insert(0, ROOT)
from tests.provider_verdicts import (  # noqa: E402
    check_humaneval_verdicts_are_the_local_providers,
    check_known_hacks_do_not_pay,
)

fake, provider = e2b_testing.fake, e2b_testing.provider  # the fixtures this module uses


def test_humaneval_verdicts_are_the_local_providers(fake, provider):
    check_humaneval_verdicts_are_the_local_providers(provider(), TAGS, size=3, live=fake.live)


def test_known_hacks_do_not_pay_through_e2b(fake, provider):
    check_known_hacks_do_not_pay(provider(), TAGS, size=3, live=fake.live)
