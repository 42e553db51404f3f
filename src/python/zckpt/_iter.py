"""zckpt.iter_tensors: a checkpoint's tensors one at a time, the weight iterator of inference
engines (vLLM's and SGLang's `load_weights(weights)`) and of RL weight sync (verl)."""
import json
import os

import torch

from . import _core, _paths, _records
from ._arg_checks import allowed_globals as _allowed
from ._arg_checks import path_of as _path
from ._errors import CorruptError, ZckptError, findings_error
from ._host import RecentBuffers, byte_batches, frombuffer
from ._into import saved_contiguous, saved_dtype, saved_view, viewable_problem
from ._load_ranges import device_bytes, device_index, load_ranges
from ._sharded import records_of

_INDEX_SUFFIX = ".zckpt.index.json"  # what `zckpt convert` writes for model.safetensors.index.json


def container_files(path):
    """The containers of `path` in load order: a container alone; a folder written by
    `zckpt convert` from a sharded checkpoint: the shards its *.zckpt.index.json names, in the
    order of their names (HF's -0000K-of-0000N.); any other folder: its *.zckpt files, sorted.
    A folder may be an object folder, s3://BUCKET/PREFIX/ (one listing; s3://BUCKET/PREFIX, no
    slash: one HEAD first, as an object of that name is a container, then that listing).
    Raises ZckptError when a folder holds none, or its index names a shard that is not there."""
    path = _path(path)
    present = None
    if _paths.is_url(path):
        # One request a question: is there an object of that name (a HEAD, not asked of a folder
        # URL), what is below the prefix (one listing: the folder test and its names at once).
        folder_url = path.endswith("/") or "/" not in path[len(_paths.SCHEME):]  # .../ or s3://BUCKET
        if not folder_url and _core.object_exists(path):
            return [path]
        below = _paths.files_under(path)
        if not below and not folder_url:
            return [path]  # neither: opening it says so
        present = {n for n in below if "/" not in n}  # its direct objects, not a HEAD per name
    elif not os.path.isdir(path):
        return [path]

    def isfile(name):
        return name in present if present is not None else os.path.isfile(_paths.join(path, name))

    names = sorted(present) if present is not None else _paths.listdir(path)
    indexes = [n for n in names if n.endswith(_INDEX_SUFFIX)]
    if len(indexes) > 1:
        raise ZckptError(f"{path}: more than one index ({', '.join(indexes)}): give the container or index to load")
    if indexes:
        index = _paths.join(path, indexes[0])
        try:
            weight_map = json.loads(_paths.read_bytes(index).decode("utf-8"))["weight_map"]
            files = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, ZckptError) as e:
            raise ZckptError(f"{index}: not a readable shard index ({type(e).__name__}: {e})") from None
        missing = [f for f in files if not isfile(f)]
        if missing:
            raise ZckptError(f"{index} names shards that are not in {path}: {', '.join(missing)}")
        return [_paths.join(path, f) for f in files]
    files = [_paths.join(path, n) for n in names if n.endswith(".zckpt") and isfile(n)]
    if not files:
        raise ZckptError(f"{path}: no .zckpt containers in this folder (convert one with `zckpt convert DIR -o OUT`)")
    return files


def iter_tensors(path, device="cpu", *, verify=True, verify_first=False, mmap=False, allow_globals=()):
    """Yields (name, tensor) for every tensor of a container, or of every container of a folder
    (container_files), in file order.

    Each tensor is streamed by zckpt's loader into a fresh contiguous tensor on `device`
    (`torch.device`, "cpu", "cuda:N"), reading only its own chunks, each checked against its
    checksum as it arrives (verify=False: not checked). Memory: the tensor being handed out plus
    the loader's ring while it loads: a consumer that drops each tensor after using it holds at
    most one tensor beyond what it keeps (the pages of a large CPU tensor it dropped are reused
    for the next). Tensors sharing storage in the file (tied weights, views) come out as separate
    copies.

    mmap=True (device "cpu" only): each file is mapped and every chunk checked where it lies in
    the mapping (no copy), then its tensors are yielded as views of that copy-on-write mapping
    (tied weights stay views of one storage), as zckpt.load(mmap=True) gives them: no memory
    beyond the page cache, and one copy fewer for a consumer that copies each tensor into its own
    parameters (vLLM's weight loaders); bytes another process rewrites in place later show through.

    verify_first=True checks every chunk of every file (and every file's pickle) before the first
    tensor is yielded: a corrupt checkpoint raises CorruptError naming file, tensor and byte
    range while the consumer has received nothing, which is what a weight update that must not
    be half-applied needs (without mmap its `problems` lists every damaged chunk with its place,
    as zckpt.verify's does). It reads the files once more (from the page cache when they fit).
    All files are opened when iter_tensors is called and read through those open files, so a
    checkpoint renamed over the path meanwhile is read whole from the files opened.
    """
    return stream(open_containers(path), device, verify=verify, verify_first=verify_first, mmap=mmap,
                  allow_globals=allow_globals)


def open_containers(path):
    """Every container_files(path), opened now as the torch-free core's checkpoints, in load
    order: what stream() and table_of() read, so both see the same files whatever is renamed over
    `path` later."""
    return [_core.open(f) for f in container_files(path)]


def stream(checkpoints, device="cpu", *, verify=True, verify_first=False, mmap=False, allow_globals=()):
    """iter_tensors over containers already open (open_containers)."""
    device = torch.device(device)
    allowed = _allowed(allow_globals)
    if mmap:
        if device.type != "cpu":
            raise ValueError(f"mmap=True gives CPU views of the files; device {str(device)!r} needs mmap=False")
        check = verify or verify_first
        if verify_first:  # every file mapped and checked now
            return _flatten([_mapped_tensors(c, check, allowed) for c in checkpoints])
        return _flatten(_mapped_tensors(c, check, allowed) for c in checkpoints)  # each file when reached
    # Everything that can fail before data moves, for every file, before the first yield.
    device_index(device)  # ValueError for a device zckpt cannot load to
    return _flatten([_streamed_tensors(c, device, verify, verify_first, allowed) for c in checkpoints])


def _plain_records(c, allowed):
    """The records iter_tensors hands out (internal ones, a DTensor's DeviceMesh, left out), after
    the object pickle is vetted (it must describe the index's tensors, as for load) and every
    record is known to be rebuildable as a plain tensor: errors before the first yield."""
    c.vetted_pickle(allowed)
    records = [r for r in _records.of_checkpoint(c) if not r.internal]
    for r in records:
        why = viewable_problem(r, f"tensor '{r.name}' in {c.path}")
        if why:
            raise ZckptError(why)
    return records


def _streamed_tensors(c, device, verify, verify_first, allowed):
    """(name, tensor on `device`) per record of the open `_core` checkpoint `c`, each a fresh
    contiguous tensor filled by one streaming pass over that record's chunks (a generator, after
    the checks of _plain_records and, with verify_first, every chunk of the file: those raise
    here)."""
    records = _plain_records(c, allowed)
    if verify_first:
        problems = c.verify_chunks()
        if problems:
            raise findings_error(f"{c.path}: verified before the first tensor was handed out: {len(problems)} "
                                 "problem(s):" + "".join(f"\n  {p['message']}" for p in problems), problems)
    buffers = RecentBuffers() if device.type == "cpu" else _DeviceBuffers(c.path, device)
    return _fill_each(c, records, buffers, verify)


class _DeviceBuffers:
    """Fresh CUDA memory per tensor from torch's caching allocator, which reuses what the
    consumer dropped (RecentBuffers' job on the host)."""

    def __init__(self, path, device):
        self.path, self.device, self.index = path, device, device_index(device)

    def take(self, n):
        return device_bytes(self.path, n, self.device, f"a tensor of {n} bytes")


# Consecutive small tensors are filled by one streaming pass (a pass has a fixed cost: its threads
# and ring), up to this many bytes: at most this much is held beyond the tensor handed out.
_BATCH_BYTES = 8 << 20


def _fill(c, batch, buffers, verify):
    """(uint8 tensor, address) per record of `batch`, filled by one streaming pass."""
    raws = [buffers.take(r.byte_end - r.byte_begin) for r in batch]
    ranges = [(r.storage, r.byte_begin, r.byte_end, address, buffers.index)
              for r, (_, address) in zip(batch, raws) if r.byte_end > r.byte_begin]
    if ranges:
        load_ranges(c, ranges, verify)
    return raws


def _fill_each(c, records, buffers, verify):
    for batch in byte_batches(records, lambda r: r.byte_end - r.byte_begin, _BATCH_BYTES):
        try:
            raws = _fill(c, batch, buffers, verify)
        except CorruptError:
            # Hand out the good tensors before the damaged one, as a tensor-by-tensor stream would:
            # one pass each, until the one whose chunk is bad raises.
            yield from _fill_each_alone(c, batch, buffers, verify)
            return
        for i, r in enumerate(batch):
            raw = raws[i][0]
            raws[i] = None  # the consumer's reference is the only one left
            t = _rebuilt(raw, r)
            raw = None
            yield r.name, t
            t = None  # a buffer the consumer dropped is free for the next batch


def _fill_each_alone(c, batch, buffers, verify):
    for r in batch:
        (raw, _), = _fill(c, [r], buffers, verify)
        t = _rebuilt(raw, r)
        raw = None
        yield r.name, t
        t = None


def _rebuilt(raw, r):
    """The record's tensor, dense, over (or copied from) `raw`, its bytes byte_begin..byte_end."""
    dtype = saved_dtype(r)
    if saved_contiguous(r):
        return raw.view(dtype).view(r.shape)
    # A strided or offset view, or conj/neg bits: rebuilt over its bytes, then made dense.
    return saved_view(raw, r, dtype, r.byte_begin).contiguous()


def _mapped_tensors(c, verify, allowed):
    """(name, CPU view of the file's copy-on-write mapping) per record of the open `_core`
    checkpoint `c`, every chunk hashed where it lies first with verify (tied weights stay views of
    one storage)."""
    records = _plain_records(c, allowed)
    keys = [s["key"] for s in c.describe()["storages"]]
    mapped = {key: frombuffer(b) for key, b in c.map_storages(keys, verify).items()}
    return [(r.name, saved_view(mapped[keys[r.storage]], r, saved_dtype(r), 0)) for r in records]


def _flatten(sources):
    """A generator (iter_tensors itself raises open, vet and verify_first errors)."""
    sources = iter(sources)
    for s in sources:
        it = iter(s)
        del s  # a mapped file's list is released as its tensors are handed out
        for item in it:
            yield item
            item = None  # noqa: F841 (the consumer's reference is the only one left)


def tensor_table(path):
    """{name: (dtype name, shape tuple)} of every tensor of a container or converted folder, from
    the indexes alone (nothing read but them)."""
    return table_of(open_containers(path))


def table_of(checkpoints):
    """tensor_table of containers already open (open_containers): their indexes, read at open."""
    table = {}
    for c in checkpoints:
        table.update((r.name, (r.dtype, r.shape)) for r in records_of(c).values() if not r.internal)
    return table
