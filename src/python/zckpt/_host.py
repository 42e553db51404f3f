"""CPU memory the torch-free core fills, as torch tensors: what zckpt.load, iter_tensors and
load_into's staging allocate (zckpt's aligned HostBuffers from 64 KiB, torch's allocator below),
and CPU tensors over `_core`'s buffers."""
import sys

import torch

from . import _core

# Host storages of at least this many bytes are 4 KiB-aligned HostBuffers (_core), so bytes not
# in the page cache are read straight into them with O_DIRECT; smaller ones come from torch's
# allocator (64-byte aligned), where a page-cache read costs nothing measurable.
_HOST_BUFFER_MIN = 64 << 10


def host_bytes(n):
    """A uint8 CPU tensor of n bytes for a storage to be filled, and its address."""
    if n < _HOST_BUFFER_MIN:
        t = torch.empty(n, dtype=torch.uint8)
        return t, t.data_ptr()
    buf = _core.HostBuffer(n)
    return frombuffer(buf), buf.address


def frombuffer(buffer):
    """A uint8 CPU tensor over a `_core` buffer (HostBuffer, MappedBytes), keeping it alive."""
    if len(buffer) == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(buffer, dtype=torch.uint8)


def byte_batches(items, size_of, limit):
    """Consecutive runs of `items` whose size_of() add up to at most `limit` bytes (an item larger
    than `limit` alone): how iter_tensors fills small tensors, and load_into stages views, one
    streaming pass per run."""
    batch, size = [], 0
    for item in items:
        n = size_of(item)
        if batch and size + n > limit:
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += n
    if batch:
        yield batch


class RecentBuffers:
    """host_bytes for a stream of tensors handed out one by one (iter_tensors): the last two large
    HostBuffers are kept, and one the consumer no longer references (no tensor or view of it
    alive: torch holds the buffer while any does) is filled again for the next tensor that fits,
    its pages already faulted in, as the C++ TensorStream does."""

    _KEPT = 2
    index = -1  # host memory (_load_ranges.load_ranges' device index)

    def __init__(self):
        self._recent = []

    def take(self, n):
        if n < _HOST_BUFFER_MIN:
            return host_bytes(n)
        buf = None
        for i in range(len(self._recent)):
            # References: the list's and getrefcount's argument; any more is a live tensor.
            if len(self._recent[i]) >= n and sys.getrefcount(self._recent[i]) == 2:
                buf = self._recent.pop(i)
                break
        if buf is None:
            buf = _core.HostBuffer(n)
        self._recent = (self._recent + [buf])[-self._KEPT:]
        return torch.frombuffer(buf, dtype=torch.uint8, count=n), buf.address
