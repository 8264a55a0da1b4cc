"""The shared argument checks (shapedtx._validation): accepted values and one message style."""

import math

import numpy as np
import pytest

from shapedtx._validation import (
    check_bool,
    check_choice,
    check_int,
    check_number,
    check_positive,
    check_progress,
)


def test_accepted_values_are_returned():
    assert check_int("n", 3) == 3
    assert check_int("n", 0, 0, 5) == 0
    assert check_number("x", 2) == 2.0 and isinstance(check_number("x", 2), float)
    assert check_number("x", np.float32(0.5), 0.0, 1.0) == 0.5
    assert check_number("x", 1.0, 0.0, 1.0, low_open=True) == 1.0
    assert check_positive("x", 1e-300) == 1e-300
    assert check_choice("c", "a", ("a", "b")) == "a"
    assert check_bool("b", False) is False
    assert check_progress(None) is None and check_progress(True) is True


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: check_int("n", 0), "n must be an integer >= 1, got 0"),
        (lambda: check_int("n", True), "n must be an integer >= 1, got True"),
        (lambda: check_int("n", 2.0), "n must be an integer >= 1, got 2.0"),
        (lambda: check_int("n", 6, 0, 5), r"n must be an integer in \[0, 5\], got 6"),
        (lambda: check_number("x", math.nan), "x must be a finite number, got nan"),
        (lambda: check_number("x", True), "x must be a finite number, got True"),
        (lambda: check_number("x", "1"), "x must be a finite number, got '1'"),
        (lambda: check_number("x", 10**400, 0.0), "x must be a finite number >= 0, got 1000"),
        (lambda: check_number("x", -1, 0.0), "x must be a finite number >= 0, got -1"),
        (lambda: check_number("x", 2, high=1.0), "x must be a finite number <= 1, got 2"),
        (
            lambda: check_number("x", 0.0, 0.0, 1.0, low_open=True),
            r"x must be in \(0, 1\], got 0.0",
        ),
        (
            lambda: check_number("x", 1.0, 0.0, 1.0, high_open=True),
            r"x must be in \[0, 1\), got 1.0",
        ),
        (lambda: check_positive("x", 0), "x must be a finite number > 0, got 0"),
        (lambda: check_positive("x", math.inf), "x must be a finite number > 0, got inf"),
        (lambda: check_choice("c", "z", ("a", "b")), "c must be one of 'a', 'b', got 'z'"),
        (lambda: check_bool("b", 1), "b must be True or False, got 1"),
        (lambda: check_progress("yes"), "progress must be True, False or None .*, got 'yes'"),
    ],
)
def test_rejections_name_the_parameter_the_range_and_the_value(call, message):
    with pytest.raises(ValueError, match=f"^{message}"):
        call()


def test_configs_store_checked_numbers_as_python_floats():
    """A NumPy float32 passes the checks and is stored as the checked Python float, so derived
    values (tau) and the optimiser get float64-exact Python numbers."""
    import numpy as np

    from shapedtx import ModelConfig
    from shapedtx.training import TrainConfig

    config = ModelConfig(tau0=np.float32(1.1), gamma=np.float32(0.5), c_plus=np.int64(1))
    for name in ("tau0", "gamma", "c_plus", "c_minus", "tau"):
        assert type(getattr(config, name)) is float, name
    assert config.tau0 == float(np.float32(1.1))
    train = TrainConfig(lr=np.float32(0.01), eps=np.float64(1e-8))
    assert type(train.lr) is float and type(train.eps) is float
