"""Argument checks shared by the packages: one error type and one wording everywhere.

Every check raises :class:`ParameterError` (a ValueError whose ``parameter`` attribute is the
name checked) with the message ``"<name> must be <what is accepted>, got <value!r>"``, and
returns the value (a number as a float) so that a caller can check and assign in one line:

- :func:`check_int`: an integer (not a bool) in ``[minimum, maximum]``;
- :func:`check_number`: a finite real number (not a bool), optionally in an interval;
- :func:`check_positive`: a finite real number > 0;
- :func:`check_choice`: one of a fixed set of values;
- :func:`check_bool`: True or False; :func:`check_progress`: True, False or None;
- :func:`check_dtype`, :func:`check_device`: torch dtypes and devices;
- :func:`check_tokens`: a number of tokens m that fits the width (m <= width).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import torch

T = TypeVar("T")


class ParameterError(ValueError):
    """A rejected argument or field: a ``ValueError`` whose :attr:`parameter` names what was
    rejected, so that a caller (the command line) can tell which argument or option to blame
    without reading the message.

    Raised by the argument checks of every public function and by the value objects
    (``ModelConfig``, ``TrainConfig``, ``simulations.Experiment``, ...). The
    message names the parameter, the accepted values and the value given, e.g.
    ``"width must be an integer >= 1, got 0"``. Catch ``ValueError`` to handle it like any
    other bad value.

    Attributes:
        parameter: the name of the argument or field as the function or class spells it
            (``"width"``, ``"rho0"``, ``"V0"``, ...).
    """

    parameter: str

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter

    def __reduce__(self) -> tuple[Any, ...]:  # picklable (Dask workers, multiprocessing)
        return type(self), (self.parameter, str(self))


def check_int(name: str, value: Any, minimum: int = 1, maximum: int | None = None) -> int:
    """``value`` if it is an integer (not a bool) in ``[minimum, maximum]``; else ParameterError
    naming it."""
    ok = not isinstance(value, bool) and isinstance(value, int) and value >= minimum
    if maximum is None:
        if not ok:
            raise ParameterError(name, f"{name} must be an integer >= {minimum}, got {value!r}")
    elif not (ok and value <= maximum):
        raise ParameterError(
            name, f"{name} must be an integer in [{minimum}, {maximum}], got {value!r}"
        )
    return value


def _is_real(value: Any) -> bool:
    # numbers.Real: Python and NumPy ints and floats; bools are not numbers here
    return not isinstance(value, bool) and isinstance(value, numbers.Real)


def check_number(
    name: str,
    value: Any,
    low: float = -math.inf,
    high: float = math.inf,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """``float(value)`` if ``value`` is a finite real number (a Python or NumPy int or float,
    not a bool) in the interval from ``low`` to ``high`` (each end closed unless ``*_open``;
    an infinite end only asks for finiteness); else ParameterError naming it and the range."""
    number = math.nan
    if _is_real(value):
        try:
            number = float(value)
        except OverflowError:  # an int beyond the float range
            number = math.inf
    ok = math.isfinite(number)
    if ok and math.isfinite(low):
        ok = number > low if low_open else number >= low
    if ok and math.isfinite(high):
        ok = number < high if high_open else number <= high
    if not ok:
        lo, hi = (">" if low_open else ">="), ("<" if high_open else "<=")
        if math.isfinite(low) and math.isfinite(high):
            left, right = ("(" if low_open else "["), (")" if high_open else "]")
            what = f"in {left}{low:g}, {high:g}{right}"
        elif math.isfinite(low):
            what = f"a finite number {lo} {low:g}"
        elif math.isfinite(high):
            what = f"a finite number {hi} {high:g}"
        else:
            what = "a finite number"
        raise ParameterError(name, f"{name} must be {what}, got {value!r}")
    return number


def check_positive(name: str, value: Any) -> float:
    """``float(value)`` if ``value`` is a finite real number > 0; else ParameterError naming it."""
    return check_number(name, value, 0.0, low_open=True)


def check_choice(name: str, value: T, choices: Collection[Any]) -> T:
    """``value`` if it is one of ``choices``; else ParameterError naming it and the choices."""
    if value not in choices:
        raise ParameterError(
            name, f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}"
        )
    return value


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is True or False (not 0/1); else ParameterError naming it."""
    if not isinstance(value, bool):
        raise ParameterError(name, f"{name} must be True or False, got {value!r}")
    return value


def check_progress(value: Any, name: str = "progress") -> bool | None:
    """``value`` if it is None (automatic), True or False; else ParameterError naming it."""
    if value is not None and not isinstance(value, bool):
        raise ParameterError(name, f"{name} must be True, False or None (automatic), got {value!r}")
    return value


def check_dtype(dtype: Any, name: str = "dtype") -> Any:
    """``dtype`` if it is torch.float32 or torch.float64; else ParameterError naming it."""
    import torch

    if dtype not in (torch.float32, torch.float64):
        raise ParameterError(name, f"{name} must be torch.float32 or torch.float64, got {dtype!r}")
    return dtype


def check_device(device: Any, name: str = "device") -> torch.device:
    """``device`` as a ``torch.device`` (None: cpu); ParameterError naming it if it is not a
    device or is not available (CUDA without a GPU, an index beyond the GPU count)."""
    import torch

    try:
        dev = torch.device(device) if device is not None else torch.device("cpu")
    except (RuntimeError, TypeError) as err:
        raise ParameterError(name, f"{name} must be a torch device such as 'cpu' or 'cuda', "
                             f"got {device!r} ({err})") from None  # fmt: skip
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ParameterError(name, f"{name} {device!r}: CUDA is not available on this machine")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ParameterError(
                name,
                f"{name} {device!r}: only {torch.cuda.device_count()} CUDA device(s) available",
            )
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ParameterError(name, f"{name} {device!r}: MPS is not available on this machine")
    elif dev.type not in ("cpu", "mps"):
        raise ParameterError(name, f"{name} must be 'cpu' or 'cuda[:index]', got {device!r}")
    return dev


def check_tokens(tokens: int, width: int, name: str = "tokens") -> int:
    """``tokens`` if the m = ``tokens`` tokens fit the width (m <= width: the features of m
    tokens in a width-n layer span at most n dimensions); else ParameterError naming ``name``
    (``"tokens"``, or ``"V0"`` where m is the size of a covariance). The one check of this
    constraint, called by the public entry points (``simulate``, ``advise``,
    ``simulations.Experiment``, the command line)."""
    if tokens > width:
        raise ParameterError(
            name, f"{name}: width must be >= the number of tokens m = {tokens}, got width = {width}"
        )
    return tokens
