"""The scenario suite's fixture: each scenario runs once per chat platform (``platforms.DRIVERS``), so a
platform that fails one is a failing test, not a missing one."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.scenarios.platforms import DRIVERS, Driver


@pytest.fixture(params=DRIVERS, ids=lambda driver: driver.name)
async def platform(request: pytest.FixtureRequest) -> AsyncIterator[Driver]:
    """The platform's fake, running, and its driver."""
    async with request.param() as driver:
        yield driver
