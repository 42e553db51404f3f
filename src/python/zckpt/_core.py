"""zckpt's torch-free core: libzckpt_core.so beside this file, reached through its C ABI with
ctypes (src/python/core_abi.cc), so the package holds no extension module and one build runs
under every Python 3 and every torch 2.x, or none. Everything of the `zckpt` package that needs
no torch (convert, export, verify, describe, the object store) runs there, and so does every
load: the Python layer allocates each storage or tensor (HostBuffer, or torch's own memory on the
CPU or a CUDA device) and load_ranges fills byte ranges of storages through their addresses; a
mapped load (mmap=True) hands out views of the file's mapping; zckpt.save writes through
save_pickled. ctypes lets go of the GIL for every call.

Each call is one JSON request naming the call and every argument; bytes go in by address and
come back as byte strings, objects the core keeps (an open checkpoint, a writer, a buffer, a
mapping) by handle, let go when their Python object is."""
import ctypes
import json
import os
import weakref

_LIB = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "libzckpt_core.so"))
_LIB.zckpt_call.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
_LIB.zckpt_call.restype = ctypes.c_void_p
_LIB.zckpt_result_json.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
_LIB.zckpt_result_json.restype = ctypes.c_void_p
_LIB.zckpt_result_bytes.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]
_LIB.zckpt_result_bytes.restype = ctypes.c_void_p
_LIB.zckpt_result_free.argtypes = [ctypes.c_void_p]
_LIB.zckpt_result_free.restype = None

from ._errors import (  # noqa: F401 (zckpt._core.ZckptError and the rest, as _oom.py and callers take them)
    CancelledError, CorruptError, InvalidArgumentError, IoError, NotAContainerError, OutOfMemoryError, UnsafeError,
    UnsupportedError, ZckptError, for_kind, problem, set_out_of_memory_error)


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
    """An object the core keeps for us, let go when this is collected."""

    __slots__ = ("handle", "__weakref__")

    def __init__(self, handle):
        self.handle = handle
        # Not at exit: tensors over a buffer or a mapping may outlive this in interpreter
        # teardown, and the process's end frees everything anyway.
        weakref.finalize(self, _release, handle).atexit = False


def _release(handle):
    try:
        _call("release", handle=handle)
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
    made = _call("host_buffer", bytes=int(bytes))
    return _view(made["address"], int(bytes), _Held(made["buffer"]))


def cuda_runtime():
    """(path, version) of the CUDA runtime CUDA loads use (loaded now if it is not yet): torch's
    libcudart when torch loaded one; version as cudaRuntimeGetVersion gives it (12080: 12.8)."""
    return tuple(_call("cuda_runtime"))


def _ints(pairs):
    return [[int(k), int(v)] for k, v in pairs.items()]


class Checkpoint:
    """One open checkpoint: everything a load reads comes through this one open file, so a file
    renamed over the path meanwhile cannot mix two checkpoints."""

    def __init__(self, made):
        self._held = _Held(made["checkpoint"])
        self.path = made["path"]

    def _call(self, call, /, **args):
        return _call(call, checkpoint=self._held.handle, **args)

    def describe(self):
        return self._call("describe")

    def tensor_records(self):
        return self._call("tensor_records")

    def vetted_pickle(self, allow_globals=()):
        return self._call("vetted_pickle", allow_globals=list(allow_globals))

    def load_ranges(self, targets, streams, verify=True, threads=None, slots=None, slot_bytes=None):
        """Byte ranges of storages into memory by address: (storage, begin, end, address, device)
        per range, device -1 for host memory, else a CUDA device whose copies wait for
        streams[device] (a cudaStream_t address: torch's current stream there). LoadStats' figures."""
        return self._call("load_ranges", targets=[[int(x) for x in t] for t in targets], streams=_ints(streams),
                          verify=bool(verify), threads=threads, slots=slots, slot_bytes=slot_bytes)

    def verify_chunks(self, threads=None):
        """Every chunk of the file checked: its problems in file order (empty when good), each a
        dict of "kind" ("corrupt"), "message" and its place (file, storage, tensors, chunk,
        file_bytes and storage_bytes as (begin, end)), as zckpt.verify's."""
        return [problem(p) for p in self._call("verify_chunks", threads=threads)]

    def map_storages(self, verify=False, threads=None):
        """key -> the storage's bytes in the file's mapping (zstd ones decoded into memory of
        their own), each alive while a view of it is; with verify every chunk is hashed where it
        lies first."""
        made = self._call("map_storages", verify=bool(verify), threads=threads)
        return {key: _view(address, n, _Held(keeper)) for key, address, n, keeper in made}


def open(path):  # noqa: A001 (the module's name for it)
    return Checkpoint(_call("open", path=path))


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
                 chunk_bytes=0, zstd_level=0, threads=0, streams=None):
    """zckpt.save: the pickle torch's pickler made, each storage key -> (address, bytes, device:
    -1 for host memory, else a CUDA device index) (the caller keeps them alive for the call), the
    archive's other records as torch's zip writer made them (zckpt/_save.py). SaveStats' figures."""
    return _call("save_pickled", path=path, pickle=_bytes_arg(pickle),
                 storages=[[key, int(a), int(n), int(d)] for key, (a, n, d) in storages.items()],
                 records_before=list(records_before), records_after=list(records_after),
                 record_bytes={name: _bytes_arg(b) for name, b in record_bytes.items()}, prefix=prefix,
                 metadata=dict(metadata), chunk_bytes=int(chunk_bytes), zstd_level=int(zstd_level),
                 threads=int(threads), streams=_ints(streams or {}))


def copy_host_bytes(copies, threads=0):
    """(dst address, src address, bytes) triples copied with memcpy over `threads` threads."""
    _call("copy_host_bytes", copies=[[int(x) for x in c] for c in copies], threads=int(threads))


class ContainerWriter:
    """A container written from host bytes: a tensor is one storage `key` holding its elements in
    row-major order and a record `name` viewing all of it; nothing is at `path` until commit()."""

    def __init__(self, path, chunk_bytes=0, zstd_level=0, threads=0):
        self._held = _Held(_call("writer_open", path=path, chunk_bytes=int(chunk_bytes),
                                 zstd_level=int(zstd_level), threads=int(threads)))

    def _call(self, call, /, **args):
        return _call(call, writer=self._held.handle, **args)

    def add_tensor(self, key, name, dtype, shape, address, bytes, extra="", location="cpu"):  # noqa: A002
        self._call("writer_add_tensor", key=key, name=name, dtype=dtype, shape=[int(d) for d in shape],
                   address=int(address), bytes=int(bytes), extra=extra, location=location)

    def begin_tensor(self, key, name, dtype, shape, bytes, extra="", location="cpu"):  # noqa: A002
        self._call("writer_begin_tensor", key=key, name=name, dtype=dtype, shape=[int(d) for d in shape],
                   bytes=int(bytes), extra=extra, location=location)

    def append_bytes(self, address, bytes):  # noqa: A002
        self._call("writer_append_bytes", address=int(address), bytes=int(bytes))

    def end_tensor(self):
        self._call("writer_end_tensor")

    def add_blob(self, name, data):
        self._call("writer_add_blob", name=name, data=_bytes_arg(data))

    def set_metadata(self, key, value):
        self._call("writer_set_metadata", key=key, value=value)

    def commit(self):
        return self._call("writer_commit")


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
