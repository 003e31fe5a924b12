"""The test workers' ports: each worker hands out its own, none in the kernel's ephemeral range."""

from __future__ import annotations

import pytest

from tests.support import net


def test_each_worker_has_its_own_ports_below_the_ephemeral_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "6")
    shares = []
    for index in range(6):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{index}")
        shares.append(set(net._worker_ports()))
        port = net.free_port()
        assert port in shares[-1] and port < 32768
    assert all(len(share) == 2000 for share in shares)
    assert len(set().union(*shares)) == 6 * 2000  # disjoint


def test_a_port_is_handed_out_once_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    ports = [net.free_port() for _ in range(50)]
    assert len(set(ports)) == 50
