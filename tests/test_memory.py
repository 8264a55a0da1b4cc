"""Large CPU tensors in huge-page mappings (shapedtx._memory)."""

from __future__ import annotations

import gc
import mmap
from pathlib import Path

import numpy as np
import pytest
import torch

from shapedtx import _memory

LARGE = (3, _memory.HUGE_PAGE_BYTES // 8)  # mapped: 1.5 huge pages in float32, 3 in float64


def _mapping(address: int) -> tuple[int, list[str]] | None:
    """(size, VmFlags) of the mapping of this process holding ``address`` (None if not
    Linux)."""
    smaps = Path("/proc/self/smaps")
    if not smaps.exists():
        return None
    inside, size = False, 0
    for line in smaps.read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside, size = lo <= address < hi, hi - lo
        elif inside and head == "VmFlags:":
            return size, line.split()[1:]
    return None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_large_tensor_is_an_ordinary_writable_tensor_that_outlives_its_mapping(dtype):
    t = _memory.empty(LARGE, dtype)
    assert t.shape == LARGE and t.dtype == dtype and t.is_contiguous()
    assert t.device.type == "cpu"
    gc.collect()  # only the tensor refers to the mapping now
    t.copy_(torch.arange(t.numel(), dtype=dtype).view(LARGE))
    view = t.numpy()
    assert np.shares_memory(view, t.numpy())
    np.testing.assert_array_equal(view.ravel()[-3:], np.arange(t.numel())[-3:])
    assert float(t.double().sum()) == float(torch.arange(t.numel(), dtype=torch.float64).sum())


def test_large_tensor_is_advised_for_huge_pages_on_linux():
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        pytest.skip("no MADV_HUGEPAGE on this system")
    t = _memory.empty(LARGE, torch.float32)  # rounded up to 2 huge pages
    found = _mapping(t.data_ptr())
    if found is None:
        pytest.skip("no /proc/self/smaps")
    size, flags = found
    assert "hg" in flags, flags  # madvise(MADV_HUGEPAGE) reached the kernel
    assert size % _memory.HUGE_PAGE_BYTES == 0  # whole huge pages (adjacent ones may merge)


@pytest.mark.parametrize("shape", [LARGE, (5, 3)])
def test_zeros_are_zero_mapped_or_not(shape):
    t = _memory.zeros(shape, torch.float64)
    assert t.shape == shape and t.dtype == torch.float64 and not t.any()


def test_the_huge_page_size_is_the_kernels():
    size = Path("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")
    if not size.exists():
        pytest.skip("no transparent huge pages here")
    assert int(size.read_text()) == _memory.HUGE_PAGE_BYTES


def test_from_exactly_one_huge_page_up_tensors_are_mapped(monkeypatch):
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        pytest.skip("no MADV_HUGEPAGE on this system")
    sizes: list[int] = []

    class Counting(mmap.mmap):
        def __new__(cls, fileno, length, *args, **kwargs):
            sizes.append(length)
            return super().__new__(cls, fileno, length, *args, **kwargs)

    monkeypatch.setattr(_memory.mmap, "mmap", Counting)
    _memory.empty((_memory.HUGE_PAGE_BYTES // 8,), torch.float64)
    _memory.empty((_memory.HUGE_PAGE_BYTES // 8 + 1,), torch.float64)
    assert not _memory.zeros((_memory.HUGE_PAGE_BYTES // 4,), torch.float32).any()
    assert sizes == [_memory.HUGE_PAGE_BYTES, 2 * _memory.HUGE_PAGE_BYTES, _memory.HUGE_PAGE_BYTES]


def test_small_tensors_other_devices_other_systems_or_no_huge_pages_use_torch_empty(monkeypatch):
    def no_mapping(*args, **kwargs):
        raise AssertionError("mmap called")

    monkeypatch.setattr(_memory.mmap, "mmap", no_mapping)
    below = (_memory.HUGE_PAGE_BYTES // 8 - 1,)
    assert _memory.empty(below, torch.float64).shape == below
    assert not _memory.zeros(below, torch.float64).any()
    assert _memory.empty(LARGE, torch.float64, huge_pages=False).shape == LARGE
    assert not _memory.zeros(LARGE, torch.float64, huge_pages=False).any()
    meta = _memory.empty(LARGE, torch.float64, "meta")
    assert meta.device.type == "meta" and meta.shape == LARGE
    monkeypatch.delattr(_memory.mmap, "MADV_HUGEPAGE", raising=False)
    assert _memory.empty(LARGE, torch.float32).shape == LARGE


def test_a_kernel_refusing_the_advice_gives_ordinary_pages(monkeypatch):
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        pytest.skip("no MADV_HUGEPAGE on this system")

    class Refusing(mmap.mmap):
        def madvise(self, *args):
            raise OSError(22, "Invalid argument")

    monkeypatch.setattr(_memory.mmap, "mmap", Refusing)
    t = _memory.empty(LARGE, torch.float64).fill_(2.0)
    assert float(t.sum()) == 2.0 * t.numel()


def test_a_mapping_that_fails_leaves_the_error_to_torch(monkeypatch):
    def no_memory(*args, **kwargs):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(_memory.mmap, "mmap", no_memory)
    assert _memory.empty(LARGE, torch.float64).shape == LARGE  # torch's own allocation
    with pytest.raises(RuntimeError, match="allocate"):
        _memory.empty((2**40,), torch.float64)  # 8 TB


def test_simulate_uses_huge_pages_on_one_thread_only_with_the_same_numbers(monkeypatch):
    import simulations.driver
    import simulations.gram
    from shapedtx import ModelConfig
    from simulations import equicorrelated, simulate

    mapped: list[tuple[int, ...]] = []

    def spy(function):
        def wrapper(shape, *args, **kwargs):
            if kwargs.get("huge_pages", True):
                mapped.append(tuple(shape))
            return function(shape, *args, **kwargs)

        return wrapper

    monkeypatch.setattr(simulations.driver, "empty", spy(_memory.empty))
    monkeypatch.setattr(simulations.gram, "zeros", spy(_memory.zeros))
    cfg = ModelConfig(width=64, depth=8, causal=True)
    V0 = equicorrelated(4, 0.3)
    threads = torch.get_num_threads()
    results, calls = {}, {}
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            mapped.clear()
            results[count] = simulate(cfg, V0, 4096, method="gram", seed=3)["V"].values
            calls[count] = list(mapped)
    finally:
        torch.set_num_threads(threads)
    np.testing.assert_array_equal(results[1], results[2])
    assert (4096, 9, 4, 4) in calls[1] and len(calls[1]) > 1  # the result and the workspace
    assert calls[2] == []  # two threads: ordinary pages (measured slower with huge ones)
    found = _mapping(results[1].ctypes.data)
    if found is not None and hasattr(mmap, "MADV_HUGEPAGE"):
        assert "hg" in found[1]
