"""Where things are, for tests in any tier folder: the checkout's root and the tests' own folder
(shared data, client scenarios, helper scripts). One place, so a test moved between tiers keeps
finding them."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
