"""patch_torch_load: trainers that cannot be edited read converted checkpoints anyway.

After `zckpt.patch_torch_load()`, `torch.load("…/model_world_size_8_rank_0.pt", …)` reads
`…/model_world_size_8_rank_0.zckpt` when that container exists (next to the .pt, or in a
folder mapped with `folders={pt_folder: zckpt_folder}`), through zckpt.load with the same
map_location / weights_only / mmap, and is torch.load itself otherwise. Undone by
`unpatch_torch_load()`, or scoped: `with zckpt.torch_load_from_zckpt(): ...`.
"""
import contextlib
import os
import threading
import warnings

import torch

_lock = threading.Lock()
_original = None  # torch.load before the first patch
_folders = {}
_log = None
_allow = ()  # allow_globals for every redirected load


def _candidate(path):
    """The container for a torch.load path, or None."""
    path = os.path.abspath(path)
    stem, ext = os.path.splitext(path)
    name = os.path.basename(stem if ext in (".pt", ".pth", ".bin", ".ckpt") else path) + ".zckpt"
    where = [os.path.dirname(path)]
    folder = os.path.dirname(path)
    for src, dst in _folders.items():
        if folder == src or folder.startswith(src + os.sep):
            where.insert(0, os.path.join(dst, os.path.relpath(folder, src)))
    for d in where:
        c = os.path.join(d, name)
        if os.path.isfile(c):
            return c
    return None


def _stale(pt, container):
    """True when the .pt beside the container is not the file it was converted from (another
    size, or written after the container)."""
    if not os.path.exists(pt):
        return False
    from . import _C

    try:
        saved = _C.describe(container)["metadata"].get("zckpt.source.bytes")
    except Exception:  # noqa: BLE001 - an unreadable container is left to torch.load's file
        return True
    if saved is not None and int(saved) != os.path.getsize(pt):
        return True
    return os.path.getmtime(pt) > os.path.getmtime(container)


def _weights_only(weights_only):
    """torch.load's own resolution (torch/serialization.py, load): None means True unless
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD; TORCH_FORCE_WEIGHTS_ONLY_LOAD forces True."""
    true_values = ("1", "y", "yes", "true")
    if os.getenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "0").lower() in true_values:
        return True
    if weights_only is None:
        return os.getenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "0").lower() not in true_values
    return bool(weights_only)


def _patched_load(f, map_location=None, pickle_module=None, *, weights_only=None, mmap=None, **kwargs):
    original = _original
    if pickle_module is None and not kwargs and isinstance(f, (str, os.PathLike)):
        container = _candidate(os.fspath(f))
        if container is not None and not _stale(os.fspath(f), container):
            from ._api import load

            weights_only = _weights_only(weights_only)
            if _log is not None:
                _log(os.fspath(f), container)
            return load(container, map_location=map_location, weights_only=weights_only, mmap=bool(mmap),
                        allow_globals=_allow)
        if container is not None:
            warnings.warn(f"zckpt: {container} is older than, or not converted from, {os.fspath(f)}: "
                          f"reading the .pt with torch.load", stacklevel=2)
    if pickle_module is not None:
        kwargs["pickle_module"] = pickle_module
    return original(f, map_location=map_location, weights_only=weights_only, mmap=mmap, **kwargs)


def patch_torch_load(folders=None, *, log=None, allow_globals=()):
    """Makes torch.load read a `.zckpt` in place of the `.pt` it was converted from.

    `folders`: {pt_folder: zckpt_folder} where converted folders live apart (`zckpt convert DIR -o
    OUT`): a .pt under pt_folder is looked for under zckpt_folder at the same relative path,
    then next to itself. `log(pt_path, zckpt_path)` is called for each redirected load.
    Calls that pass a file object, pickle_module or other torch-only arguments, and paths with
    no container (or a container older than its .pt), go to torch.load unchanged. A redirected
    load is zckpt.load, so its pickle is vetted first: `allow_globals` are the globals it may name
    besides zckpt's allowlist (a refused one raises zckpt.UnsafeError, never falls back)."""
    global _original, _folders, _log, _allow
    with _lock:
        if _original is None:
            _original = torch.load
            torch.load = _patched_load
        _folders = {os.path.abspath(k): os.path.abspath(v) for k, v in (folders or {}).items()}
        _log = log
        _allow = tuple(allow_globals)


def unpatch_torch_load():
    """Restores torch.load as it was before patch_torch_load."""
    global _original, _folders, _log, _allow
    with _lock:
        if _original is not None:
            torch.load = _original
            _original = None
        _folders, _log, _allow = {}, None, ()


@contextlib.contextmanager
def torch_load_from_zckpt(folders=None, *, log=None, allow_globals=()):
    """patch_torch_load for the duration of a with block (not re-entrant across threads)."""
    was_patched = _original is not None
    saved = (dict(_folders), _log, _allow)
    patch_torch_load(folders, log=log, allow_globals=allow_globals)
    try:
        yield
    finally:
        if was_patched:
            patch_torch_load(saved[0], log=saved[1], allow_globals=saved[2])
        else:
            unpatch_torch_load()
