"""What a container says about its sharded tensors, and the checks that keep load_into from
writing one rank's shard into another's.

The converter records, per tensor (`zckpt ls --json` shows it as `extra`):
  - a ShardedTensor's local shard (FSDP1's SHARDED_STATE_DICT): flag `sharded`, extra
    {global_shape, shard_offsets, shard_sizes, placement: "rank:R/dev"};
  - a DTensor's local tensor (FSDP2): flag `dtensor`, extra {global_shape, placements,
    mesh_shape, ...}. A DTensor pickle does not carry the saving rank's mesh coordinate, so
    that rank is taken from the verl-style file name (`..._world_size_W_rank_R`).
"""
import functools
import os
import re

import torch

from . import _paths
from . import _core, _records
from ._errors import ZckptError

# verl's per-rank names: model_world_size_8_rank_3.pt (and their conversions).
_RANK_NAME = re.compile(r"^(?P<head>.*_world_size_)(?P<ws>\d+)(?P<mid>_rank_)(?P<rank>\d+)(?P<tail>\.[^/]*)?$")


@functools.lru_cache(maxsize=64)
def _cached_records(path, mtime_ns, size):
    return _records.by_name(_records.of_path(path))


def records(path):
    """name -> _records.Record for every tensor of the container at `path` (the index only is read); a
    local file's are cached while its mtime and size stay, an object's are read each time."""
    if _paths.is_url(path):
        return _records.by_name(_records.of_path(path))
    st = os.stat(path)
    return _cached_records(path, st.st_mtime_ns, st.st_size)


def records_of(ckpt):
    """records() of an opened checkpoint (either module's): the index of that very open file."""
    return _records.by_name(_records.of_checkpoint(ckpt))


def saved_rank(path):
    """(rank, world_size) from a verl-style name: the container's own, else the name of the .pt
    it was converted from; None when neither follows the pattern."""
    for name in (_paths.basename(path), _source_name(path)):
        m = _RANK_NAME.match(name or "")
        if m:
            return int(m.group("rank")), int(m.group("ws"))
    return None


def _source_name(path):
    try:
        return _core.describe(path)["metadata"].get("zckpt.source.name")
    except Exception:  # noqa: BLE001 - only a hint for error messages and checks
        return None


def sibling(path, rank):
    """The file of `rank` next to `path` (same prefix, world size and suffix; in the same folder,
    local or object), or None when the name is not verl-style."""
    base = _paths.basename(path)
    m = _RANK_NAME.match(base)
    if not m:
        return None
    name = f"{m.group('head')}{m.group('ws')}{m.group('mid')}{rank}{m.group('tail') or ''}"
    return path[:len(path) - len(base)] + name


def process_rank():
    """(rank, world_size) of the default process group, or None outside torch.distributed."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return None


def check_rank_of_file(path, rank, world_size, what):
    """Refuses a verl-style file saved by another rank or at another world size."""
    saved = saved_rank(path)
    if saved is None:
        return
    if saved != (rank, world_size):
        raise ZckptError(
            f"{path}: saved by rank {saved[0]} of world size {saved[1]}, but {what} is rank {rank} of "
            f"world size {world_size}: each rank loads its own file, at the world size it was saved at "
            f"(resharding is not supported)")


def _is_dtensor(t):
    mod = __import__("sys").modules.get("torch.distributed.tensor")
    return mod is not None and isinstance(t, mod.DTensor)


def _is_sharded_tensor(t):
    mod = __import__("sys").modules.get("torch.distributed._shard.sharded_tensor")
    return mod is not None and isinstance(t, mod.ShardedTensor)


def _placements(dt):
    out = []
    for p in dt.placements:
        kind = type(p).__name__
        entry = {"type": kind}
        if hasattr(p, "dim") and kind in ("Shard", "_StridedShard", "StridedShard"):
            entry["dim"] = p.dim
        out.append(entry)
    return out


def local_target(path, name, t, rec):
    """The tensor load_into writes for state entry `name` (a DTensor's local tensor, a
    ShardedTensor's one local shard, else `t`), after checking the file's record of it says the
    same global shape and placement as the target. Returns None for a ShardedTensor with no
    local shard on this rank (nothing to write; the file must hold nothing either)."""
    if _is_dtensor(t):
        if rec is not None:
            _check_dtensor(path, name, t, rec)
        return t._local_tensor
    if _is_sharded_tensor(t):
        shards = t.local_shards()
        if len(shards) > 1:
            raise ZckptError(f"{path}: target '{name}' is a ShardedTensor with {len(shards)} local shards: "
                                f"load_into fills one local shard per rank")
        if not shards:
            if rec is not None:
                raise ZckptError(f"{path}: '{name}' holds a shard here, the target ShardedTensor has none on "
                                    f"this rank: saved at another world size or sharding")
            return None
        if rec is not None:
            _check_sharded(path, name, t, shards[0], rec)
        return shards[0].tensor
    if rec is not None and (rec.sharded or rec.dtensor):
        kind = "a ShardedTensor shard" if rec.sharded else "a DTensor's local tensor"
        glob = rec.extra_fields.get("global_shape")
        if glob is not None and list(glob) != list(rec.shape):
            raise ZckptError(f"{path}: '{name}' is saved as {kind} (global shape {glob}, this shard "
                                f"{list(rec.shape)}); the target is a plain tensor of shape {list(t.shape)}")
    return t


def _check_dtensor(path, name, t, rec):
    problems = []
    if not rec.dtensor:
        problems.append("the file holds a plain tensor, the target is a DTensor")
    ex = rec.extra_fields
    if "global_shape" in ex and list(ex["global_shape"]) != list(t.shape):
        problems.append(f"global shape {ex['global_shape']} saved, the target's is {list(t.shape)}")
    if "placements" in ex:
        saved = [{k: v for k, v in p.items() if k in ("type", "dim")} for p in ex["placements"]]
        if saved != _placements(t):
            problems.append(f"placements {saved} saved, the target's are {_placements(t)}")
    if "mesh_shape" in ex and list(ex["mesh_shape"]) != list(t.device_mesh.shape):
        problems.append(f"device mesh {ex['mesh_shape']} saved, the target's is {list(t.device_mesh.shape)}")
    if problems:
        raise ZckptError(f"{path}: cannot load '{name}' into its DTensor: " + "; ".join(problems)
                            + " (saved at another world size or sharding; resharding is not supported)")


def _check_sharded(path, name, t, shard, rec):
    problems = []
    if not rec.sharded:
        problems.append("the file holds a plain tensor, the target is a ShardedTensor shard")
    ex, meta = rec.extra_fields, shard.metadata
    if "global_shape" in ex and list(ex["global_shape"]) != list(t.size()):
        problems.append(f"global shape {ex['global_shape']} saved, the target's is {list(t.size())}")
    if "shard_offsets" in ex and list(ex["shard_offsets"]) != list(meta.shard_offsets):
        problems.append(f"shard offsets {ex['shard_offsets']} saved, the target's are {list(meta.shard_offsets)}")
    if "shard_sizes" in ex and list(ex["shard_sizes"]) != list(meta.shard_sizes):
        problems.append(f"shard sizes {ex['shard_sizes']} saved, the target's are {list(meta.shard_sizes)}")
    placement = ex.get("placement", "")
    m = re.match(r"rank:(\d+)", placement)
    if m and meta.placement is not None and int(m.group(1)) != meta.placement.rank():
        problems.append(f"saved by rank {m.group(1)}, the target shard is rank {meta.placement.rank()}'s")
    if problems:
        raise ZckptError(f"{path}: cannot load '{name}' into its ShardedTensor: " + "; ".join(problems)
                            + " (saved at another world size or sharding; resharding is not supported)")
