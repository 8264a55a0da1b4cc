"""Test-suite settings shared by every test file."""

import os

import pytest
import torch
from hypothesis import settings

# Property-based tests: 100 examples each, derandomized, so that a run (CI's included) is
# reproducible like every other test here. ``HYPOTHESIS_PROFILE=explore`` draws fresh random
# examples (run it now and then to look for new counterexamples; a failure found that way
# becomes an explicit ``@example``); the mutation script (tests/mutate.py) selects the cheaper
# "mutate" profile.
settings.register_profile("fixed", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.register_profile("mutate", max_examples=10, derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fixed"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The ``slow`` tests first, each group in its collected order: pytest-xdist hands tests
    out in this order, so the minute-long ones start early and the short ones fill the workers
    at the end, instead of one worker finishing alone on a long test."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread per test, restored afterwards (also after CLI ``--threads``).

    The statistical tests are many small batched operations: on a shared 2-core machine
    OpenMP threads only contend (measured up to 10x slower with 2 threads); the numbers do not
    depend on the thread count.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def float64_default():
    """torch's default dtype is float64 inside the test, restored afterwards."""
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(dtype)
