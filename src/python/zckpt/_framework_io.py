"""What the training-framework integrations (lightning.py, transformers.py, accelerate.py,
deepspeed.py) share: reading a checkpoint file that is either a container or a torch.save file,
and routing torch.save / torch.load, and torch.distributed.checkpoint's file-system storage,
through zckpt while a framework's own checkpoint code runs."""
import contextlib
import functools
import importlib
import os
import threading

import torch

from . import _core
from ._patch import _weights_only

# The first 8 bytes of every container (format-spec/zckpt-v1.md, the superblock's magic, as the
# core has it): a file that does not start with them was written by torch.save (or is not a
# checkpoint at all).
CONTAINER_MAGIC = _core.format_constants()["container_magic"]


def is_container(path):
    """Whether the file at `path` starts with a container's magic (False for a missing file)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(CONTAINER_MAGIC)) == CONTAINER_MAGIC
    except (FileNotFoundError, IsADirectoryError):
        return False


def load_file(path, map_location=None, weights_only=None, mmap=None, load=None):
    """torch.load's result for `path`: zckpt.load of a container (weights_only resolved as
    torch.load resolves None), `load` (torch.load by default) of anything else, so that checkpoints
    written by the framework's default I/O before zckpt was plugged in still resume."""
    if is_container(path):
        from ._api import load as zckpt_load

        return zckpt_load(path, map_location=map_location, weights_only=_weights_only(weights_only), mmap=bool(mmap))
    return (load or torch.load)(path, map_location=map_location, weights_only=weights_only, mmap=mmap)


@contextlib.contextmanager
def holding(local, value):
    """`local.value` (a threading.local's) is `value` for the duration of the block, in this
    thread; blocks nest, the previous value back when one ends."""
    previous = getattr(local, "value", None)
    local.value = value
    try:
        yield
    finally:
        local.value = previous


# .value: the FolderWrites that torch.save inside torch_io_through_zckpt hands a path's container
# to in this thread (saves_in_background), or None.
_BACKGROUND = threading.local()


def saves_in_background(writes):
    """For the duration of the block, in this thread, torch.save inside torch_io_through_zckpt
    hands a path's container to `writes` (a FolderWrites: snapshot now, written in the background)
    instead of writing it before it returns."""
    return holding(_BACKGROUND, writes)


def _save(obj, f, pickle_module=None, pickle_protocol=None, **kwargs):
    """torch.save inside torch_io_through_zckpt: a path becomes a container (zckpt.save: atomic,
    checksummed; under saves_in_background, written in the background). A file object,
    torch-only arguments, and an object whose pickle names a global off zckpt's allowlist (the
    Trainer's TrainingArguments in training_args.bin: zckpt.save refuses it, and zckpt.load would
    too) go to torch.save unchanged."""
    if isinstance(f, (str, os.PathLike)) and not kwargs:
        from ._errors import UnsafeError
        from ._save import DEFAULT_PROTOCOL, save

        options = {"pickle_protocol": pickle_protocol or DEFAULT_PROTOCOL}
        if pickle_module is not None:
            options["pickle_module"] = pickle_module
        writes = getattr(_BACKGROUND, "value", None)
        try:
            if writes is None:
                save(obj, f, **options)
            else:
                writes.save(obj, f, **options)
            return
        except UnsafeError:
            pass  # a refused save leaves nothing at f (zckpt.save is atomic; AsyncSaver refuses first)
    if pickle_module is not None:
        kwargs["pickle_module"] = pickle_module
    if pickle_protocol is not None:
        kwargs["pickle_protocol"] = pickle_protocol
    _TORCH_IO.original["save"](obj, f, **kwargs)


def _load(f, map_location=None, pickle_module=None, *, weights_only=None, mmap=None, **kwargs):
    """torch.load inside torch_io_through_zckpt: a container at a path is read by zckpt.load;
    anything else by torch.load unchanged."""
    if pickle_module is None and not kwargs and isinstance(f, (str, os.PathLike)):
        return load_file(os.fspath(f), map_location, weights_only, mmap, load=_TORCH_IO.original["load"])
    if pickle_module is not None:
        kwargs["pickle_module"] = pickle_module
    return _TORCH_IO.original["load"](f, map_location=map_location, weights_only=weights_only, mmap=mmap, **kwargs)


class _Swap:
    """Attributes of one module replaced for the duration of a block: they hold for every caller
    that looks them up when it calls (the frameworks do), in every thread of the process. Blocks
    nest, in any thread: the outermost one sets what `make` builds from the attributes as they
    were (kept in `original`) and puts those back when it ends, however it ends."""

    def __init__(self, module, names, make):
        self._module = module  # a module's name, imported when a block starts
        self.names = names
        self._make = make
        self._lock = threading.Lock()
        self._depth = 0
        self.original = {}

    @contextlib.contextmanager
    def block(self):
        module = importlib.import_module(self._module)
        with self._lock:
            if self._depth == 0:
                self.original = {name: getattr(module, name) for name in self.names}
                for name, value in self._make(self.original).items():
                    setattr(module, name, value)
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    for name, value in self.original.items():
                        setattr(module, name, value)


_TORCH_IO = _Swap("torch", ("save", "load"), lambda original: {"save": _save, "load": _load})


def torch_io_through_zckpt():
    """For the duration of the block, torch.save to a path writes a container and torch.load of a
    container reads it through zckpt.load (a torch.save file is read by torch.load as before).

    This swaps the torch module's attributes (_Swap: every caller, every thread; blocks nest)."""
    return _TORCH_IO.block()


def _local_path(args, kwargs, options):
    """The path of a DCP FileSystemWriter(path) / FileSystemReader(path) call given nothing but
    the path and keywords among `options`, when it is a local one; else None: other options
    (single files, extensions, fsspec's URLs) keep DCP's own storage."""
    if "path" in kwargs:
        args, kwargs = (kwargs["path"], *args), {k: v for k, v in kwargs.items() if k != "path"}
    if len(args) != 1 or not set(kwargs) <= set(options) or "://" in str(args[0]):
        return None
    return os.fspath(args[0])


def _zckpt_writer(*args, **kwargs):
    """What FileSystemWriter(...) gives inside dcp_io_through_zckpt: ZckptStorageWriter for a local
    folder given alone (or with overwrite=), else None (DCP's own writer)."""
    path = _local_path(args, kwargs, ("overwrite",))
    if path is None:
        return None
    from .dcp import ZckptStorageWriter

    return ZckptStorageWriter(path, overwrite=kwargs.get("overwrite", True))


def _zckpt_reader(*args, **kwargs):
    """What FileSystemReader(...) gives inside dcp_io_through_zckpt: ZckptStorageReader for a local
    folder holding zckpt containers, else None (DCP's own reader: a `.distcp` folder written
    before zckpt was plugged in loads as before)."""
    from .dcp import ZckptStorageReader, is_zckpt_folder

    path = _local_path(args, kwargs, ())
    return ZckptStorageReader(path) if path is not None and is_zckpt_folder(path) else None


def _routing(cls, storage_for):
    """A subclass of DCP's storage class `cls` whose construction returns storage_for(the same
    arguments) where that is not None, and otherwise an instance of `cls` as before (so a caller's
    isinstance(x, FileSystemWriter) still holds for DCP's own)."""

    class Routed(cls):
        def __new__(sub, *args, **kwargs):
            storage = storage_for(*args, **kwargs)
            return storage if storage is not None else super().__new__(sub)

    Routed.__name__, Routed.__qualname__, Routed.__module__ = cls.__name__, cls.__qualname__, cls.__module__
    return Routed


def _dcp_routing(original):
    """What dcp_io_through_zckpt sets on torch.distributed.checkpoint, made from its `original`
    FileSystemWriter, FileSystemReader and load."""
    from .dcp import zckpt_errors_unwrapped

    load = original["load"]

    @functools.wraps(load)
    def load_unwrapped(*args, **kwargs):
        with zckpt_errors_unwrapped():
            return load(*args, **kwargs)

    return {"FileSystemWriter": _routing(original["FileSystemWriter"], _zckpt_writer),
            "FileSystemReader": _routing(original["FileSystemReader"], _zckpt_reader),
            "load": load_unwrapped}


_DCP_IO = _Swap("torch.distributed.checkpoint", ("FileSystemWriter", "FileSystemReader", "load"), _dcp_routing)


def dcp_io_through_zckpt():
    """For the duration of the block, torch.distributed.checkpoint's FileSystemWriter(path) of a
    local folder is a zckpt.dcp.ZckptStorageWriter (one container per rank and DCP's `.metadata`,
    no `.distcp`), its FileSystemReader(path) of a folder holding zckpt containers a
    ZckptStorageReader (every chunk checked), and its load raises a zckpt error on any rank (a
    CorruptError naming the file and chunk) as itself instead of inside DCP's CheckpointException.

    This swaps the attributes of the torch.distributed.checkpoint module (_Swap: every caller
    that calls `dist_cp.FileSystemWriter(...)`, as accelerate's FSDP checkpoint functions do; every
    thread; blocks nest). A torch built without torch.distributed has no DCP: nothing to route."""
    if not torch.distributed.is_available():
        return contextlib.nullcontext()
    return _DCP_IO.block()


@contextlib.contextmanager
def checkpoint_io_through_zckpt():
    """torch_io_through_zckpt and dcp_io_through_zckpt in one block: what the FSDP checkpoint code
    of accelerate and the Trainer writes with torch.save (FULL_STATE_DICT) and with DCP
    (SHARDED_STATE_DICT) goes through zckpt."""
    with torch_io_through_zckpt(), dcp_io_through_zckpt():
        yield


def wrap_methods(obj, names, through=torch_io_through_zckpt):
    """Runs each of obj's methods `names` inside the block `through()` (torch_io_through_zckpt by
    default), as attributes of the instance (its class, and other instances, stay as they are); a
    method wrapped already is left."""
    for name in names:
        method = getattr(obj, name)
        if getattr(method, "_zckpt_wrapped", False):
            continue

        @functools.wraps(method)
        def through_zckpt(*args, _method=method, **kwargs):
            with through():
                return _method(*args, **kwargs)

        through_zckpt._zckpt_wrapped = True
        setattr(obj, name, through_zckpt)
