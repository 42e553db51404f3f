"""Byte ranges of a container's storages into memory torch allocated, on the CPU or a CUDA device:
the one call zckpt.load, load_into and iter_tensors make on the torch-free core (`_core`'s
Checkpoint.load_ranges). For CUDA destinations it hands the core torch's current stream on each
device (the loader's copies wait for what is queued there: memory the caching allocator just
handed out, a target still being produced) and holds torch's device guard around the load; the
core drives the libcudart torch itself loaded, through its own run-time-loaded table."""
from operator import itemgetter

import torch

from ._oom import OutOfMemoryError


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
