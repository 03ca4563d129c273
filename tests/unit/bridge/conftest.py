from __future__ import annotations

from pathlib import Path

import pytest

from gpuheal_bridge.operations import Operations
from tests.unit.bridge.fakes import FakeClock, FakeSlurm

DATA = Path(__file__).parent / "data"
TOKEN = "t0ken-for-the-operator-0123456789"


@pytest.fixture
def slurm() -> FakeSlurm:
    s = FakeSlurm()
    s.add_node("node1", "MIXED")
    s.add_node("node2", "IDLE", ("DRAIN",), "admin maintenance: fan swap")
    s.add_node("node3", "IDLE")
    return s


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ops(slurm: FakeSlurm, clock: FakeClock) -> Operations:
    return Operations(slurm, clock=clock, sleep=clock.sleep, poll_interval=0.1)
