"""zckpt.save and zckpt.async_save: containers written straight from training, no `.pt` on the way.

The object is pickled the way torch.save pickles it (torch.serialization._save's persistent ids
for storages, mirrored below), so the kept pickle is byte for byte the data.pkl torch.save would
write, and the container is the one `zckpt convert` makes of that torch.save file: the C++ side
derives storages and tensor records from this pickle with zckpt's own interpreter (the
converter's code), and takes the small records torch's zip writer adds from that writer
(_archive_records). Storages are written by the torch-free core (`_core`), by address: host
storages from their own memory, CUDA storages through its pinned ring. So
zckpt.load, zckpt::Load and `zckpt export` + torch.load all give back what torch.load of a
torch.save file gives.
"""
import concurrent.futures
import io
import os
import pickle
import sys
import threading

import torch
import torch.serialization as _serialization

from . import _core
from ._arg_checks import allowed_globals, size
from ._errors import ZckptError

DEFAULT_PROTOCOL = _serialization.DEFAULT_PROTOCOL
_SNAPSHOT_ALIGN = 64


def _path(f):
    if isinstance(f, (str, os.PathLike)):
        return os.fspath(f)
    raise TypeError(f"zckpt saves to paths, not {type(f).__name__}")


def _pickle_like_torch_save(obj, pickle_module, pickle_protocol):
    """(data.pkl bytes, {key: UntypedStorage} in key order) exactly as torch.serialization._save
    makes them (its persistent_id, mirrored; tests hold the bytes against torch.save's)."""
    serialized_storages = {}
    id_map = {}
    # torch refuses to save one storage under two dtypes: it could not load it back.
    storage_dtypes = {}

    def persistent_id(obj):
        if isinstance(obj, torch.storage.TypedStorage) or torch.is_storage(obj):
            if isinstance(obj, torch.storage.TypedStorage):
                storage = obj._untyped_storage
                storage_dtype = obj.dtype
                storage_type = getattr(torch, obj._pickle_storage_type())
                storage_numel = obj._size()
            else:
                storage = obj
                storage_dtype = torch.uint8
                storage_type = _serialization.normalize_storage_type(type(obj))
                storage_numel = storage.nbytes()
            if str(storage.device) != "meta" and storage.data_ptr() != 0:
                if storage.data_ptr() in storage_dtypes:
                    if storage_dtype != storage_dtypes[storage.data_ptr()]:
                        raise RuntimeError(
                            "Cannot save multiple tensors or storages that view the same data as different types")
                else:
                    storage_dtypes[storage.data_ptr()] = storage_dtype
            storage_key = id_map.setdefault(storage._cdata, str(len(id_map)))
            if getattr(obj, "_fake_device", None) is not None:
                location = str(obj._fake_device)
            else:
                location = _serialization.location_tag(storage)
            serialized_storages[storage_key] = storage
            return ("storage", storage_type, storage_key, location, storage_numel)
        return None

    class _Pickler(pickle_module.Pickler):
        def persistent_id(self, obj):
            return persistent_id(obj)

    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle_protocol).dump(obj)
    return buf.getvalue(), serialized_storages


def _leading_records():
    """The records torch.save writes between data.pkl and the storages (torch.serialization._save)."""
    alignment = getattr(_serialization, "_get_storage_alignment", lambda: 64)()
    return [(".format_version", b"1"), (".storage_alignment", str(alignment).encode()),
            ("byteorder", sys.byteorder.encode())]


def _archive_records(pickle_bytes):
    """(records before the storages, records after them, {name: bytes} of every one) of the
    zip archive torch.save would write for this pickle, made by torch's own zip writer: data.pkl
    and _leading_records() come first; the writer adds its own at the end (version,
    .data/serialization_id). Only these few hundred bytes plus the pickle go through it."""
    leading = _leading_records()
    buf = io.BytesIO()
    writer = torch._C.PyTorchFileWriter(buf)
    for name, data in [("data.pkl", pickle_bytes)] + leading:
        writer.write_record(name, data, len(data))
    writer.write_end_of_file()
    reader = torch._C.PyTorchFileReader(io.BytesIO(buf.getvalue()))
    names = reader.get_all_records()
    ours = 1 + len(leading)
    if names[:ours] != ["data.pkl"] + [name for name, _ in leading]:
        raise RuntimeError(f"torch's zip writer did not keep the records in the order written: {names}")
    return names[:ours], names[ours:], {name: reader.get_record(name) for name in names}


def _save_pickled(path, pickle_bytes, storages, metadata, chunk_bytes, zstd_level, threads, allowed):
    """The write of a pickle and its storages (`storages`: key -> 1-D uint8 tensor on the CPU or a
    CUDA device, kept alive by the caller for the call) by the torch-free core, the pickle
    refused unless every global it names is on the allowlist or in `allowed` ('module.name').
    CUDA storages' copies wait for torch's current stream on their device, under torch's device
    guard."""
    for key, t in storages.items():
        if t.device.type not in ("cpu", "cuda"):
            raise ZckptError(f"{path}: storage '{key}' is on {t.device} (zckpt saves from cpu and cuda)")
    before, after, records = _archive_records(pickle_bytes)
    where = {key: (t.data_ptr(), t.numel(), t.device.index if t.is_cuda else -1) for key, t in storages.items()}
    devices = sorted({index for _, _, index in where.values() if index >= 0})
    streams = {index: torch.cuda.current_stream(index).cuda_stream for index in devices}
    args = (path, pickle_bytes, where, before, after, records, "", dict(metadata or {}), chunk_bytes, zstd_level,
            threads, streams, allowed)
    if not devices:
        return _core.save_pickled(*args)
    with torch.cuda.device(devices[0]):
        return _core.save_pickled(*args)


def _bytes_of(storage):
    """A 1-D uint8 tensor over all of `storage`, where it lives (cpu, cuda). Storages elsewhere
    (mps, xpu, ...) are copied to the CPU first, as torch.save does."""
    if storage.device.type not in ("cpu", "cuda", "meta"):
        storage = storage.cpu()
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _check_options(chunk_bytes, zstd_level, threads):
    """(chunk_bytes, threads) as the writer takes them, 0 for the default (_arg_checks.size);
    ValueError for a bad one, zstd_level included."""
    if not isinstance(zstd_level, int) or isinstance(zstd_level, bool) or zstd_level < 0:
        raise ValueError(f"zstd_level must be a non-negative int, not {zstd_level!r}")
    return size("chunk_bytes", chunk_bytes) or 0, size("threads", threads) or 0


def save(obj, f, *, pickle_module=pickle, pickle_protocol=DEFAULT_PROTOCOL, chunk_bytes=0, zstd_level=0,
         threads=0, metadata=None, allow_globals=()):
    """Writes `obj` (anything torch.save takes) as a container at path `f`; returns statistics.

    What zckpt.load, `zckpt export` + torch.load, and zckpt::Load give back is what torch.load
    of torch.save(obj) gives. CPU storages are written from their own memory (those of 1 MiB or
    more without any copy), CUDA storages through a small pinned ring (4 x 8 MiB), device -> host
    -> file, never a host copy of a whole tensor.
    Atomic: the file appears only when complete (temporary, fsync, rename); a failed save leaves
    nothing at `f` (a file already there stays as it was).

    chunk_bytes: container chunk size (0 or None: 4 MiB). zstd_level: 0 (default) stores raw; 1..22
    compresses each chunk, keeping it raw when that does not shrink it. threads: hashing /
    compressing threads (0 or None: one per core). metadata: {str: str} for the container's metadata
    table (keys starting with 'zckpt.' are reserved). allow_globals: globals the pickle may name
    besides zckpt's allowlist of data globals ('module.name' strings, or the classes and
    functions themselves), as zckpt.load takes them.

    The pickle is vetted as zckpt.load vets it, before anything is written: a global off the
    allowlist and not in allow_globals (a class of the caller's, such as transformers'
    TrainingArguments) raises UnsafeError naming it, and nothing is written, since the load of
    that file would refuse it too unless given the same allow_globals.
    """
    path = _path(f)
    chunk_bytes, threads = _check_options(chunk_bytes, zstd_level, threads)
    allowed = allowed_globals(allow_globals)
    data, storages = _pickle_like_torch_save(obj, pickle_module, pickle_protocol)
    tensors = {key: _bytes_of(s) for key, s in storages.items()}
    return _save_pickled(path, data, tensors, metadata, chunk_bytes, zstd_level, threads, allowed)


class AsyncSaver:
    """Saves in the background: `save()` takes a snapshot and returns a Future at once.

    The snapshot is the object's pickle plus a host copy of every storage it holds, so the
    caller may change the object (optimizer.step(), new dict entries) as soon as save() returns
    without changing what is written. The write (zckpt.save's, same container) runs on one
    background thread with the GIL released; its result (statistics) or its error is on the
    Future. A save waits for the previous one to finish before taking its snapshot, so at most
    one is in flight and the snapshot memory is reused.

    Memory cost: one host buffer the size of the checkpoint's storages (the sum of their bytes,
    each rounded up to 64), page-locked (pinned) when any storage is on CUDA so the device ->
    host copy is a DMA; kept between calls and reused, grown (the old one freed first) only for
    a larger checkpoint; close() frees it. Plus the pickle, and while writing the writer's
    2 x threads chunk buffers. The call blocks for pickling and that one copy (CUDA storages:
    copied on torch's current stream, which is then synchronized).
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._executor = None
        self._pending = None
        self._buffer = None  # 1-D uint8 host tensor holding the last snapshot

    @property
    def buffer_bytes(self):
        """Host memory the snapshot buffer holds now."""
        return 0 if self._buffer is None else self._buffer.numel()

    def save(self, obj, f, *, pickle_module=pickle, pickle_protocol=DEFAULT_PROTOCOL, chunk_bytes=0, zstd_level=0,
             threads=0, metadata=None, allow_globals=()):
        """Snapshots `obj` and returns a concurrent.futures.Future of its write to `f` (options as
        zckpt.save). Errors of the object are raised here, before anything is copied: one that
        cannot be pickled, and UnsafeError for a global off the allowlist and not in
        allow_globals; errors writing (the disk, the path) are raised by the Future's result()."""
        path = _path(f)
        chunk_bytes, threads = _check_options(chunk_bytes, zstd_level, threads)
        allowed = allowed_globals(allow_globals)
        with self._lock:
            self._wait_pending()
            data, storages = _pickle_like_torch_save(obj, pickle_module, pickle_protocol)
            _core.vet_pickle(data, allowed)
            host = self._snapshot(storages, threads)
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                                       thread_name_prefix="zckpt-async-save")
            # The snapshot is host memory whatever the source; `host` is held by the call.
            self._pending = self._executor.submit(_save_pickled, path, data, host, metadata, chunk_bytes, zstd_level,
                                                  threads, allowed)
            return self._pending

    def wait(self):
        """Waits for the save in flight, if any (its outcome stays on its Future)."""
        with self._lock:
            self._wait_pending()

    def close(self):
        """Waits for the save in flight, stops the background thread and frees the buffer."""
        with self._lock:
            self._wait_pending()
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
            self._buffer = None

    def _wait_pending(self):
        if self._pending is not None:
            concurrent.futures.wait([self._pending])
            self._pending = None

    def _snapshot(self, storages, threads):
        """{key: 1-D uint8 view of the buffer} holding a copy of each storage's bytes: CPU ones
        by memcpy (`threads` threads), CUDA ones by copy_ on torch's current stream."""
        layout, total = {}, 0
        for key, s in storages.items():
            layout[key] = (total, s.nbytes())
            total += -(-s.nbytes() // _SNAPSHOT_ALIGN) * _SNAPSHOT_ALIGN
        sources = {key: _bytes_of(s) for key, s in storages.items()}
        cuda_devices = {t.device for t in sources.values() if t.device.type == "cuda"}
        pinned = bool(cuda_devices)
        buf = self._buffer
        if buf is None or buf.numel() < total or (pinned and not buf.is_pinned()):
            self._buffer = buf = None  # the old buffer goes before the new one comes
            buf = torch.empty(max(total, 1), dtype=torch.uint8, pin_memory=pinned)
            self._buffer = buf
        host, cpu_copies = {}, []
        for key, src in sources.items():
            offset, n = layout[key]
            host[key] = dst = buf[offset:offset + n]
            if src.device.type == "cpu":
                if n:
                    cpu_copies.append((dst.data_ptr(), src.data_ptr(), n))
            elif n:
                dst.copy_(src, non_blocking=True)
        _core.copy_host_bytes(cpu_copies, threads)  # `sources` and `buf` hold both sides
        for device in cuda_devices:  # the copies were queued on torch's current streams
            torch.cuda.current_stream(device).synchronize()
        return host


_default_saver = AsyncSaver()


def async_save(obj, f, **options):
    """zckpt.save in the background; returns a concurrent.futures.Future as soon as the snapshot
    is taken. Uses one process-wide AsyncSaver (see it for the memory cost: one reused host copy
    of the checkpoint's storages, pinned for CUDA); a second call waits for the first write."""
    return _default_saver.save(obj, f, **options)
