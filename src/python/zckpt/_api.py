"""The public functions of the zckpt package (see __init__.py)."""
import os

import torch

from . import _C
from ._restore import unpickle
from ._fsdp import fsdp1_modules, load_into_fsdp1
from ._targets import optimizer_tensors, resolve

ZckptError = _C.ZckptError
CorruptError = _C.CorruptError
UnsafeError = _C.UnsafeError


def _path(f):
    if isinstance(f, (str, os.PathLike)):
        return os.fspath(f)
    raise TypeError(f"zckpt works on paths, not {type(f).__name__}")


def _target_device(map_location, location):
    """Where a storage saved at `location` goes; None means 'ask the callable after a CPU load'."""
    if map_location is None:
        return torch.device(location)
    if isinstance(map_location, (str, torch.device)):
        return torch.device(map_location)
    if isinstance(map_location, dict):
        return torch.device(map_location.get(location, location))
    if callable(map_location):
        return None
    raise TypeError(f"map_location must be None, a str, a torch.device, a dict or a callable, not {map_location!r}")


def load(f, map_location=None, weights_only=True, mmap=False, *, verify=True):
    """Returns what torch.load returns for the original .pt file.

    Storages stream from the container onto their device (map_location as torch.load accepts
    it), each chunk's checksum checked unless verify=False. mmap=True gives CPU tensors that
    alias the file (copy-on-write), reading nothing up front.
    """
    path = _path(f)
    info = _C.describe(path)
    legacy = info["metadata"].get("zckpt.source.format") == "legacy"
    pickle_bytes = _C.read_blob(path, "data.pkl")
    locations = {s["key"]: s["location"] for s in info["storages"]}

    if mmap:
        if map_location not in (None, "cpu", torch.device("cpu")):
            raise ValueError("mmap=True gives CPU tensors; map_location must be None or 'cpu'")
        raw = _C.map_storages(path)
    else:
        devices = {}
        for key, location in locations.items():
            dev = _target_device(map_location, location)
            devices[key] = "cpu" if dev is None else str(dev)
        raw = _C.load_storages(path, devices, verify)

    restored = {}  # key -> storage handed out: each storage is restored (and mapped) once

    def storage_for_key(key, location, dtype):
        if key in restored:
            return restored[key]
        if key not in raw:
            raise CorruptError(f"{path}: the pickle names storage '{key}', which the container does not hold")
        untyped = raw[key].untyped_storage()
        if callable(map_location) and not isinstance(map_location, (str, torch.device, dict)):
            moved = map_location(untyped, location)
            if moved is not None:
                untyped = moved if isinstance(moved, torch.UntypedStorage) else moved.untyped_storage()
        restored[key] = untyped
        return untyped

    return unpickle(pickle_bytes, storage_for_key, weights_only=weights_only, legacy=legacy)


def _named_tensors(target):
    """(name, tensor) pairs of what load_into fills, named as torch.save named them."""
    if isinstance(target, torch.nn.Module):
        return list(target.state_dict(keep_vars=True).items())
    if isinstance(target, torch.optim.Optimizer):
        return optimizer_tensors(target)
    if isinstance(target, dict):
        out = []

        def walk(prefix, obj):
            for k, v in obj.items():
                name = f"{prefix}{k}"
                if isinstance(v, torch.Tensor):
                    out.append((name, v))
                elif isinstance(v, dict):
                    walk(name + ".", v)

        walk("", target)
        return out
    raise TypeError(f"load_into takes an nn.Module, an optimizer or a state dict, not {type(target).__name__}")


def _saved_param_groups(path, optimizer, weights_only):
    """The saved param_groups (lr, betas, ...), checked against the optimizer's groups.

    The kept pickle is replayed with every storage on the meta device: no tensor memory at all,
    and through torch's weights-only unpickler unless the caller says otherwise, so nothing the
    file names runs."""
    pickle_bytes = _C.read_blob(path, "data.pkl")
    meta = unpickle(pickle_bytes, lambda key, loc, dtype: torch.UntypedStorage(0, device="meta"),
                    weights_only=weights_only, legacy=False)
    saved_groups = meta.get("param_groups", []) if isinstance(meta, dict) else []
    if len(saved_groups) != len(optimizer.param_groups):
        raise ValueError(f"{path}: {len(saved_groups)} param groups saved, optimizer has "
                         f"{len(optimizer.param_groups)}")
    for i, (group, saved) in enumerate(zip(optimizer.param_groups, saved_groups)):
        if len(saved.get("params", [])) != len(group["params"]):
            raise ValueError(f"{path}: param group {i} saved with {len(saved.get('params', []))} parameters, "
                             f"the optimizer's has {len(group['params'])}")
    return saved_groups


def _restore_param_groups(optimizer, saved_groups):
    for group, saved in zip(optimizer.param_groups, saved_groups):
        for k, v in saved.items():
            if k != "params":
                group[k] = v


def load_into(f, target, strict=True, *, verify=True, weights_only=True):
    """Copies the checkpoint's tensors into existing tensors, in place, on whatever device each
    lives on: every data_ptr() stays. dtype and shape are checked for every target before the
    first byte moves. strict=True refuses missing and unexpected names, as load_state_dict does.
    Returns (missing, unexpected) names. An optimizer must already hold its state tensors (after
    one step, or a previous load); its param_groups' hyper-parameters are restored too, read with
    torch's weights-only unpickler unless weights_only=False.

    Only live tensors are written, never a copy: a module's targets must share memory with its own
    parameters and buffers (else ZckptError naming the file and the entry), an optimizer's are
    taken from optimizer.state. DTensor / ShardedTensor entries are written through their local
    shard after the file's record (global shape, placements/mesh, shard offsets and sizes) is
    checked against them; a verl-style file (..._world_size_W_rank_R) of another rank or world
    size is refused. FSDP1 modules (FullyShardedDataParallel) are written straight into each
    rank's FlatParameter shard (see _fsdp.py; call on every rank, as load_state_dict). Extra
    memory: the loader's ring (slots x slot_bytes, 4 x 8 MiB by default), host and device alike;
    an FSDP1 fallback to FSDP's load_state_dict (a needed rank file missing) costs model/W + the
    largest parameter."""
    path = _path(f)
    if isinstance(target, torch.nn.Module) and fsdp1_modules(target):
        return load_into_fsdp1(path, target, strict, verify, weights_only)
    named = resolve(path, target, _named_tensors(target))
    saved_groups = None
    if isinstance(target, torch.optim.Optimizer):
        # Checked before any tensor is touched, as optimizer.load_state_dict does.
        saved_groups = _saved_param_groups(path, target, weights_only)
    with torch.no_grad():
        missing, unexpected = _C.load_into(path, named, strict, verify)
    if saved_groups is not None:
        _restore_param_groups(target, saved_groups)
    return missing, unexpected


def convert(src, dst=None, *, chunk_bytes=0, zstd_level=0, threads=0):
    """Converts a torch.save file to a container (no Python code from the file runs).
    Returns a dict of statistics."""
    src = _path(src)
    return _C.convert(src, _path(dst) if dst is not None else "", chunk_bytes, zstd_level, threads)


def export(src, dst, *, format=None):
    """Writes a container back as a .pt file that torch.load reads (format="pt"), or as a
    .safetensors file (format="safetensors"; the default when dst ends in .safetensors)."""
    dst = _path(dst)
    if format is None:
        format = "safetensors" if dst.endswith(".safetensors") else "pt"
    _C.export(_path(src), dst, format)


def verify(path, *, threads=0, raise_on_error=True):
    """Checks every byte of a container. Returns the list of problems (empty when good);
    with raise_on_error, raises CorruptError listing them instead."""
    problems = _C.verify(_path(path), threads)
    if problems and raise_on_error:
        raise CorruptError("\n".join(problems))
    return problems
