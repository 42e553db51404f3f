"""load_into for FSDP1 (`FullyShardedDataParallel`) modules: straight into each rank's
FlatParameter shard.

FSDP1's state_dict() hands out copies (an all-gather, then a clone of this rank's rows as a
ShardedTensor, or a clone of the whole parameter): filling those changes nothing the module
reads. So zckpt never fills them. It writes the live FlatParameter shard instead:

  rank r's shard of a FlatParameter holds, for each original parameter p it overlaps, the
  flattened elements [intra_param_start_idx, intra_param_end_idx] of p
  (FlatParameter._shard_param_infos); a SHARDED_STATE_DICT file of rank k holds rows
  [k*c, (k+1)*c) of p, c = ceil(dim0 / world_size) (torch.chunk, FSDP's _create_chunk_sharded_tensor),
  i.e. flattened elements [k*c*row, (k+1)*c*row); a FULL_STATE_DICT file holds all of p.

Each needed element run is copied from the file that holds it (this rank's, or the sibling file
of the rank that saved those rows, `..._world_size_W_rank_K.zckpt` in the same folder) straight
into the FlatParameter shard: element runs (_into.load_element_runs, on the torch-free core) stream
the chunks holding those bytes into the shard's memory, checksums checked. No all-gather, no state-dict copy, no collective.

Memory (host and device): nothing beyond the loader's ring (slots x slot size, by default
max(4, threads + 2) x max(chunk size, 8 MiB); on a CUDA target a pinned host ring of the same
size). Reads: this rank's shard
bytes, plus whole chunks around them (chunk_bytes, 4 MiB by default) from the files holding
them, i.e. about (model bytes / W) + 2 x chunk_bytes x (parameters straddling a file boundary).

The files may be objects of an object folder (s3://BUCKET/PREFIX/model_world_size_W_rank_R.zckpt):
the sibling files are found beside the path given, a HEAD each, and read with ranged GETs of the
chunks holding the rows needed.

Only when a needed rank's file is missing (its folder was not copied here) does every rank fall
back, together, to FSDP's own load (fsdp_fallback, below), whose cost is FSDP's.
"""
import torch

from . import _core, _paths
from ._errors import ZckptError
from ._into import load_element_runs, load_into_targets
from ._sharded import check_rank_of_file, records_of, sibling

_CAN_IN_PLACE, _NEEDS_FALLBACK, _REFUSED = 2, 1, 0


def fsdp1_modules(module):
    """The FSDP1 modules in `module` (itself included), or [] when it has none."""
    import sys

    if "torch.distributed.fsdp" not in sys.modules:
        return []
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return [(name, m) for name, m in module.named_modules() if isinstance(m, FSDP)]


def _clean(name):
    from torch.distributed.fsdp._common_utils import clean_tensor_name

    return clean_tensor_name(name)


def _join(prefix, name):
    return f"{prefix}.{name}" if prefix else name


def _persistent_buffers(model):
    """(state-dict name, buffer) of the buffers state_dict() saves (not the non-persistent ones,
    such as a rotary embedding's inv_freq)."""
    seen = set()
    for mname, m in model.named_modules():
        for bname, b in m._buffers.items():
            if b is None or bname in m._non_persistent_buffers_set:
                continue
            name = _clean(_join(mname, bname))
            if name not in seen:
                seen.add(name)
                yield name, b


class _Unit:
    """One FlatParameter: its state-dict names, shapes and this rank's shard."""

    def __init__(self, prefix, fsdp_module):
        handle = fsdp_module._handle
        self.flat = handle.flat_param
        self.module = fsdp_module
        self.rank = fsdp_module.rank
        self.world_size = fsdp_module.world_size
        self.names = [_clean(_join(prefix, f)) for f in self.flat._fqns]
        self.shared = [_clean(_join(prefix, _join(info.module_name, info.param_name)))
                       for info in getattr(self.flat, "_shared_param_infos", ())]
        self.shapes = list(self.flat._shapes)
        self.infos = list(self.flat._shard_param_infos)
        self.strategy = handle._sharding_strategy


def _units(model):
    units = []
    for name, m in fsdp1_modules(model):
        if getattr(m, "_handle", None) is None:
            continue
        units.append(_Unit(_clean(name), m))
    return units


def _shard_of(unit, path):
    """This rank's FlatParameter shard, the live tensor FSDP and the optimizer use."""
    flat = unit.flat
    shard = flat.data
    local = getattr(flat, "_local_shard", None)
    if local is not None and local.data_ptr() != shard.data_ptr():
        raise ZckptError(f"{path}: the FlatParameter holding '{unit.names[0]}' is unsharded right now (inside "
                            f"summon_full_params or a forward pass): load before or after, not during")
    return shard


def _row_chunk(dim0, world_size, rank):
    """Rows [lo, hi) torch.chunk gives `rank` (FSDP1's _create_chunk_sharded_tensor)."""
    c = -(-dim0 // world_size) if dim0 else 0
    lo = min(rank * c, dim0)
    return lo, min(lo + c, dim0), c


class _Plan:
    def __init__(self, path, ckpt, own):
        self.path = path
        # file -> (its _core Checkpoint, its records), opened once: the records checked and the
        # bytes loaded come from the same open file, so a checkpoint renamed over a path
        # meanwhile is never mixed in.
        self.opened = {path: (ckpt, own)}
        self.ranges = {}  # file -> [(name, first element, target)]
        self.fallback_why = None
        self.bytes = 0

    def records(self, file):
        """The records of `file`, opened on first use."""
        if file not in self.opened:
            ckpt = _core.open(file)
            self.opened[file] = (ckpt, records_of(ckpt))
        return self.opened[file][1]

    def add(self, file, name, begin, target):
        self.ranges.setdefault(file, []).append((name, begin, target))
        self.bytes += target.numel() * target.element_size()


def _plan_param(plan, unit, name, shape, info, shard, own):
    """Adds the ranges filling parameter `name`'s part of this rank's shard."""
    path = plan.path
    numel = 1
    for s in shape:
        numel *= s
    rec = own[name]
    if not rec.sharded:
        if tuple(rec.shape) != tuple(shape):
            raise ZckptError(f"{path}: size mismatch for '{name}': the file has shape {list(rec.shape)}, "
                                f"the module's parameter has shape {list(shape)}")
        if info.in_shard:
            target = shard[info.offset_in_shard: info.offset_in_shard + info.numel_in_shard]
            plan.add(path, name, info.intra_param_start_idx, target)
        return
    # A ShardedTensor shard: rows of the parameter, as FSDP1 chunked it over `world_size` ranks.
    ws, rank = unit.world_size, unit.rank
    _check_chunk(path, name, rec, shape, ws, rank)
    if not info.in_shard:
        return
    dim0 = shape[0]
    row = numel // dim0 if dim0 else 0
    lo, hi, c = _row_chunk(dim0, ws, rank)
    need_lo, need_hi = info.intra_param_start_idx, info.intra_param_end_idx + 1
    for k in range(ws):
        k_lo, k_hi, _ = _row_chunk(dim0, ws, k)
        a, b = max(need_lo, k_lo * row), min(need_hi, k_hi * row)
        if a >= b:
            continue
        target = shard[info.offset_in_shard + (a - need_lo): info.offset_in_shard + (b - need_lo)]
        if k == rank:
            plan.add(path, name, a - k_lo * row, target)
            continue
        other = sibling(path, k)
        if other is None or (other not in plan.opened and not _paths.isfile(other)):
            plan.fallback_why = (f"rows {k_lo}..{k_hi - 1} of '{name}' that this rank's FlatParameter shard holds were "
                                 f"saved by rank {k}, whose file {other or '(not named ..._rank_K)'} is not here")
            return
        theirs = plan.records(other)
        if name not in theirs:
            raise ZckptError(f"{other}: has no '{name}', which rank {k} saved rows {k_lo}..{k_hi - 1} of")
        _check_chunk(other, name, theirs[name], shape, ws, k)
        plan.add(other, name, a - k_lo * row, target)


def _check_chunk(path, name, rec, shape, ws, rank):
    ex = rec.extra_fields
    lo, hi, _ = _row_chunk(shape[0] if shape else 0, ws, rank)
    want_offsets = [lo] + [0] * (len(shape) - 1)
    want_sizes = [hi - lo] + list(shape[1:])
    problems = []
    if list(ex.get("global_shape", shape)) != list(shape):
        problems.append(f"global shape {ex.get('global_shape')} saved, the module's parameter has {list(shape)}")
    elif list(ex.get("shard_offsets", want_offsets)) != want_offsets or list(rec.shape) != want_sizes:
        problems.append(f"rows from {ex.get('shard_offsets')} of shape {list(rec.shape)} saved, rank {rank} of {ws} "
                        f"holds rows from {want_offsets} of shape {want_sizes}")
    placement = ex.get("placement", "")
    if placement.startswith("rank:") and placement.split("/")[0] != f"rank:{rank}":
        problems.append(f"saved by {placement.split('/')[0].replace(':', ' ')}, expected rank {rank}")
    if problems:
        raise ZckptError(f"{path}: cannot load '{name}' into the FSDP module: " + "; ".join(problems)
                            + f" (saved at another world size or sharding than this {ws}-rank FSDP; "
                            f"resharding is not supported)")


def _agree(units, status, device):
    """All ranks take the same road (a fallback is collective): MIN over the process group."""
    if not units or units[0].world_size == 1 or not torch.distributed.is_initialized():
        return status
    pg = units[0].module.process_group
    t = torch.tensor([status], dtype=torch.int32, device=device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN, group=pg)
    return int(t.item())


def load_into_fsdp1(path, model, strict, verify, weights_only, allowed=(), sizes=None):
    """zckpt.load_into for a module holding FSDP1 units (see the module docstring). `allowed`:
    globals the files' pickles may name besides zckpt's allowlist (every file read is vetted);
    `sizes`: the loader's threads, slots and slot_bytes (_arg_checks.ring_sizes; None: defaults).
    Returns (missing, unexpected)."""
    sizes = sizes or {}
    units = _units(model)
    ckpt = _core.open(path)
    own = records_of(ckpt)
    status, error = _CAN_IN_PLACE, None
    plan = _Plan(path, ckpt, own)
    loaded_names = set()
    plain = []  # (name, tensor): buffers and parameters FSDP does not manage, loaded whole
    try:
        for u in units:
            if u.world_size > 1 and "HYBRID" in str(u.strategy):
                raise ZckptError(f"{path}: FSDP1 with {u.strategy} is not supported by load_into "
                                    f"(use zckpt.load and the module's load_state_dict)")
        if units and units[0].world_size > 1:
            check_rank_of_file(path, units[0].rank, units[0].world_size, "this FSDP module's process")
        for u in units:
            shard = _shard_of(u, path)
            for name, shape, info in zip(u.names, u.shapes, u.infos):
                loaded_names.add(name)
                if name in own:
                    _plan_param(plan, u, name, shape, info, shard, own)
            loaded_names.update(u.shared)
        managed = {id(u.flat) for u in units}
        for name, p in model.named_parameters():
            cname = _clean(name)
            if id(p) in managed or cname in loaded_names or type(p).__name__ == "FlatParameter":
                continue
            plain.append((cname, p))
        for name, b in _persistent_buffers(model):
            plain.append((name, b))
        for name, _ in plain:
            loaded_names.add(name)
        expected = loaded_names
        missing = sorted(n for n in expected if n not in own)
        unexpected = [n for n, r in own.items() if n not in expected and not r.internal]
        if strict and (missing or unexpected):
            keys = []
            if missing:
                keys.append("Missing key(s): " + ", ".join(f'"{n}"' for n in missing))
            if unexpected:
                keys.append("Unexpected key(s): " + ", ".join(f'"{n}"' for n in unexpected))
            raise ZckptError(f"cannot load {path} into the FSDP module:\n  " + "; ".join(keys))
        if plan.fallback_why is not None:
            status = _NEEDS_FALLBACK
    except Exception as e:  # noqa: BLE001 - re-raised after the other ranks are told
        status, error = _REFUSED, e
    device = units[0].flat.device if units else torch.device("cpu")
    if units and units[0].world_size > 1 and torch.distributed.get_backend(units[0].module.process_group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    agreed = _agree(units, status, device)
    if error is not None:
        raise error
    if agreed == _REFUSED:
        raise ZckptError(f"{path}: another rank refused its checkpoint file; nothing was loaded")
    if agreed == _NEEDS_FALLBACK:
        why = plan.fallback_why or "another rank cannot read the rows it needs in place"
        fsdp_fallback(path, model, strict, verify, why, allowed, sizes)
        return missing, unexpected
    with torch.no_grad():
        # Buffers and unmanaged parameters first: checked (shape, dtype) before any byte moves.
        if plain:
            load_into_targets(ckpt, [(n, t.detach()) for n, t in plain if n in own], False, verify, list(allowed),
                              sizes)
        for file, ranges in plan.ranges.items():
            load_element_runs(plan.opened[file][0], ranges, verify, list(allowed), sizes)
    return missing, unexpected


def fsdp_fallback(path, model, strict, verify, why, allowed=(), sizes=None):
    """FSDP's own load: this rank's saved shards are streamed into fresh tensors, wrapped as the
    ShardedTensors FSDP saved (the file's shard offsets and sizes), and handed to
    model.load_state_dict under SHARDED_STATE_DICT, which all-gathers each parameter and keeps
    this rank's part. Collective: every rank calls it, in the same order.

    Peak on top of the model (host for CPU tensors; on a GPU, FSDP's compute device): this
    rank's state dict, i.e. (model bytes / W), plus FSDP's all-gather of one whole parameter
    (largest parameter bytes) and its padded local chunk."""
    import warnings

    from torch.distributed._shard.sharded_tensor import Shard, ShardMetadata, init_from_local_shards
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import StateDictType

    sizes = sizes or {}
    warnings.warn(f"zckpt.load_into({path!r}): not in place ({why}); loading through FSDP's load_state_dict "
                  f"(an all-gather per parameter)", stacklevel=3)
    ckpt = _core.open(path)  # one open file for the records and the bytes (see _Plan)
    own = records_of(ckpt)
    pg = model.process_group
    rank = torch.distributed.get_rank(pg)
    local = {n: torch.empty(r.shape, dtype=getattr(torch, r.dtype)) for n, r in own.items()
             if not r.internal}
    load_into_targets(ckpt, list(local.items()), False, verify, list(allowed), sizes)
    state = {}
    for name in sorted(local):
        rec = own[name]
        if not rec.sharded:
            state[name] = local[name]
            continue
        ex = rec.extra_fields
        meta = ShardMetadata(list(ex["shard_offsets"]), list(ex["shard_sizes"]), f"rank:{rank}/cpu")
        state[name] = init_from_local_shards([Shard(local[name], meta)], *ex["global_shape"], process_group=pg)
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        model.load_state_dict(state, strict=strict)
