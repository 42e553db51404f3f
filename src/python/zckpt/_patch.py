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

from . import _core
from ._errors import ZckptError

_lock = threading.Lock()
_original = None  # torch.load before the first patch
_folders = {}
_log = None
_allow = ()  # allow_globals for every redirected load
_on_fallback = None
_strict = False
_stats = {"redirected": 0, "fallbacks": 0}


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
    try:
        saved = _core.describe(container)["metadata"].get("zckpt.source.bytes")
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
            _stats["redirected"] += 1
            return load(container, map_location=map_location, weights_only=weights_only, mmap=bool(mmap),
                        allow_globals=_allow)
        if container is not None:
            _fall_back(os.fspath(f), container, "it is older than, or not converted from, the .pt")
    elif isinstance(f, (str, os.PathLike)) and _candidate(os.fspath(f)) is not None:
        _fall_back(os.fspath(f), _candidate(os.fspath(f)),
                   "torch.load was called with arguments zckpt.load does not take "
                   f"({', '.join(sorted(kwargs) + (['pickle_module'] if pickle_module is not None else []))})")
    if pickle_module is not None:
        kwargs["pickle_module"] = pickle_module
    return original(f, map_location=map_location, weights_only=weights_only, mmap=mmap, **kwargs)


def _fall_back(pt, container, why):
    """A container was there but torch.load reads the .pt: counted, told to on_fallback (and as a
    warning, which PYTHONWARNINGS=ignore silences), or, strict, raised."""
    _stats["fallbacks"] += 1
    msg = f"zckpt: {container} not used for torch.load({pt!r}): {why}; reading the .pt with torch.load"
    if _strict:
        raise ZckptError(msg.replace("; reading the .pt with torch.load", " (patch_torch_load(strict=True))"))
    if _on_fallback is not None:
        _on_fallback(pt, container, why)
    warnings.warn(msg, stacklevel=3)


def patch_stats():
    """{"redirected": loads read from a container, "fallbacks": loads that had a container but
    read the .pt} since the process started (or reset_patch_stats())."""
    return dict(_stats)


def reset_patch_stats():
    _stats.update(redirected=0, fallbacks=0)


def patch_torch_load(folders=None, *, log=None, allow_globals=(), on_fallback=None, strict=False):
    """Makes torch.load read a `.zckpt` in place of the `.pt` it was converted from.

    `folders`: {pt_folder: zckpt_folder} where converted folders live apart (`zckpt convert DIR -o
    OUT`): a .pt under pt_folder is looked for under zckpt_folder at the same relative path,
    then next to itself. `log(pt_path, zckpt_path)` is called for each redirected load.
    Calls that pass a file object, pickle_module or other torch-only arguments, and paths with
    no container (or a container older than its .pt), go to torch.load unchanged. A redirected
    load is zckpt.load, so its pickle is vetted first: `allow_globals` are the globals it may name
    besides zckpt's allowlist (a refused one raises zckpt.UnsafeError, never falls back).

    A load that finds a container but reads the .pt anyway (the container is older than the .pt
    or of another size: a folder copied without its timestamps lands the .pt after its .zckpt;
    torch-only arguments) is a fallback: counted in patch_stats(), passed to
    `on_fallback(pt_path, zckpt_path, why)` and warned about; with strict=True it raises
    zckpt.ZckptError instead. Copy converted folders with `cp -p` (or reconvert) to keep them
    in use."""
    global _original, _folders, _log, _allow, _on_fallback, _strict
    with _lock:
        if _original is None:
            _original = torch.load
            torch.load = _patched_load
        _folders = {os.path.abspath(k): os.path.abspath(v) for k, v in (folders or {}).items()}
        _log = log
        _allow = tuple(allow_globals)
        _on_fallback = on_fallback
        _strict = bool(strict)


def unpatch_torch_load():
    """Restores torch.load as it was before patch_torch_load."""
    global _original, _folders, _log, _allow, _on_fallback, _strict
    with _lock:
        if _original is not None:
            torch.load = _original
            _original = None
        _folders, _log, _allow, _on_fallback, _strict = {}, None, (), None, False


@contextlib.contextmanager
def torch_load_from_zckpt(folders=None, *, log=None, allow_globals=(), on_fallback=None, strict=False):
    """patch_torch_load for the duration of a with block (not re-entrant across threads)."""
    was_patched = _original is not None
    saved = (dict(_folders), _log, _allow, _on_fallback, _strict)
    patch_torch_load(folders, log=log, allow_globals=allow_globals, on_fallback=on_fallback, strict=strict)
    try:
        yield
    finally:
        if was_patched:
            patch_torch_load(saved[0], log=saved[1], allow_globals=saved[2], on_fallback=saved[3], strict=saved[4])
        else:
            unpatch_torch_load()
