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
"""
from ._abi import check_torch as _check_torch

_check_torch()  # before _C loads: a torch of another major.minor or flavour is refused by name

from ._api import (  # noqa: F401
    CorruptError,
    OutOfMemoryError,
    UnsafeError,
    ZckptError,
    convert,
    export,
    load,
    load_into,
    verify,
)
from ._iter import container_files, iter_tensors  # noqa: F401
from ._patch import patch_stats, patch_torch_load, reset_patch_stats, torch_load_from_zckpt, unpatch_torch_load  # noqa: F401
from ._save import AsyncSaver, async_save, save  # noqa: F401

__all__ = ["load", "load_into", "save", "async_save", "AsyncSaver", "convert", "export", "verify", "ZckptError",
           "CorruptError", "UnsafeError", "patch_torch_load", "unpatch_torch_load", "torch_load_from_zckpt",
           "patch_stats", "reset_patch_stats",
           "OutOfMemoryError", "iter_tensors", "container_files"]
