"""The tensors load_into writes, proven live before the first byte moves.

A load that fills a copy reports success while the model keeps its old values: the worst
failure a loader has. So for a module every target must share its memory with one of the
module's own parameters or buffers (what forward and the optimizer read), and for an optimizer
every target is taken from optimizer.state itself. Sharded entries (DTensor, ShardedTensor)
resolve to their local tensor after the file's record of them is checked against them.
"""
import torch

from ._errors import ZckptError
from ._sharded import check_rank_of_file, local_target, process_rank, records, records_of


def _live_storages(module):
    """Storage addresses of the module's own parameters and buffers (DTensors: their local
    tensor's)."""
    out = set()
    for t in list(module.parameters()) + list(module.buffers()):
        local = getattr(t, "_local_tensor", None)
        t = local if isinstance(local, torch.Tensor) else t
        if t.numel():
            try:
                out.add(t.untyped_storage().data_ptr())
            except (RuntimeError, NotImplementedError):  # a wrapper subclass with no storage
                pass
    return out


def _is_sharded_kind(t):
    # FSDP1's FlatParameter is an nn.Parameter marked by an attribute (its isinstance is a metaclass check).
    return type(t).__name__ in ("DTensor", "ShardedTensor") or getattr(t, "_is_flat_param", False)


def resolve(path, target, named, ckpt=None):
    """(name, tensor) pairs for the load from load_into's (name, state entry) pairs; the
    records from `ckpt` (an opened checkpoint) when given, the file load_into reads."""
    recs = records(path) if ckpt is None else records_of(ckpt)
    out = []
    sharded = False
    for name, t in named:
        sharded = sharded or _is_sharded_kind(t)
        local = local_target(path, name, t, recs.get(name))
        if local is None:
            continue
        out.append((name, local.detach()))
    if isinstance(target, torch.nn.Module):
        live = _live_storages(target)
        for name, t in out:
            if t.numel() and t.untyped_storage().data_ptr() not in live:
                raise ZckptError(
                    f"{path}: cannot load into '{name}': {type(target).__name__}.state_dict() returned a copy of it, "
                    f"not the module's own parameter or buffer, so writing it would leave the module unchanged "
                    f"(load_into writes only the module's live tensors)")
    if isinstance(target, torch.optim.Optimizer):
        sharded = any(_is_sharded_kind(p) for g in target.param_groups for p in g["params"])
    where = process_rank()
    if sharded and where is not None:
        check_rank_of_file(path, where[0], where[1], "this process")
    return out


def optimizer_tensors(optimizer):
    """(name, tensor) of the optimizer's state tensors, named as optimizer.state_dict() names
    them (state.<index>.<key>), taken from optimizer.state itself (the live tensors)."""
    out = []
    index = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            for k, v in optimizer.state.get(p, {}).items():
                if isinstance(v, torch.Tensor):
                    out.append((f"state.{index}.{k}", v))
            index += 1
    return out
