"""zckpt's torch-free core: libzckpt_core.so beside this file, reached through its C interface
(include/zckpt/zckpt.h, in the wheel as zckpt/include/zckpt/zckpt.h) with ctypes, so the package
holds no extension module and one build runs under every Python 3 and every torch 2.x, or none.
Everything of the `zckpt` package that needs no torch (convert, export, verify, describe, the
object store) runs there, and so does every load: the Python layer allocates each storage or
tensor (HostBuffer, or torch's own memory on the CPU or a CUDA device) and load_ranges fills byte
ranges of storages through their addresses; a mapped load (mmap=True) hands out views of the
file's mapping; zckpt.save writes through save_pickled. ctypes lets go of the GIL for every call.

What moves bytes is a typed call, each declared below with its argtypes and restype: open and
close, host buffers, load_ranges (the ranges packed into one array of zckpt_range structs),
mapped storages and the container writer. Answers that are documents (describe, records, verify
reports, merge plans) come from zckpt_call, one JSON request naming the call and every argument;
bytes go in by address and come back as byte strings. Objects the core keeps are handles, let go
when their Python object is."""
import ctypes
import itertools
import json
import os
import struct
import weakref

# The interface version this module is written against (zckpt.h's ZCKPT_ABI_VERSION).
ABI_VERSION = 1

_LIB = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "libzckpt_core.so"))

from ._errors import (  # noqa: E402, F401 (zckpt._core.ZckptError and the rest, as _oom.py and callers take them)
    CancelledError, CorruptError, InvalidArgumentError, IoError, NotAContainerError, OutOfMemoryError, UnsafeError,
    UnsupportedError, ZckptError, for_kind, problem, set_out_of_memory_error)


class _Handle(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64)]


class _CheckpointHandle(_Handle):
    pass


class _HostBufferHandle(_Handle):
    pass


class _MappedHandle(_Handle):
    pass


class _WriterHandle(_Handle):
    pass


class _Range(ctypes.Structure):
    _fields_ = [("storage", ctypes.c_uint64), ("begin", ctypes.c_uint64), ("end", ctypes.c_uint64),
                ("address", ctypes.c_void_p), ("device", ctypes.c_int64)]


class _DeviceStream(ctypes.Structure):
    _fields_ = [("device", ctypes.c_int64), ("stream", ctypes.c_void_p)]


class _LoadOptions(ctypes.Structure):
    _fields_ = [("verify", ctypes.c_uint32), ("threads", ctypes.c_uint32), ("slots", ctypes.c_uint32),
                ("reserved", ctypes.c_uint32), ("slot_bytes", ctypes.c_uint64)]


class _LoadStats(ctypes.Structure):
    _fields_ = [("raw_bytes", ctypes.c_uint64), ("stored_bytes", ctypes.c_uint64), ("chunks", ctypes.c_uint64),
                ("uncached_bytes", ctypes.c_uint64), ("storages", ctypes.c_uint64), ("threads", ctypes.c_uint32),
                ("verified", ctypes.c_uint32), ("seconds", ctypes.c_double)]


class _MappedStorage(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("bytes", ctypes.c_uint64), ("keeper", _MappedHandle)]


class _WriterOptions(ctypes.Structure):
    _fields_ = [("chunk_bytes", ctypes.c_uint64), ("zstd_level", ctypes.c_int32), ("threads", ctypes.c_uint32)]


class _TensorSpec(ctypes.Structure):
    _fields_ = [("key", ctypes.c_char_p), ("name", ctypes.c_char_p), ("dtype", ctypes.c_char_p),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("ndim", ctypes.c_size_t), ("extra", ctypes.c_char_p),
                ("location", ctypes.c_char_p)]


class _WriteStats(ctypes.Structure):
    _fields_ = [("storages", ctypes.c_uint64), ("chunks", ctypes.c_uint64), ("raw_bytes", ctypes.c_uint64),
                ("file_bytes", ctypes.c_uint64)]


# One range as zckpt_range's bytes (five 8-byte fields; addresses and indexes fit a signed 64-bit
# field, device -1 needs one): the ranges of a load are packed into one contiguous array.
_RANGE = struct.Struct("=5q")
assert _RANGE.size == ctypes.sizeof(_Range)

_P = ctypes.POINTER
_ERR = _P(ctypes.c_void_p)  # zckpt_error**
_c = ctypes
_SIGNATURES = {  # name: (restype, argtypes), zckpt.h's declarations
    "zckpt_abi_version": (_c.c_uint32, []),
    "zckpt_status_name": (_c.c_char_p, [_c.c_int]),
    "zckpt_error_status": (_c.c_int, [_c.c_void_p]),
    "zckpt_error_message": (_c.c_char_p, [_c.c_void_p]),
    "zckpt_error_place": (_c.c_char_p, [_c.c_void_p]),
    "zckpt_error_free": (None, [_c.c_void_p]),
    "zckpt_open": (_c.c_int, [_c.c_char_p, _P(_CheckpointHandle), _ERR]),
    "zckpt_close": (_c.c_int, [_CheckpointHandle, _ERR]),
    "zckpt_storage_count": (_c.c_int, [_CheckpointHandle, _P(_c.c_uint64), _ERR]),
    "zckpt_host_buffer_new": (_c.c_int, [_c.c_uint64, _P(_HostBufferHandle), _P(_c.c_void_p), _ERR]),
    "zckpt_host_buffer_free": (_c.c_int, [_HostBufferHandle, _ERR]),
    "zckpt_load_ranges": (_c.c_int, [_CheckpointHandle, _c.c_void_p, _c.c_size_t, _P(_DeviceStream), _c.c_size_t,
                                     _P(_LoadOptions), _P(_LoadStats), _ERR]),
    "zckpt_map_storages": (_c.c_int, [_CheckpointHandle, _c.c_uint32, _c.c_uint32, _P(_MappedStorage), _c.c_size_t,
                                      _ERR]),
    "zckpt_mapped_release": (_c.c_int, [_MappedHandle, _ERR]),
    "zckpt_writer_open": (_c.c_int, [_c.c_char_p, _P(_WriterOptions), _P(_WriterHandle), _ERR]),
    "zckpt_writer_add_tensor": (_c.c_int, [_WriterHandle, _P(_TensorSpec), _c.c_void_p, _c.c_uint64, _ERR]),
    "zckpt_writer_begin_tensor": (_c.c_int, [_WriterHandle, _P(_TensorSpec), _c.c_uint64, _ERR]),
    "zckpt_writer_append": (_c.c_int, [_WriterHandle, _c.c_void_p, _c.c_uint64, _ERR]),
    "zckpt_writer_end_tensor": (_c.c_int, [_WriterHandle, _ERR]),
    "zckpt_writer_add_blob": (_c.c_int, [_WriterHandle, _c.c_char_p, _c.c_void_p, _c.c_uint64, _ERR]),
    "zckpt_writer_set_metadata": (_c.c_int, [_WriterHandle, _c.c_char_p, _c.c_char_p, _ERR]),
    "zckpt_writer_commit": (_c.c_int, [_WriterHandle, _P(_WriteStats), _ERR]),
    "zckpt_writer_close": (_c.c_int, [_WriterHandle, _ERR]),
    "zckpt_call": (_c.c_void_p, [_c.c_char_p, _c.c_size_t]),
    "zckpt_result_json": (_c.c_void_p, [_c.c_void_p, _P(_c.c_size_t)]),
    "zckpt_result_bytes": (_c.c_void_p, [_c.c_void_p, _c.c_size_t, _P(_c.c_size_t)]),
    "zckpt_result_free": (None, [_c.c_void_p]),
}
for _name, (_restype, _argtypes) in _SIGNATURES.items():
    _fn = getattr(_LIB, _name)
    _fn.restype, _fn.argtypes = _restype, _argtypes

if _LIB.zckpt_abi_version() != ABI_VERSION:
    raise ImportError(f"zckpt: {_LIB._name} has C interface version {_LIB.zckpt_abi_version()}, this package "
                      f"version {ABI_VERSION}: the library and the .py files come from different builds")


def _typed(fn, *args):
    """Runs typed call `fn` (its last argument the zckpt_error**); raises the error it reports as
    zckpt's class of its kind."""
    err = ctypes.c_void_p()
    status = fn(*args, ctypes.byref(err))
    if status == 0:
        return
    kind = _LIB.zckpt_status_name(status).decode()
    if not err.value:
        raise _error({"kind": kind, "message": f"zckpt: {fn.__name__} failed ({kind})"})
    try:
        message = _LIB.zckpt_error_message(err).decode("utf-8", "replace")
        place = json.loads(_LIB.zckpt_error_place(err).decode("utf-8", "replace"))
    finally:
        _LIB.zckpt_error_free(err)
    raise _error({**place, "kind": kind, "message": message})


def _bytes_arg(data):
    """A bytes object as an argument, by address (no copy); the caller keeps it alive."""
    if not isinstance(data, bytes):
        raise TypeError(f"zckpt: bytes expected, not {type(data).__name__}")
    return {"$address": ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value or 0, "$bytes": len(data)}


def _call(call, /, **args):
    """Runs core call `call`; its value, or the error it raised as zckpt's class."""
    request = json.dumps({"call": call, "args": args}).encode()
    result = _LIB.zckpt_call(request, len(request))
    if not result:
        raise MemoryError("zckpt: no memory for a call's result")
    try:
        n = ctypes.c_size_t()
        text = ctypes.string_at(_LIB.zckpt_result_json(result, ctypes.byref(n)), n.value)

        def hook(d):
            if len(d) == 1 and "$bytes" in d:
                m = ctypes.c_size_t()
                address = _LIB.zckpt_result_bytes(result, d["$bytes"], ctypes.byref(m))
                return ctypes.string_at(address, m.value) if m.value else b""
            return d

        reply = json.loads(text, object_hook=hook)
    finally:
        _LIB.zckpt_result_free(result)
    if "error" in reply:
        raise _error(reply["error"])
    return reply["value"]


def _error(e):
    kind, message = e.pop("kind"), e.pop("message")
    if kind == "memory":
        return MemoryError(message)
    if kind == "internal":
        return RuntimeError(message)
    return for_kind(kind, message, e)


class _Held:
    """An object the core keeps for us (a handle), let go with `release` when this is collected."""

    __slots__ = ("handle", "__weakref__")

    def __init__(self, handle, release):
        self.handle = handle
        # Not at exit: tensors over a buffer or a mapping may outlive this in interpreter
        # teardown, and the process's end frees everything anyway.
        weakref.finalize(self, _release, release, handle).atexit = False


def _release(release, handle):
    try:
        _typed(release, handle)
    except Exception:  # at interpreter exit the library may be gone; nothing is lost
        pass


def _view(address, n, owner):
    """A writable buffer of n bytes at `address` (torch.frombuffer wraps it without a copy, the
    tensor keeping it alive) that keeps `owner` alive."""
    buf = (ctypes.c_uint8 * n).from_address(address)
    buf.address = address
    buf._owner = owner
    return buf


def HostBuffer(bytes):  # noqa: N802 (a constructor, as it was)
    """Host memory a load fills (4 KiB-aligned, so bytes not in the page cache go straight from
    the disk into it), freed with the last reference to it: len(), .address, the buffer protocol.
    Zero-filled is not promised: a load overwrites it."""
    handle, address = _HostBufferHandle(), ctypes.c_void_p()
    _typed(_LIB.zckpt_host_buffer_new, int(bytes), ctypes.byref(handle), ctypes.byref(address))
    return _view(address.value or 0, int(bytes), _Held(handle, _LIB.zckpt_host_buffer_free))


def cuda_runtime():
    """(path, version) of the CUDA runtime CUDA loads use (loaded now if it is not yet): torch's
    libcudart when torch loaded one; version as cudaRuntimeGetVersion gives it (12080: 12.8)."""
    return tuple(_call("cuda_runtime"))


def _ints(pairs):
    return [[int(k), int(v)] for k, v in pairs.items()]


class Checkpoint:
    """One open checkpoint: everything a load reads comes through this one open file, so a file
    renamed over the path meanwhile cannot mix two checkpoints."""

    def __init__(self, path):
        handle = _CheckpointHandle()
        _typed(_LIB.zckpt_open, path.encode(), ctypes.byref(handle))
        self._held = _Held(handle, _LIB.zckpt_close)
        self.path = path

    def _call(self, call, /, **args):
        return _call(call, checkpoint={"$handle": self._held.handle.id}, **args)

    def describe(self):
        return self._call("describe")

    def tensor_records(self):
        return self._call("tensor_records")

    def vetted_pickle(self, allow_globals=()):
        return self._call("vetted_pickle", allow_globals=list(allow_globals))

    def load_ranges(self, targets, streams, verify=True, threads=None, slots=None, slot_bytes=None):
        """Byte ranges of storages into memory by address: (storage, begin, end, address, device)
        per range, device -1 for host memory, else a CUDA device whose copies wait for
        streams[device] (a cudaStream_t address: torch's current stream there). The ranges go to
        the core as one packed array of zckpt_range. LoadStats' figures, as a dict."""
        packed = b"".join(itertools.starmap(_RANGE.pack, targets))
        n = len(packed) // _RANGE.size
        stream_array = (_DeviceStream * len(streams))(*((int(d), int(s) or None) for d, s in streams.items()))
        options = _LoadOptions(verify=bool(verify), threads=threads or 0, slots=slots or 0, slot_bytes=slot_bytes or 0)
        stats = _LoadStats()
        _typed(_LIB.zckpt_load_ranges, self._held.handle, packed, n, stream_array, len(streams),
               ctypes.byref(options), ctypes.byref(stats))
        return {name: (bool(v) if name == "verified" else v)
                for name, v in ((f, getattr(stats, f)) for f, _ in _LoadStats._fields_)}

    def verify_chunks(self, threads=None):
        """Every chunk of the file checked: its problems in file order (empty when good), each a
        dict of "kind" ("corrupt"), "message" and its place (file, storage, tensors, chunk,
        file_bytes and storage_bytes as (begin, end)), as zckpt.verify's."""
        return [problem(p) for p in self._call("verify_chunks", threads=threads)]

    def map_storages(self, keys, verify=False, threads=None):
        """key -> the storage's bytes in the file's mapping (zstd ones decoded into memory of
        their own), each alive while a view of it is; with verify every chunk is hashed where it
        lies first. `keys`: every storage's key in the file's order (describe()'s storages, which
        the caller has read already)."""
        made = (_MappedStorage * len(keys))()
        _typed(_LIB.zckpt_map_storages, self._held.handle, bool(verify), threads or 0, made, len(keys))
        return {key: _view(m.data or 0, m.bytes, _Held(m.keeper, _LIB.zckpt_mapped_release))
                for key, m in zip(keys, made)}


def open(path):  # noqa: A001 (the module's name for it)
    return Checkpoint(path)


def describe(path):
    return _call("describe", path=path)


def tensor_records(path):
    return _call("tensor_records", path=path)


def vetted_pickle(path, allow_globals=()):
    return _call("vetted_pickle", path=path, allow_globals=list(allow_globals))


def read_blob(path, name):
    return _call("read_blob", path=path, name=name)


def convert(src, dst="", chunk_bytes=0, zstd_level=0, threads=0, allow_globals=()):
    return _call("convert", src=src, dst=dst, chunk_bytes=int(chunk_bytes), zstd_level=int(zstd_level),
                 threads=int(threads), allow_globals=list(allow_globals))


def export(src, dst, format="pt", allow_globals=()):  # noqa: A002
    _call("export", src=src, dst=dst, format=format, allow_globals=list(allow_globals))


def verify(path, threads=None):
    """The problems zckpt verify finds under `path`, in order, as verify_chunks gives them (kind
    "corrupt" or "unsafe"); a file that cannot be checked raises its error."""
    return [problem(p) for p in _call("verify", path=path, threads=threads)]


def is_object_url(path):
    return _call("is_object_url", path=path)


def object_exists(url):
    return _call("object_exists", url=url)


def is_object_folder(url):
    return _call("is_object_folder", url=url)


def list_objects(folder_url):
    return [tuple(e) for e in _call("list_objects", folder_url=folder_url)]


def read_object(url, max_bytes=1 << 30):
    return _call("read_object", url=url, max_bytes=int(max_bytes))


def write_object(url, data):
    _call("write_object", url=url, data=_bytes_arg(data))


def read_regular_file(path):
    return _call("read_regular_file", path=path)


def write_file_atomically(path, data):
    _call("write_file_atomically", path=path, data=_bytes_arg(data))


def copy_file_atomically(src, dst):
    _call("copy_file_atomically", src=src, dst=dst)


def save_pickled(path, pickle, storages, records_before, records_after, record_bytes, prefix, metadata,
                 chunk_bytes=0, zstd_level=0, threads=0, streams=None, allow_globals=()):
    """zckpt.save: the pickle torch's pickler made, each storage key -> (address, bytes, device:
    -1 for host memory, else a CUDA device index) (the caller keeps them alive for the call), the
    archive's other records as torch's zip writer made them (zckpt/_save.py), the globals
    ('module.name') the pickle may name besides the allowlist. SaveStats' figures."""
    return _call("save_pickled", path=path, pickle=_bytes_arg(pickle),
                 storages=[[key, int(a), int(n), int(d)] for key, (a, n, d) in storages.items()],
                 records_before=list(records_before), records_after=list(records_after),
                 record_bytes={name: _bytes_arg(b) for name, b in record_bytes.items()}, prefix=prefix,
                 metadata=dict(metadata), chunk_bytes=int(chunk_bytes), zstd_level=int(zstd_level),
                 threads=int(threads), streams=_ints(streams or {}), allow_globals=list(allow_globals))


def vet_pickle(pickle, allow_globals=()):
    """Nothing, or UnsafeError naming a global the pickle names that is neither on the allowlist
    nor in allow_globals ('module.name'): zckpt.save's check, before anything is copied."""
    _call("vet_pickle", pickle=_bytes_arg(pickle), allow_globals=list(allow_globals))


def copy_host_bytes(copies, threads=0):
    """(dst address, src address, bytes) triples copied with memcpy over `threads` threads."""
    _call("copy_host_bytes", copies=[[int(x) for x in c] for c in copies], threads=int(threads))


class ContainerWriter:
    """A container written from host bytes: a tensor is one storage `key` holding its elements in
    row-major order and a record `name` viewing all of it; nothing is at `path` until commit()."""

    def __init__(self, path, chunk_bytes=0, zstd_level=0, threads=0):
        handle = _WriterHandle()
        options = _WriterOptions(chunk_bytes=int(chunk_bytes), zstd_level=int(zstd_level), threads=int(threads))
        _typed(_LIB.zckpt_writer_open, path.encode(), ctypes.byref(options), ctypes.byref(handle))
        self._held = _Held(handle, _LIB.zckpt_writer_close)

    @staticmethod
    def _spec(key, name, dtype, shape, extra, location):
        dims = (ctypes.c_int64 * len(shape))(*(int(d) for d in shape))
        return _TensorSpec(key=key.encode(), name=name.encode(), dtype=dtype.encode(), shape=dims, ndim=len(shape),
                           extra=extra.encode(), location=location.encode())

    def add_tensor(self, key, name, dtype, shape, address, bytes, extra="", location="cpu"):  # noqa: A002
        spec = self._spec(key, name, dtype, shape, extra, location)
        _typed(_LIB.zckpt_writer_add_tensor, self._held.handle, ctypes.byref(spec), int(address), int(bytes))

    def begin_tensor(self, key, name, dtype, shape, bytes, extra="", location="cpu"):  # noqa: A002
        spec = self._spec(key, name, dtype, shape, extra, location)
        _typed(_LIB.zckpt_writer_begin_tensor, self._held.handle, ctypes.byref(spec), int(bytes))

    def append_bytes(self, address, bytes):  # noqa: A002
        _typed(_LIB.zckpt_writer_append, self._held.handle, int(address), int(bytes))

    def end_tensor(self):
        _typed(_LIB.zckpt_writer_end_tensor, self._held.handle)

    def add_blob(self, name, data):
        if not isinstance(data, bytes):
            raise TypeError(f"zckpt: bytes expected, not {type(data).__name__}")
        _typed(_LIB.zckpt_writer_add_blob, self._held.handle, name.encode(), data, len(data))

    def set_metadata(self, key, value):
        _typed(_LIB.zckpt_writer_set_metadata, self._held.handle, key.encode(), value.encode())

    def commit(self):
        stats = _WriteStats()
        _typed(_LIB.zckpt_writer_commit, self._held.handle, ctypes.byref(stats))
        return {f: getattr(stats, f) for f, _ in _WriteStats._fields_}


def check_dcp_metadata(data, what):
    return tuple(_call("check_dcp_metadata", data=_bytes_arg(data), what=what))


def read_dcp_blobs(path, names, allow_globals=()):
    return _call("read_dcp_blobs", path=path, names=list(names), allow_globals=list(allow_globals))


def check_object_pickle(checkpoint, allow_globals=()):
    checkpoint._call("check_object_pickle", allow_globals=list(allow_globals))


def fsdp1_layout(dir, files):  # noqa: A002
    return _call("fsdp1_layout", dir=dir, files=files)


def merge(dir, out, files="model", keys=""):  # noqa: A002
    return _call("merge", dir=dir, out=out, files=files, keys=keys)


_FORMAT_CONSTANTS = None


def format_constants():
    """The format's constants from their C++ homes, asked of the core once: "container_magic"
    (bytes), "tensor_flags" (name -> bit), "dcp" (DCP's file and blob names), "stale_temp_seconds"."""
    global _FORMAT_CONSTANTS
    if _FORMAT_CONSTANTS is None:
        made = _call("format_constants")
        made["container_magic"] = bytes(made["container_magic"])
        _FORMAT_CONSTANTS = made
    return _FORMAT_CONSTANTS


def check_into(checkpoint, targets, strict):
    """load_into's checks (src/loader/into_check.h, zckpt::LoadInto's too) of `targets`, each
    [name, strided, device, has_storage, dtype name, shape], against the open `checkpoint`:
    {"matched": [[target index, tensor index], ...], "missing": [...], "unexpected": [...]}, or
    InvalidArgumentError listing every problem."""
    return checkpoint._call("check_into", targets=targets, strict=bool(strict))
