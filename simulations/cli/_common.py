"""Shared pieces of the command line: one-line errors, the options generated from the
ModelConfig fields and the run options generated from the :class:`RunArgs` fields."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypedDict

from shapedtx._validation import ParameterError, check_int
from shapedtx.config import CHOICES, FIELD_TYPES, ModelConfig
from shapedtx.presets import PRESET_DESCRIPTIONS, PRESETS

if TYPE_CHECKING:  # torch loads with the command that runs, not for --help or a usage error
    import torch


# The names the parsers offer, as plain data: building a parser must not import torch (the
# libraries' tables hold torch dtypes and solver classes). tests/test_cli_imports.py checks
# that they are the libraries' names.
DTYPE_NAMES: tuple[str, ...] = ("float64", "float32")
"""The keys of :data:`shapedtx.options.DTYPES` (simulation and SDE dtypes)."""
SAMPLER_METHODS: tuple[str, ...] = ("auto", "exact", "weights", "gram")
"""The keys of :data:`simulations.SAMPLERS` (the sampler names; a test keeps them equal)."""
SDE_METHODS: tuple[str, ...] = ("euler", "em", "torchsde")
"""The keys of :data:`sde.SOLVERS` (the solver names; a test keeps them equal)."""


class UsageError(Exception):
    """Bad command-line input: printed as one line, exit code 2."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse with one-line errors (``shapedtx: error: ...``) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


_HELP = {
    "width": "n, residual width",
    "depth": "d, number of blocks",
    "mlp_ratio": "MLP hidden width / n",
    "heads": "number of attention heads",
    "key_dim": "n_k per head (default head_dim)",
    "head_dim": "d_p per head (default width/heads)",
    "tau0": "shaped-attention temperature constant",
    "gamma": "branch weight of the scaled residual (default 1/sqrt(8))",
    "c_plus": "shaped-ReLU constant c_+",
    "c_minus": "shaped-ReLU constant c_-",
}


def add_config_arguments(
    parser: argparse.ArgumentParser,
    defaults: ModelConfig | None = None,
    *,
    exclude: tuple[str, ...] = (),
) -> None:
    """``--model NAME`` and one option per ``ModelConfig`` field (``--width``, ``--tau0``, ...),
    generated from the dataclass fields (:data:`shapedtx.config.FIELD_TYPES`).

    The config is ``defaults`` (default ``ModelConfig()``), then the preset ``--model``, then
    every option given explicitly (:func:`config_from_args`). Fields in ``exclude`` get no
    option (they keep the default's value).
    """
    d = defaults or ModelConfig()
    g = parser.add_argument_group("model (ModelConfig; options override --model)")
    g.add_argument(
        "--model",
        choices=tuple(PRESETS),
        default=None,
        help="start from a named model: "
        + "; ".join(f"{k}: {v}" for k, v in PRESET_DESCRIPTIONS.items()),
    )
    for name, kind in FIELD_TYPES.items():
        if name in exclude:
            continue
        flag = "--" + name.replace("_", "-")
        default = getattr(d, name)
        shown = "" if name in ("key_dim", "head_dim", "gamma") else f" (default {default})"
        if kind is bool:
            g.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
        elif name in CHOICES:
            g.add_argument(flag, choices=CHOICES[name], default=None, help=f"(default {default})")
        else:
            g.add_argument(flag, type=kind, default=None, help=_HELP.get(name, name) + shown)
    parser.set_defaults(_config_defaults=d)


def config_from_args(args: argparse.Namespace, defaults: ModelConfig | None = None) -> ModelConfig:
    """The ModelConfig of the options of :func:`add_config_arguments`: ``defaults`` (or the
    parser's), then ``--model``, then the explicit options. Sizes derived from the width
    (``head_dim``, ``key_dim``) follow a changed width or head count."""
    base = defaults or getattr(args, "_config_defaults", None) or ModelConfig()
    fields = {name: getattr(base, name) for name in FIELD_TYPES}
    if base.heads * fields["head_dim"] == base.width and fields["key_dim"] == fields["head_dim"]:
        fields["head_dim"] = fields["key_dim"] = None  # derived (heads need not divide width)
    if args.model is not None:
        fields.update(PRESETS[args.model])
    given = {k: v for k in FIELD_TYPES if (v := getattr(args, k, None)) is not None}
    fields.update(given)
    try:
        config = ModelConfig(**fields)
    except ValueError as err:
        raise option_error(err, FIELD_TYPES) from None
    ignored = [(k, why) for k, why in config.unused_fields().items() if k in given]
    if ignored:
        name, why = ignored[0]
        raise UsageError(f"--{name.replace('_', '-')} has no effect with {why}; leave it out")
    return config


def option_error(
    err: ValueError, names: Iterable[str] = (), renamed: Mapping[str, str] | None = None
) -> UsageError:
    """The one-line UsageError of a library ValueError, naming the command-line option of the
    parameter it carries (:class:`shapedtx.ParameterError`, ``err.parameter``): ``renamed[name]``,
    ``--name-with-dashes`` for the ``names`` listed, or the parameter itself when it is an option
    already (``--rho0``). The option replaces the parameter's name where the message starts with
    it (``width must be ...`` -> ``--width must be ...``), else it is put in front; an error
    without a parameter, or whose parameter has no option here, keeps its message."""
    message = str(err).replace("\n", " ")
    parameter = getattr(err, "parameter", None)
    if not isinstance(parameter, str):
        return UsageError(message)
    if renamed and parameter in renamed:
        option = renamed[parameter]
    elif parameter in names:
        option = "--" + parameter.replace("_", "-")
    elif parameter.startswith("--"):
        option = parameter
    else:
        return UsageError(message)
    if re.match(re.escape(parameter) + r"(?!\w)", message):
        return UsageError(option + message[len(parameter) :])
    return UsageError(f"{option}: {message}")


def add_input_arguments(group: argparse._ArgumentGroup, *, what: str = "networks") -> None:
    """``--tokens --rho0 --scale --samples``: an equicorrelated input covariance V0."""
    group.add_argument("--tokens", type=int, default=4, help="m, number of tokens (default 4)")
    group.add_argument("--rho0", type=float, default=0.2, help="initial correlation (default 0.2)")
    group.add_argument("--scale", type=float, default=1.0, help="initial V^{aa} (default 1)")
    group.add_argument("--samples", type=int, default=256, help=f"number of {what} (default 256)")


def add_method_argument(group: argparse._ArgumentGroup) -> None:
    """``--method``: the finite-network sampler, ``auto`` (the library's default) or a name of
    :data:`simulations.SAMPLERS` (:data:`SAMPLER_METHODS`)."""
    group.add_argument(
        "--method",
        choices=SAMPLER_METHODS,
        default="auto",
        help="finite-network sampler; auto (default): 'gram' where it applies (no LayerNorm; "
        "one head, or any heads with W^O), else 'exact'. All are exact in distribution",
    )


def add_output_arguments(group: argparse._ArgumentGroup) -> None:
    """``--out --overwrite``: the optional .nc file of a command that computes one Dataset."""
    group.add_argument("--out", default=None, help="write the Dataset to this .nc file")
    group.add_argument("--overwrite", action="store_true", help="replace an existing --out file")


def _run_field(default: Any, kind: type, text: str, **extra: Any) -> Any:
    """A :class:`RunArgs` field: its default, and its option's type and help; ``extra``:
    ``choices``, and ``unset``, what a default of None means."""
    return field(default=default, metadata={"type": kind, "help": text, **extra})


@dataclass(frozen=True)
class RunArgs:
    """The run options of every command that computes: the one definition of ``--seed
    --device --dtype --threads --progress/--no-progress``. Each field is one option, generated
    by :func:`add_run_options` (a field added here is an option of every such command). The
    values are checked here (ParameterError naming the field), torch-free; the device is
    checked by :meth:`torch_device` when the command runs."""

    seed: int = _run_field(0, int, "random seed")
    device: str | None = _run_field(None, str, "torch device", unset="cpu")
    dtype: str = _run_field("float64", str, "floating-point type", choices=DTYPE_NAMES)
    threads: int | None = _run_field(None, int, "torch CPU threads", unset="torch's")
    progress: bool | None = _run_field(
        None, bool, "progress bars", unset="when stderr is a terminal"
    )

    def __post_init__(self) -> None:
        check_int("seed", self.seed, 0)
        cores = os.cpu_count() or 1
        if self.threads is not None and not 1 <= self.threads <= cores:
            raise ParameterError(
                "threads", f"threads must be in [1, {cores}] (the cores), got {self.threads}"
            )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunArgs:
        """The run options of parsed arguments (a field the command does not offer keeps its
        default); a bad value is a UsageError naming its option."""
        names = [f.name for f in fields(cls)]
        try:
            return cls(**{k: getattr(args, k) for k in names if hasattr(args, k)})
        except ValueError as err:
            raise option_error(err, names) from None

    def torch_device(self) -> torch.device:
        """The device as a torch.device (None: cpu); UsageError if unknown or unavailable."""
        return parse_device(self.device)

    def apply_threads(self) -> None:
        """Set torch's CPU threads to ``threads`` (None leaves torch's default)."""
        if self.threads is not None:
            import torch

            torch.set_num_threads(self.threads)

    def run_keywords(self) -> RunKeywords:
        """The library's run keywords (seed, dtype, progress; no device: the run follows its
        inputs'): ``simulate(config, V0, samples, **keywords)``."""
        from shapedtx.options import DTYPES

        return {"seed": self.seed, "dtype": DTYPES[self.dtype], "progress": self.progress}


class RunKeywords(TypedDict):
    """The run settings the library's verbs (``simulate``, ``sde.solve``) take as keywords."""

    seed: int
    dtype: torch.dtype
    progress: bool | None


def add_run_options(
    parser: argparse.ArgumentParser,
    *,
    exclude: Collection[str] = (),
    defaults: Mapping[str, Any] | None = None,
    choices: Mapping[str, Sequence[str]] | None = None,
    helps: Mapping[str, str] | None = None,
) -> None:
    """One option per :class:`RunArgs` field (``--seed``, ``--device``, ...; a bool field is
    ``--name/--no-name``) in a group "run". A command that needs another default, other
    choices or other help says so here (``defaults={"threads": 2}``); a field that has no
    meaning for it is in ``exclude``. :meth:`RunArgs.from_args` reads them back."""
    given = (exclude, defaults or {}, choices or {}, helps or {})
    unknown = set().union(*given) - {f.name for f in fields(RunArgs)}
    if unknown:  # a programming error, not a user's
        raise TypeError(f"not RunArgs fields: {sorted(unknown)}")
    group = parser.add_argument_group("run")
    for f in fields(RunArgs):
        if f.name in exclude:
            continue
        meta = f.metadata
        default = (defaults or {}).get(f.name, f.default)
        shown = meta.get("unset", "none") if default is None else default
        if isinstance(default, bool):
            shown = "on" if default else "off"
        text = f"{(helps or {}).get(f.name, meta['help'])} (default {shown})"
        flag = "--" + f.name.replace("_", "-")
        if meta["type"] is bool:
            action = argparse.BooleanOptionalAction
            group.add_argument(flag, action=action, default=default, help=text)
        else:
            kinds = (choices or {}).get(f.name, meta.get("choices"))
            group.add_argument(flag, type=meta["type"], choices=kinds, default=default, help=text)


def parse_device(text: str | None) -> torch.device:
    """``--device`` as a torch.device (default cpu); UsageError if unknown or unavailable
    (the library's check, :func:`shapedtx._validation.check_device`)."""
    from shapedtx._validation import check_device

    try:
        return check_device(text)
    except ValueError as err:
        raise option_error(err, ("device",)) from None


def run_setup(args: argparse.Namespace) -> tuple[ModelConfig, torch.Tensor, RunKeywords]:
    """Validate the options of :func:`add_input_arguments`, :func:`add_output_arguments` and
    :func:`add_run_options`: returns (config, V0 on the device, the run keywords: seed, dtype,
    progress) and applies ``--threads``."""
    from shapedtx._validation import check_int, check_positive, check_tokens

    config = config_from_args(args)  # torch-free checks first: a usage error loads no torch
    settings = RunArgs.from_args(args)
    if args.out is not None:
        if Path(args.out).suffix != ".nc":
            raise UsageError(f"--out must be a .nc file, got {args.out!r}")
        check_output_file(args.out, args.overwrite)
    try:  # the library's own checks (shapedtx._validation), before torch loads
        check_int("tokens", args.tokens, 2)
        check_int("samples", args.samples, 1)
        check_positive("scale", args.scale)
        check_tokens(args.tokens, config.width)
    except ValueError as err:
        raise option_error(err, ("tokens", "samples", "scale")) from None
    from shapedtx.covariance import check_correlation, equicorrelated

    try:
        check_correlation(args.rho0, args.tokens, "--rho0")
    except ValueError as err:
        raise option_error(err) from None
    settings.apply_threads()
    V0 = equicorrelated(args.tokens, args.rho0, args.scale, device=settings.torch_device())
    return config, V0, settings.run_keywords()  # no device: the run follows V0's


def _check_writable(path: Path, option: str) -> None:
    """UsageError unless a file can be created in the nearest existing ancestor of ``path``
    (where it would be created): tried with a temporary file, which also catches read-only
    and pseudo file systems that ``os.access`` reports writable to root."""
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    try:
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as err:
        raise UsageError(f"{option} {path}: cannot write in {parent} ({err.strerror})") from None


def check_output_file(path: str | os.PathLike, overwrite: bool, option: str = "--out") -> Path:
    """UsageError unless ``path`` can be written: not a folder, its folder writable, and not
    an existing file unless ``overwrite``. Called before any computation."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{option} {path} is a folder; give a file name")
    if path.exists() and not overwrite:
        raise UsageError(f"{option} {path} exists; pass --overwrite to replace it")
    _check_writable(path, option)
    return path


def check_output_folder(path: Path, overwrite: bool, option: str = "--out") -> None:
    """UsageError unless ``path`` can become the output folder: not a file, its parent
    writable, and absent or empty unless ``overwrite``. Called before any computation."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path} is a file; give a folder")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise UsageError(
            f"{option} {path} already holds files; pass --overwrite to replace them, or "
            "choose another folder"
        )
    _check_writable(path, option)


@contextmanager
def staged_folder(path: Path) -> Iterator[Path]:
    """Yield a fresh staging folder beside ``path``; on success it replaces ``path`` whole
    (an earlier output's files are removed, none survive), on failure or Ctrl-C it is
    removed and ``path`` stays as it was. The folder gets the umask's mode."""
    path = path.absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.partial-", dir=path.parent))
    try:
        yield staging
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(staging, 0o777 & ~mask)
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
        os.replace(staging, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
