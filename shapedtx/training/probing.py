"""The token covariance of a saved training run (what ``shapedtx probe RUN`` runs): the
language model rebuilt from the run's log and checkpoint, on the run's fixed validation
windows, recorded after every block by :func:`shapedtx.probe`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._validation import ParameterError, check_int

if TYPE_CHECKING:
    import xarray as xr

    from .data import ByteCorpus

DATA_SETTINGS = "data.json"
"""The run folder's record of its :func:`shapedtx.training.load_corpus` arguments (written by
``shapedtx train``), which :func:`probe_run` reuses."""

_SETTINGS = ("path", "suffix", "max_bytes", "val_fraction")


class DataMismatch(ParameterError):
    """The data given to :func:`probe_run` is not the run's. ``parameter`` names the
    :func:`~shapedtx.training.load_corpus` setting that differs (``path``, ``max_bytes``,
    ``val_fraction`` or ``suffix``); :meth:`describe` words the message with other names for
    the settings (the command line's options)."""

    def __init__(self, parameter: str, detail: str, also: str | None = None) -> None:
        self.parameter, self.detail, self.also = parameter, detail, also
        super().__init__(parameter, self.describe())

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.parameter, self.detail, self.also)

    def describe(self, names: dict[str, str] | None = None, how: str | None = None) -> str:
        """The message, naming each setting as ``names`` does (default: the parameter), and
        ending with ``how`` (default: pass the settings the run was trained with)."""
        names = names or {}
        what = names.get(self.parameter, self.parameter)
        if self.also is not None:
            what += f" (or {names.get(self.also, self.also)})"
        return f"the data differs from the run's in {what}: {self.detail}; " + (
            how or "pass the data settings the run was trained with"
        )


def run_data_settings(folder: str | os.PathLike, log: xr.Dataset) -> dict[str, Any]:
    """The :func:`~shapedtx.training.load_corpus` arguments of the run in ``folder``: its
    ``data.json`` (:data:`DATA_SETTINGS`), else the log's corpus with ``shapedtx train``'s
    defaults and the run's size as ``max_bytes`` (the bytes read are ``min(max_bytes,
    corpus)``, so this reads the same bytes)."""
    try:
        saved = json.loads((Path(folder) / DATA_SETTINGS).read_text())
        if isinstance(saved, dict):
            return {k: saved.get(k) for k in _SETTINGS}
    except (OSError, ValueError):
        pass
    corpus = str(log.attrs.get("corpus", ""))
    size = int(log.attrs.get("train_bytes", 0)) + int(log.attrs.get("val_bytes", 0))
    return {
        "path": None if corpus.startswith("python-stdlib:") else corpus,
        "suffix": None,
        "max_bytes": size if size >= 16 else 8_000_000,
        "val_fraction": 0.1,
    }


def _check_same_data(data: ByteCorpus, log: xr.Dataset) -> None:
    """DataMismatch naming the setting by which ``data`` differs from the run's (at the
    default ``val_fraction`` the fingerprint hashes the bytes, not where the split falls: the
    sizes tell that)."""
    corpus = str(log.attrs.get("corpus", ""))
    train, val = int(data.train.numel()), int(data.val.numel())
    run_train, run_val = (int(log.attrs.get(k, n)) for k, n in
                          (("train_bytes", train), ("val_bytes", val)))  # fmt: skip
    if data.fingerprint() == log.attrs.get("corpus_fingerprint", data.fingerprint()) and (
        (train, val) == (run_train, run_val)
    ):
        return
    if data.source != corpus:
        raise DataMismatch("path", f"the source {data.source} is not the run's ({corpus})")
    if train + val != run_train + run_val:
        raise DataMismatch(
            "max_bytes",
            f"{train + val} bytes read, the run read {run_train + run_val} from {corpus}",
            also="suffix",
        )
    if train != run_train:
        raise DataMismatch(
            "val_fraction", f"{val} validation bytes of {train + val}, the run had {run_val}"
        )
    raise DataMismatch(
        "suffix",
        f"the same source ({corpus}) and sizes ({run_train} + {run_val} bytes) but other contents",
        also="the files changed since training",
    )


def probe_run(
    folder: str | os.PathLike,
    *,
    windows: int | None = None,
    device: Any = None,
    **data: Any,
) -> xr.Dataset:
    """The token covariance after every block of the language model saved in ``folder`` (the
    ``out_dir`` of :func:`shapedtx.training.train`: ``log.nc`` and ``checkpoint.pt``), on
    ``windows`` fixed validation windows (default: the run's ``metrics_batch``), in the run's
    dtype: the Dataset of :func:`shapedtx.probe` (``V(sample, t, token_a, token_b)``, one
    sample per window) with attrs ``run`` and ``step``.

    ``data`` (``path``, ``suffix``, ``max_bytes``, ``val_fraction``: None keeps the run's)
    overrides the run's :func:`run_data_settings`; data other than the run's is refused
    (:class:`DataMismatch`). Errors name ``folder``, ``windows`` or the data setting.
    """
    unknown = sorted(set(data) - set(_SETTINGS))
    if unknown:
        raise TypeError(f"probe_run() got unexpected keyword arguments {unknown}")
    if windows is not None:
        check_int("windows", windows, 1)
    from .._validation import check_device
    from ..results import load_dataset
    from .trainer import CHECKPOINT, LOG, configs_of

    folder = Path(folder)
    for name in (LOG, CHECKPOINT):
        if not (folder / name).is_file():
            raise ParameterError(
                "folder", f"{folder / name} not found: folder must be a training run's out_dir"
            )
    dev = check_device(device)
    try:
        log = load_dataset(folder / LOG)
        model_config, train_config = configs_of(log)
    except (OSError, KeyError, TypeError, ValueError) as err:
        raise ParameterError("folder", f"{folder / LOG} is not a training log: {err}") from None
    import torch

    from ..diagnostics import probe
    from .data import fixed_windows, load_corpus
    from .model import LanguageModel

    settings = run_data_settings(folder, log)
    settings.update({k: v for k, v in data.items() if v is not None})
    corpus = load_corpus(**settings)
    _check_same_data(corpus, log)
    try:
        state = torch.load(folder / CHECKPOINT, map_location="cpu", weights_only=True)
        model = LanguageModel(model_config, train_config.seq_len)
        model.load_state_dict(state["model"])
    except (OSError, KeyError, RuntimeError, ValueError) as err:
        raise ParameterError("folder", f"{folder / CHECKPOINT} does not load: {err}") from None
    dtype = getattr(torch, str(log.attrs.get("dtype", "float32")), torch.float32)
    model.to(device=dev, dtype=dtype)
    count = train_config.metrics_batch if windows is None else windows
    tokens = fixed_windows(corpus.val.to(dev), count, train_config.seq_len)[:, :-1]
    ds = probe(model, tokens)
    ds.attrs.update({"run": str(folder), "step": int(state["step"])})
    return ds


__all__ = ["DATA_SETTINGS", "DataMismatch", "probe_run", "run_data_settings"]
