"""Subnormal floats flushed to zero on every CPU thread that computes (issue 38).

As a model converges, gradients and optimizer states (Adam's second moment) fill with
subnormal floats (below 1.2e-38 in float32), and an x86 core takes a slow path for each
arithmetic operation that meets one: a trained HybridSN's CPU step took 1.53x a fresh one's.
Flush-to-zero (FTZ: subnormal results become 0) and denormals-are-zero (DAZ: subnormal inputs
read as 0) keep the step as fast as it started, at the cost of values below 1.2e-38, which
no training here depends on.

The modes are bits of each thread's MXCSR register. `torch.set_flush_denormal` sets them
on the calling thread only; torch's intra-op worker threads (OpenMP) copy their creator's
register when they start, so they flush if the mode was set before torch's first parallel
operation, and not otherwise. `flush_denormals` sets the calling thread, then, if a worker
does not follow, runs the setting on every thread of torch's OpenMP team through
`GOMP_parallel`, the entry point that `#pragma omp parallel` compiles to (libgomp, and
LLVM's and Intel's OpenMP runtimes, export it); torch has no call of its own for this.
`flushing_threads` checks the outcome with a subnormal product split over the threads.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

__all__ = ["as_before", "flush_denormals", "flushing_threads"]

# torch splits elementwise CPU work into chunks of at least this many elements
# (at::internal::GRAIN_SIZE): a product of `_GRAIN * threads * 2` elements reaches every thread.
_GRAIN = 32768
_RUNTIMES = ("libgomp", "libiomp", "libomp")  # OpenMP runtimes that export GOMP_parallel


def flush_denormals(on: bool = True) -> bool:
    """Flush subnormal floats to zero (or stop) on this thread and torch's CPU workers.

    Call it on each rank's training thread (`lbtrain train` does, `--flush-denormals`,
    the default). Returns whether every compute thread now does as asked: for `on`, False
    where the CPU has no such mode (not x86 with SSE3), or where torch's threads are not an
    OpenMP team that this can reach.
    """
    if not isinstance(on, bool):  # torch's own refusal names neither the argument nor us
        raise TypeError(f"on={on!r} ({type(on).__name__}) must be True or False")
    if not torch.set_flush_denormal(on):
        return not on  # no such mode: nothing flushes, which is "off" in force
    if flushing_threads() is not on:
        _on_every_worker(on)
    return flushing_threads() is on


def flushing_threads() -> bool | None:
    """Whether torch's CPU ops flush subnormal results to zero on the threads they use.

    True: on every thread; False: on none; None: on some (workers started before the
    setting). A product whose exact result is subnormal (1e-30 * 1e-10 in float32), split
    over `torch.get_num_threads()` threads, is zero where the thread flushes.
    """
    size = _GRAIN * max(1, torch.get_num_threads()) * 2
    with torch.no_grad():
        zero = torch.full((size,), 1e-30, dtype=torch.float32).mul_(1e-10) == 0
    flushed = int(zero.sum())
    return True if flushed == size else False if flushed == 0 else None


@contextmanager
def as_before() -> Iterator[None]:
    """Leave this thread and its workers flushing (or not) as this thread was before.

    The modes are the whole thread's, Python's own float arithmetic included: a run started
    from a user's process (or a test's) hands that process back as it found it. The state
    before is read on this thread alone, so that torch's workers start after the run's
    setting and inherit it.
    """
    before = _this_thread_flushes()
    try:
        yield
    finally:
        if _this_thread_flushes() is not before:
            flush_denormals(before)


def _this_thread_flushes() -> bool:
    with torch.no_grad():  # one element: computed on this thread, no worker started
        return bool(torch.full((1,), 1e-30, dtype=torch.float32).mul_(1e-10).item() == 0)


def _on_every_worker(on: bool) -> None:
    """Run `torch.set_flush_denormal(on)` on each thread of torch's OpenMP team, if found."""
    library = _openmp_runtime()
    if library is None:
        return
    try:
        parallel = ctypes.CDLL(library).GOMP_parallel
    except (OSError, AttributeError):
        return
    body_type = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    parallel.argtypes = [body_type, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
    parallel.restype = None

    # Each thread of the team, this one included, takes the GIL in turn (CDLL releases it
    # for the call) and sets its own register.
    def body(_: int | None) -> None:
        torch.set_flush_denormal(on)

    callback = body_type(body)  # kept alive for the call
    parallel(callback, None, torch.get_num_threads(), 0)


def _openmp_runtime() -> str | None:
    """The path of the OpenMP runtime torch loaded (its own first), or None."""
    try:
        text = Path("/proc/self/maps").read_text(encoding="utf-8", errors="surrogateescape")
    except OSError:
        return None  # no /proc (not Linux): the check reports what holds
    loaded = set()
    for line in text.splitlines():
        fields = line.split(maxsplit=5)  # address, perms, offset, dev, inode, path
        path = fields[5].removesuffix(" (deleted)") if len(fields) == 6 else ""
        if any(Path(path).name.startswith(name) for name in _RUNTIMES):
            loaded.add(path)
    own = str(Path(torch.__file__).parent / "lib")
    ranked = sorted(loaded, key=lambda path: (not path.startswith(own), path))
    return ranked[0] if ranked else None
