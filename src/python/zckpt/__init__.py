"""zckpt: zero-copy checkpoints for PyTorch.

Resume code calls:

    zckpt.load(path, map_location=None, weights_only=True, mmap=False)   # like torch.load
    zckpt.load_into(path, module_or_state_dict_or_optimizer, strict=True)  # in place
    zckpt.convert(src_pt, dst_zckpt), zckpt.export(src_zckpt, dst_pt), zckpt.verify(path)
    for name, tensor in zckpt.iter_tensors(path_or_folder, device="cpu"):  # one at a time
    zckpt.patch_torch_load(folders=None)  # torch.load reads the .zckpt beside a .pt (undo: unpatch_torch_load)

Training code writes containers directly (no .pt on the way):

    zckpt.save(obj, path)                  # like torch.save; atomic
    future = zckpt.async_save(obj, path)   # returns once the snapshot is taken

`load` replays the checkpoint's original pickle through torch's own unpickler (so
`weights_only` keeps torch's meaning and torch rebuilds its own objects) while every storage
comes from zckpt's streaming loader, straight onto its destination device, checksums checked.

No pickle reaches an unpickler that executes it before zckpt's own interpreter has vetted it:
every global it names must be on zckpt's allowlist of data globals (torch's tensors, storages
and dtypes, collections, numpy arrays, DTensor/ShardedTensor metadata, ...) or be allowed by the
caller by name (`allow_globals=[...]` on load, load_into, convert and export; `--allow-global`
on the command line), and it must describe the same tensors as the container's index.

Importing zckpt imports no torch: convert, export, verify and the error classes run on the
torch-free core (`_core`); the rest imports torch (and checks its version) on first use.
"""
from ._errors import (  # noqa: F401
    CancelledError, CorruptError, IncompleteCheckpointError, InvalidArgumentError, IoError, NotAContainerError,
    UnsafeError, UnsupportedError, ZckptError)
from ._torch_free_api import convert, export, verify  # noqa: F401

# Names that need torch -> the module that defines them, imported on first access (PEP 562).
_NEEDS_TORCH = {
    "load": "_api", "load_into": "_api", "OutOfMemoryError": "_api",
    "container_files": "_iter", "iter_tensors": "_iter",
    "patch_stats": "_patch", "patch_torch_load": "_patch", "reset_patch_stats": "_patch",
    "torch_load_from_zckpt": "_patch", "unpatch_torch_load": "_patch",
    "AsyncSaver": "_save", "async_save": "_save", "save": "_save",
}


# The oldest torch the names above run under: the oldest tools/ci/torch-matrix.sh tests (2.4.1).
_OLDEST_TORCH = (2, 4)


def _torch_release(version):
    """(major, minor) of a torch.__version__ such as '2.4.1+cu121'; (0, 0) when unreadable."""
    try:
        major, minor = version.split("+")[0].split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return (0, 0)


def __getattr__(name):
    module = _NEEDS_TORCH.get(name)
    if module is None:
        raise AttributeError(f"module 'zckpt' has no attribute {name!r}")
    try:
        import torch
    except ImportError as e:
        raise ImportError(f"zckpt.{name} needs torch, which cannot be imported here ({e}); install torch 2.x "
                          "(convert, export and verify work without it)") from e
    running = getattr(torch, "__version__", "unknown")
    if _torch_release(running) < _OLDEST_TORCH:
        oldest = ".".join(map(str, _OLDEST_TORCH))
        raise ImportError(f"zckpt.{name} needs torch {oldest} or newer; torch {running} is installed "
                          f"({getattr(torch, '__file__', '?')}): upgrade torch (convert, export and verify work "
                          "under any torch or none)")
    from importlib import import_module

    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_NEEDS_TORCH))


__all__ = ["load", "load_into", "save", "async_save", "AsyncSaver", "convert", "export", "verify", "ZckptError",
           "CorruptError", "UnsafeError", "IoError", "NotAContainerError", "UnsupportedError", "InvalidArgumentError",
           "CancelledError", "IncompleteCheckpointError", "patch_torch_load", "unpatch_torch_load",
           "torch_load_from_zckpt",
           "patch_stats", "reset_patch_stats",
           "OutOfMemoryError", "iter_tensors", "container_files"]
