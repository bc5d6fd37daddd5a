"""How many of the job's ranks share this host: the launcher's word, never a guess from the world size."""

from __future__ import annotations

import pytest

from kinetoscope.capture.dist import ranks_on_host

LAUNCHERS = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE")


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch):
    for name in LAUNCHERS:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("name", LAUNCHERS)
def test_each_launchers_count_is_read(monkeypatch, name):
    monkeypatch.setenv(name, "4")
    assert ranks_on_host(16) == 4


def test_torchruns_count_comes_before_slurms(monkeypatch):
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert ranks_on_host(8) == 2


def test_one_process_is_alone_on_its_host_whatever_the_environment(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert ranks_on_host(1) == 1


@pytest.mark.parametrize("value", ["2(x3)", "", "0", "-2", "two", "\u00b2"])
def test_a_count_that_is_not_one_positive_number_is_not_said(monkeypatch, value):
    """Slurm writes "2(x3)" for uneven nodes: no one number ("²" is a digit to Python, not a count); nothing else
    said: unknown, never the world size."""
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", value)
    assert ranks_on_host(6) is None


def test_a_count_inherited_from_a_larger_allocation_is_at_most_the_world_size(monkeypatch):
    """Every process of a Slurm allocation of 8 tasks a node inherits its count: a 2-process job in it shares the
    host with no more than its own 2 ranks."""
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "8")
    assert ranks_on_host(2) == 2
