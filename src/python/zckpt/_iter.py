"""zckpt.iter_tensors: a checkpoint's tensors one at a time, the weight iterator of inference
engines (vLLM's and SGLang's `load_weights(weights)`) and of RL weight sync (verl)."""
import json
import os

import torch

from . import _paths
from ._ext import _C
from ._args import allowed_globals as _allowed
from ._args import path_of as _path
from ._errors import ZckptError
from ._sharded import records_of

_INDEX_SUFFIX = ".zckpt.index.json"  # what `zckpt convert` writes for model.safetensors.index.json


def container_files(path):
    """The containers of `path` in load order: a container alone; a folder written by
    `zckpt convert` from a sharded checkpoint: the shards its *.zckpt.index.json names, in the
    order of their names (HF's -0000K-of-0000N.); any other folder: its *.zckpt files, sorted.
    A folder may be an object folder, s3://BUCKET/PREFIX/ (one listing; s3://BUCKET/PREFIX, no
    slash: one HEAD first, as an object of that name is a container, then that listing).
    Raises ZckptError when a folder holds none, or its index names a shard that is not there."""
    path = _path(path)
    present = None
    if _paths.is_url(path):
        # One request a question: is there an object of that name (a HEAD, not asked of a folder
        # URL), what is below the prefix (one listing: the folder test and its names at once).
        folder_url = path.endswith("/") or "/" not in path[len(_paths.SCHEME):]  # .../ or s3://BUCKET
        if not folder_url and _C.object_exists(path):
            return [path]
        below = _paths.files_under(path)
        if not below and not folder_url:
            return [path]  # neither: opening it says so
        present = {n for n in below if "/" not in n}  # its direct objects, not a HEAD per name
    elif not os.path.isdir(path):
        return [path]

    def isfile(name):
        return name in present if present is not None else os.path.isfile(_paths.join(path, name))

    names = sorted(present) if present is not None else _paths.listdir(path)
    indexes = [n for n in names if n.endswith(_INDEX_SUFFIX)]
    if len(indexes) > 1:
        raise ZckptError(f"{path}: more than one index ({', '.join(indexes)}): give the container or index to load")
    if indexes:
        index = _paths.join(path, indexes[0])
        try:
            weight_map = json.loads(_paths.read_bytes(index).decode("utf-8"))["weight_map"]
            files = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, ZckptError) as e:
            raise ZckptError(f"{index}: not a readable shard index ({type(e).__name__}: {e})") from None
        missing = [f for f in files if not isfile(f)]
        if missing:
            raise ZckptError(f"{index} names shards that are not in {path}: {', '.join(missing)}")
        return [_paths.join(path, f) for f in files]
    files = [_paths.join(path, n) for n in names if n.endswith(".zckpt") and isfile(n)]
    if not files:
        raise ZckptError(f"{path}: no .zckpt containers in this folder (convert one with `zckpt convert DIR -o OUT`)")
    return files


def iter_tensors(path, device="cpu", *, verify=True, verify_first=False, mmap=False, allow_globals=()):
    """Yields (name, tensor) for every tensor of a container, or of every container of a folder
    (container_files), in file order.

    Each tensor is streamed by zckpt's loader into a fresh contiguous tensor on `device`
    (`torch.device`, "cpu", "cuda:N"), reading only its own chunks, each checked against its
    checksum as it arrives (verify=False: not checked). Memory: the tensor being handed out plus
    the loader's ring while it loads: a consumer that drops each tensor after using it holds at
    most one tensor beyond what it keeps (the pages of a large CPU tensor it dropped are reused
    for the next). Tensors sharing storage in the file (tied weights, views) come out as separate
    copies.

    mmap=True (device "cpu" only): each file is mapped and every chunk checked where it lies in
    the mapping (no copy), then its tensors are yielded as views of that copy-on-write mapping
    (tied weights stay views of one storage), as zckpt.load(mmap=True) gives them: no memory
    beyond the page cache, and one copy fewer for a consumer that copies each tensor into its own
    parameters (vLLM's weight loaders); bytes another process rewrites in place later show through.

    verify_first=True checks every chunk of every file (and every file's pickle) before the first
    tensor is yielded: a corrupt checkpoint raises CorruptError naming file, tensor and byte
    range while the consumer has received nothing, which is what a weight update that must not
    be half-applied needs. It reads the files once more (from the page cache when they fit).
    All files are opened when iter_tensors is called and read through those open files, so a
    checkpoint renamed over the path meanwhile is read whole from the files opened.
    """
    return stream(open_containers(path), device, verify=verify, verify_first=verify_first, mmap=mmap,
                  allow_globals=allow_globals)


def open_containers(path):
    """_C.Checkpoint of every container_files(path), opened now, in load order: what stream()
    and table_of() read, so both see the same files whatever is renamed over `path` later."""
    return [_C.open(f) for f in container_files(path)]


def stream(checkpoints, device="cpu", *, verify=True, verify_first=False, mmap=False, allow_globals=()):
    """iter_tensors over containers already open (open_containers)."""
    device = str(torch.device(device))
    allowed = _allowed(allow_globals)
    if mmap:
        if device != "cpu":
            raise ValueError(f"mmap=True gives CPU views of the files; device {device!r} needs mmap=False")
        check = verify or verify_first
        if verify_first:  # every file mapped and checked now
            return _flatten([c.map_tensors(check, allowed) for c in checkpoints])
        return _flatten(c.map_tensors(check, allowed) for c in checkpoints)  # each file when reached
    # Everything that can fail before data moves, for every file, before the first yield.
    return _flatten([_C.tensor_stream(c, device, verify, verify_first, allowed) for c in checkpoints])


def _flatten(sources):
    """A generator (iter_tensors itself raises open, vet and verify_first errors)."""
    sources = iter(sources)
    for s in sources:
        it = iter(s)
        del s  # a mapped file's list is released as its tensors are handed out
        for item in it:
            yield item
            item = None  # noqa: F841 (the consumer's reference is the only one left)


def tensor_table(path):
    """{name: (dtype name, shape tuple)} of every tensor of a container or converted folder, from
    the indexes alone (nothing read but them)."""
    return table_of(open_containers(path))


def table_of(checkpoints):
    """tensor_table of containers already open (open_containers): their indexes, read at open."""
    table = {}
    for c in checkpoints:
        table.update((r.name, (r.dtype, r.shape)) for r in records_of(c).values() if not r.internal)
    return table
