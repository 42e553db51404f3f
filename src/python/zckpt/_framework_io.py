"""What the training-framework integrations (lightning.py, transformers.py, accelerate.py,
deepspeed.py) share: reading a checkpoint file that is either a container or a torch.save file,
and routing torch.save / torch.load through zckpt while a framework's own checkpoint code runs."""
import contextlib
import functools
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


_lock = threading.Lock()
_depth = 0  # nesting of torch_io_through_zckpt blocks (only the outermost one swaps)
_torch_save = None  # torch.save and torch.load as they were before the outermost block
_torch_load = None


def _save(obj, f, pickle_module=None, pickle_protocol=None, **kwargs):
    """torch.save inside torch_io_through_zckpt: a path becomes a container (zckpt.save: atomic,
    checksummed). A file object, torch-only arguments, and an object whose pickle names a global
    off zckpt's allowlist (the Trainer's TrainingArguments in training_args.bin: zckpt.save
    refuses it, and zckpt.load would too) go to torch.save unchanged."""
    if isinstance(f, (str, os.PathLike)) and not kwargs:
        from ._errors import UnsafeError
        from ._save import DEFAULT_PROTOCOL, save

        options = {"pickle_protocol": pickle_protocol or DEFAULT_PROTOCOL}
        if pickle_module is not None:
            options["pickle_module"] = pickle_module
        try:
            save(obj, f, **options)
            return
        except UnsafeError:
            pass  # a refused save leaves nothing at f (zckpt.save is atomic)
    if pickle_module is not None:
        kwargs["pickle_module"] = pickle_module
    if pickle_protocol is not None:
        kwargs["pickle_protocol"] = pickle_protocol
    _torch_save(obj, f, **kwargs)


def _load(f, map_location=None, pickle_module=None, *, weights_only=None, mmap=None, **kwargs):
    """torch.load inside torch_io_through_zckpt: a container at a path is read by zckpt.load;
    anything else by torch.load unchanged."""
    if pickle_module is None and not kwargs and isinstance(f, (str, os.PathLike)):
        return load_file(os.fspath(f), map_location, weights_only, mmap, load=_torch_load)
    if pickle_module is not None:
        kwargs["pickle_module"] = pickle_module
    return _torch_load(f, map_location=map_location, weights_only=weights_only, mmap=mmap, **kwargs)


@contextlib.contextmanager
def torch_io_through_zckpt():
    """For the duration of the block, torch.save to a path writes a container and torch.load of a
    container reads it through zckpt.load (a torch.save file is read by torch.load as before).

    This swaps the torch module's attributes, so it holds for every caller that looks up
    torch.save / torch.load when it calls (the frameworks do), in every thread of the process.
    Blocks nest; the outermost one restores torch's own functions."""
    global _depth, _torch_save, _torch_load
    with _lock:
        if _depth == 0:
            _torch_save, _torch_load = torch.save, torch.load
            torch.save, torch.load = _save, _load
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                torch.save, torch.load = _torch_save, _torch_load


def wrap_methods(obj, names):
    """Runs each of obj's methods `names` inside torch_io_through_zckpt, as attributes of the
    instance (its class, and other instances, stay as they are); a method wrapped already is left."""
    for name in names:
        method = getattr(obj, name)
        if getattr(method, "_zckpt_wrapped", False):
            continue

        @functools.wraps(method)
        def through_zckpt(*args, _method=method, **kwargs):
            with torch_io_through_zckpt():
                return _method(*args, **kwargs)

        through_zckpt._zckpt_wrapped = True
        setattr(obj, name, through_zckpt)
