"""Byte ranges of a container's storages into memory torch allocated, on the CPU or a CUDA device:
the one call zckpt.load, load_into and iter_tensors make on the torch-free core (`_core`'s
Checkpoint.load_ranges), and the one staged load over it (load_staged: ranges straight into their
destinations, and ranges through host staging buffers then copied where they go). For CUDA destinations it hands the core torch's current stream on each
device (the loader's copies wait for what is queued there: memory the caching allocator just
handed out, a target still being produced) and holds torch's device guard around the load; the
core drives the libcudart torch itself loaded, through its own run-time-loaded table."""
from operator import itemgetter

import torch

from ._host import byte_batches
from ._oom import OutOfMemoryError

# Staging buffers are filled at most this many bytes per streaming pass (a range larger than this
# alone), so the host memory a staged load takes beyond its destinations stays bounded however
# many staged ranges there are.
STAGED_BYTES_PER_PASS = 256 << 20


def device_index(device):
    """-1 for the CPU, else the CUDA device's index (the current device for a bare "cuda");
    ValueError for any other device."""
    device = torch.device(device)
    if device.type == "cpu":
        return -1
    if device.type == "cuda":
        return device.index if device.index is not None else torch.cuda.current_device()
    raise ValueError(f"zckpt loads to cpu and cuda devices, not {device}")


def device_bytes(path, n, device, what):
    """A uint8 tensor of n bytes on CUDA `device` for `what` to be filled, and its address;
    OutOfMemoryError naming the file, the bytes and the device when the allocator has none."""
    try:
        t = torch.empty(n, dtype=torch.uint8, device=device)
    except torch.cuda.OutOfMemoryError as e:
        raise OutOfMemoryError(f"{path}: cannot allocate {n} bytes on {device} for {what}: {e}") from e
    return t, t.data_ptr()


def load_ranges(ckpt, ranges, verify=True, threads=None, slots=None, slot_bytes=None):
    """Fills `ranges` ((storage index, begin, end, address, device index) each, -1 for host memory)
    from the open `_core` checkpoint in one streaming pass; returns its figures (a dict)."""
    # CUDA memory to load into was allocated by torch, which then initialized CUDA: until it has,
    # every range is host memory and the ranges need no scan for their devices.
    streams = {}
    if torch.cuda.is_initialized():
        streams = {index: torch.cuda.current_stream(index).cuda_stream
                   for index in set(map(itemgetter(4), ranges)) if index >= 0}
    if not streams:
        return ckpt.load_ranges(ranges, {}, verify, threads, slots, slot_bytes)
    with torch.cuda.device(next(iter(streams))):
        return ckpt.load_ranges(ranges, streams, verify, threads, slots, slot_bytes)


class Staged:
    """Bytes [begin, end) of the storage at index `storage` read into a host staging buffer (a
    uint8 CPU tensor), then handed to `finish(buffer)`, which copies them where they go."""

    __slots__ = ("storage", "begin", "end", "finish")

    def __init__(self, storage, begin, end, finish):
        self.storage, self.begin, self.end, self.finish = storage, begin, end, finish


def load_staged(ckpt, direct, staged, verify=True, sizes=None):
    """Fills `direct` ((range, target) pairs: the range as load_ranges takes it, its bytes the
    contiguous target's, in order) and `staged` (Staged parts) from the open checkpoint `ckpt`,
    one streaming pass per STAGED_BYTES_PER_PASS of staged bytes; the first pass also fills the
    direct ranges, so there is one even with nothing staged. `sizes`: the ring (threads, slots,
    slot_bytes; _arg_checks.ring_sizes), None for the defaults. Targets written behind autograd's
    back have their version counters bumped, as copy_ would have. Returns the passes' figures
    summed: stored_bytes, raw_bytes, chunks."""
    totals = {"stored_bytes": 0, "raw_bytes": 0, "chunks": 0}
    passes = list(byte_batches(staged, lambda s: s.end - s.begin, STAGED_BYTES_PER_PASS)) or [[]]
    with torch.no_grad():  # as load_state_dict: in-place copies into leaves
        for i, batch in enumerate(passes):
            buffers = [torch.empty(s.end - s.begin, dtype=torch.uint8) for s in batch]
            ranges = ([r for r, _ in direct] if i == 0 else []) + [(s.storage, s.begin, s.end, b.data_ptr(), -1)
                                                                   for s, b in zip(batch, buffers)]
            stats = load_ranges(ckpt, ranges, verify, **(sizes or {}))
            for key in totals:
                totals[key] += stats[key]
            for s, b in zip(batch, buffers):
                s.finish(b)
    for _, t in direct:
        if not t.is_inference():
            torch.autograd.graph.increment_version(t)
    return totals
