"""The caller's buffers registered in place, cached (issue 41 item 5): a switch call sends
an int32 input straight from the caller's memory instead of copying it into the workspace.

Registering memory costs system calls and pins its pages, so regions are kept across calls,
as NCCL (`ncclCommRegister`) and UCX (its registration cache) keep them. A region is only
valid for the memory it pinned: once the buffer is freed its address may be handed out
again (a large numpy array is mmap'd, and a new mapping at the same address is other
pages), and a cache keyed by address alone would then send stale bytes. NCCL leaves that to
the caller (deregister before free); UCX hooks the allocator. Here:

Invariant: an entry (address, nbytes) -> region is present only while the object that owns
that memory (`owner`: the root of the array's `.base` chain) is alive -- it is held by
weak reference, and its collection deregisters the region and drops the entry, before the
memory can be reused -- and at most `capacity` entries are kept (least recently used first
out) besides those pinned: a region a call may still send from (`local(array, pin=seq)`,
with calls in flight up to K of them, and those of calls kept for recovery) is never evicted
until `unpin` releases that call. A hit is the same address and length under the same live owner; anything else
registers anew (an owner that reallocates its memory while alive, `ndarray.resize`, is the
one case not seen: NCCL's contract, deregister first, applies there). Memory whose owner
cannot be weakly referenced or may die before the memory does (a torch tensor's numpy view
is owned by the temporary `detach()` of netreduce.tensors: a new owner per call), or that
cannot be registered (RLIMIT_MEMLOCK, a device without it), is not cached: `local` returns
None and the caller copies, as before. A fork after registration keeps the pinned pages
with this process on the kernels the project runs (copy-on-fork of pinned pages since
Linux 5.13): a region never goes stale because of a child.
"""
from __future__ import annotations

import logging
import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable

import numpy as np

from flowctl.link import LocalBuffer
from netreduce.tensors import is_tensor
from netreduce.workspace import RegisteredMemory

logger = logging.getLogger(__name__)

CAPACITY = 32          # regions kept (each pins its buffer's pages until evicted or freed)

RegisterUser = Callable[[int, int], RegisteredMemory]     # (address, nbytes) -> region


def owner_of(array: np.ndarray) -> Any:
    """The object that owns `array`'s memory: the end of its `.base` chain (the array
    itself when it owns its data); None for a torch tensor's (module doc)."""
    owner: Any = array
    while isinstance(owner, np.ndarray) and owner.base is not None:
        owner = owner.base
    return None if is_tensor(owner) else owner


class _Entry:
    def __init__(self, region: RegisteredMemory, owner: Any,
                 finalizer: weakref.finalize) -> None:
        self.region, self.owner, self.finalizer = region, weakref.ref(owner), finalizer
        self.pins: set[int] = set()         # the calls that may still send from it


class RegistrationCache:
    """Regions of the caller's memory by (address, nbytes) (module doc). `hits`, `misses`
    and `evictions` count lookups and deregistrations for room; `collected` the regions
    dropped because their owner was collected; `failures` the registrations refused."""

    def __init__(self, register: RegisterUser | None, capacity: int = CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"netreduce: a registration cache of {capacity} entries")
        self._register = register
        self.capacity = capacity
        self._entries: OrderedDict[tuple[int, int], _Entry] = OrderedDict()
        self._lock = threading.RLock()      # a collection may run on any thread, also
        #                                     while this one holds it (a GC pass)
        self.hits = self.misses = self.evictions = self.collected = self.failures = 0

    def __len__(self) -> int:
        return len(self._entries)

    def local(self, array: np.ndarray, pin: int | None = None) -> LocalBuffer | None:
        """`array`'s bytes (C-contiguous, not empty) as registered local memory, from the
        cache or registered now, pinned for call `pin` (until `unpin`); None when they
        cannot be (module doc)."""
        if self._register is None or array.nbytes == 0 \
                or not array.flags.c_contiguous:
            return None
        owner = owner_of(array)
        if owner is None:
            return None
        key = (array.__array_interface__["data"][0], array.nbytes)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.owner() is owner:
                self._entries.move_to_end(key)
                self.hits += 1
                if pin is not None:
                    entry.pins.add(pin)
                return entry.region.local()
            if entry is not None:               # a dead owner whose finalizer has not run
                self._drop(key)
        try:
            probe = weakref.ref(owner)
        except TypeError:
            return None                         # cannot tell when it is freed: not cached
        del probe
        try:
            region = self._register(*key)
        except Exception as exc:    # noqa: BLE001 - any failure: copy, as before
            self.failures += 1
            if self.failures == 1:
                logger.warning("netreduce: a buffer of the caller's cannot be registered in "
                               "place (%s): switch calls copy such buffers into the "
                               "workspace (logged once; `failures` counts them)", exc)
            return None
        with self._lock:
            self.misses += 1
            finalizer = weakref.finalize(owner, self._collected, key, region)
            finalizer.atexit = False            # the device closes with the process
            entry = self._entries[key] = _Entry(region, owner, finalizer)
            if pin is not None:
                entry.pins.add(pin)
            self._evict()
        return region.local()

    def unpin(self, below: int | None = None) -> None:
        """Calls before `below` (None: all) send from no region any more; regions over
        `capacity` that nothing pins now go, least recently used first."""
        if not self._entries:       # nothing cached (a collection only removes entries)
            return
        with self._lock:
            for entry in self._entries.values():
                entry.pins = {seq for seq in entry.pins if below is not None and seq >= below}
            self._evict()

    def _evict(self) -> None:
        """Deregister the least recently used unpinned regions over `capacity` (lock held)."""
        unpinned = [k for k, e in self._entries.items() if not e.pins]
        for old in unpinned[:max(0, len(self._entries) - self.capacity)]:
            self.evictions += 1
            self._drop(old)

    def _collected(self, key: tuple[int, int], region: RegisteredMemory) -> None:
        """The owner of `region`'s memory was collected: deregister it (before its pages
        can be handed out again) and drop its entry if it is still the one cached."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.region is region:
                del self._entries[key]
            self.collected += 1
        region.close()

    def _drop(self, key: tuple[int, int]) -> None:
        """Deregister entry `key` now (lock held)."""
        entry = self._entries.pop(key)
        entry.finalizer.detach()
        entry.region.close()

    def close(self) -> None:
        """Deregister every region (before the device closes)."""
        with self._lock:
            while self._entries:
                self._drop(next(iter(self._entries)))
