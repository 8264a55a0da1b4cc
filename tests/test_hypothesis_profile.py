"""Property-based tests draw the same examples on every run unless asked otherwise."""

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

_DRAWN: list[list[tuple[int, ...]]] = []


@given(st.lists(st.integers(), min_size=3, max_size=3))
def _record(values: list[int]) -> None:
    _DRAWN[-1].append(tuple(values))


@pytest.mark.skipif(
    os.environ.get("HYPOTHESIS_PROFILE", "fixed") == "explore",
    reason="the explore profile draws fresh examples on purpose",
)
def test_hypothesis_draws_the_same_examples_every_run():
    assert settings.default.derandomize
    for _ in range(2):
        _DRAWN.append([])
        _record()
    assert _DRAWN[0] == _DRAWN[1]
    assert len(set(_DRAWN[0])) > 1  # really drew examples
