"""Resharding verl's per-rank checkpoint files to another world size.

    python -m zckpt reshard CKPT_DIR --world-size N -o OUT      (or: zckpt reshard ...)

verl saves one file per rank and family: `model_world_size_W_rank_R.pt` (FSDP2: DTensors; FSDP1:
ShardedTensors), `optim_world_size_W_rank_R.pt` (the same for the optimizer's moments),
`extra_state_world_size_W_rank_R.pt` (scheduler and RNG states). Resuming at N ranks needs the
same files for N ranks. For each family holding sharded tensors:

1. `zckpt merge` (C++, no torch) reassembles every full tensor into a temporary container, one
   tensor in memory at a time, every chunk checked, the shards checked to tile each tensor;
2. for each new rank r, rank 0's file gives the structure (keys, non-tensor values, each
   tensor's placements), and each sharded tensor is rebuilt as torch itself builds it at world
   size N: DTensor.from_local on a 1-D DeviceMesh of N ranks at the local shape and offset
   torch's compute_local_shape_and_global_offset gives rank r; FSDP1's ShardedTensor with
   FSDP's own _create_chunk_sharded_tensor. No collective runs: a fake process group of N
   ranks stands in (torch's testing FakeStore), so one process writes every rank's file;
3. torch.save writes it and zckpt converts it (`.zckpt`, or `.pt` with `fmt="pt"`).

FSDP1 specifics: its optimizer files hold each rank's FlatParameter shard as plain 1-D tensors
(optimizer.state_dict()); the merge places them by the FlatParameter layout the model files give
(src/merge/fsdp1_flat.h) and each new rank's shards are cut from the merged per-parameter state
as FSDP1 flattens and shards them (ceil(numel / N) elements, zero-padded). At N = 1 FSDP1 runs
NO_SHARD and saves plain tensors, so that is what is written. A world-size-1 FSDP1 checkpoint
(plain tensors only) is refused: nothing says which tensors are parameters.

Families without sharded tensors (extra_state: RNG states are per rank) are re-saved, new rank r
getting old rank r % W's state under its own name, and the report says so; a model or optim
family without sharded tensors is refused when the world size changes. Every family's way is
decided before anything is written. Every other file (huggingface/, fsdp_config.json with its
world_size updated) is copied.

Memory: the merge holds the largest tensor; writing rank r holds rank r's new shards (about
1/N of the family) plus the mapped merged container (page cache, not heap).
"""
import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import stat
import sys
import tempfile
import time

import torch

from . import _paths
from . import _core
from ._errors import CorruptError, UnsafeError, ZckptError
from ._api import load

RANK_FILE = re.compile(r"^(?P<family>.+)_world_size_(?P<world>[0-9]+)_rank_(?P<rank>[0-9]+)\.(?P<ext>zckpt|pt)$")


def _families(ckpt_dir):
    """family -> (old world size, {rank: path}); a rank's .zckpt preferred to its .pt."""
    out = {}
    for name in sorted(os.listdir(ckpt_dir)):
        m = RANK_FILE.match(name)
        if not m or not os.path.isfile(os.path.join(ckpt_dir, name)):
            continue
        family, world, rank = m["family"], int(m["world"]), int(m["rank"])
        w, files = out.setdefault(family, (world, {}))
        if w != world:
            raise ValueError(f"{ckpt_dir}: {family} files of world sizes {w} and {world} side by side")
        if rank not in files or name.endswith(".zckpt"):
            files[rank] = os.path.join(ckpt_dir, name)
    for family, (world, files) in out.items():
        missing = [r for r in range(world) if r not in files]
        if missing:
            raise ValueError(f"{ckpt_dir}: {family} is missing ranks {missing} of {world}")
    return out


class _FakeGroup:
    """A fake default process group of `world` ranks, as rank `rank`: DeviceMesh and
    ShardedTensor objects can be built and pickled for any rank without any collective."""

    def __init__(self, rank, world):
        self.rank, self.world = rank, world

    def __enter__(self):
        import torch.distributed as dist
        from torch.testing._internal.distributed.fake_pg import FakeStore

        if dist.is_initialized():
            raise RuntimeError("reshard runs outside any process group (one process writes every rank)")
        dist.init_process_group("fake", store=FakeStore(), rank=self.rank, world_size=self.world)
        return self

    def __exit__(self, *exc):
        import torch.distributed as dist

        dist.destroy_process_group()


def _load_template(path, tmp):
    """Rank 0's file as torch objects. A .pt is converted first, so zckpt's interpreter has read
    (and vetted) its pickle before torch's unpickler sees it; torch's weights-only unpickler is
    tried first (it knows DTensor), the full one only for what it refuses (ShardedTensor)."""
    import pickle

    import torch.distributed.tensor  # noqa: F401  (weights_only=True loads DTensors once imported)

    if not path.endswith(".zckpt"):
        converted = os.path.join(tmp, "template.zckpt")
        _core.convert(path, converted, 0, 0, 0)
        path = converted
    try:
        return load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        return load(path, map_location="cpu", weights_only=False)


def _walk(obj, path, fn):
    """obj with fn(leaf, name) applied to every DTensor/ShardedTensor leaf; names as zckpt's
    converter gives them (keys and indices joined with '.')."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.tensor import DTensor

    if isinstance(obj, (DTensor, ShardedTensor)):
        return fn(obj, path)
    join = (lambda k: f"{path}.{k}") if path else str
    if isinstance(obj, dict):
        out = type(obj)((k, _walk(v, join(k), fn)) for k, v in obj.items())
        if hasattr(obj, "_metadata"):
            out._metadata = obj._metadata  # an nn.Module state dict's version info
        return out
    if isinstance(obj, list):
        return [_walk(v, join(i), fn) for i, v in enumerate(obj)]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_walk(v, join(i), fn) for i, v in enumerate(obj))
    return obj


def _has_sharded(obj):
    found = []
    _walk(obj, "", lambda leaf, name: found.append(name) or leaf)
    return bool(found)


def _reshard_dtensor(leaf, full, rank, world, meshes):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    mesh = leaf.device_mesh
    if mesh.ndim != 1:
        raise NotImplementedError(f"a DTensor on a {mesh.ndim}-d mesh: only 1-d meshes (FSDP) are resharded")
    for p in leaf.placements:
        if type(p) not in (Shard, Replicate):
            raise NotImplementedError(f"placement {p}: only Shard and Replicate are resharded")
    key = (mesh.device_type, mesh.mesh_dim_names)
    if key not in meshes:  # one mesh per rank file, shared by its DTensors as in a real save
        # With its process groups, as a save at this world size pickles it: the (fake) default
        # group's name, which the resumed run resolves to its own default group. Without them the
        # resumed DTensors have no '_dim_group_names' and nothing can gather them
        # (get_optimizer_state_dict(full_state_dict=True), full_tensor()).
        meshes[key] = DeviceMesh(mesh.device_type, torch.arange(world), mesh_dim_names=mesh.mesh_dim_names)
    new_mesh = meshes[key]
    shape, offset = compute_local_shape_and_global_offset(full.shape, new_mesh, leaf.placements)
    local = full[tuple(slice(o, o + s) for o, s in zip(offset, shape))].clone()
    out = DTensor.from_local(local, new_mesh, leaf.placements, run_check=False, shape=full.shape, stride=full.stride())
    if isinstance(leaf, torch.nn.Parameter):
        out = torch.nn.Parameter(out, requires_grad=leaf.requires_grad)
    return out


def _reshard_sharded_tensor(leaf, full, rank, world):
    import torch.distributed as dist
    from torch.distributed.fsdp._shard_utils import _create_chunk_sharded_tensor

    if world == 1:
        # FSDP1 at world size 1 runs NO_SHARD, whose SHARDED_STATE_DICT holds plain full tensors
        # (what verl saves at one rank); a ShardedTensor there fails load_state_dict.
        return full.clone()
    shards = leaf.metadata().shards_metadata
    dims = {d for m in shards for d, o in enumerate(m.shard_offsets) if o != 0}
    if dims - {0}:
        raise NotImplementedError("a ShardedTensor not split along dim 0: only FSDP's chunk sharding is resharded")
    device = shards[0].placement.device() if shards else torch.device("cpu")
    per_node = max((m.placement.device().index or 0) + 1 for m in shards) if shards else 1
    return _create_chunk_sharded_tensor(full, rank, world, per_node, dist.group.WORLD, device=torch.device(device.type))


def _fsdp1_layout(ckpt_dir, family):
    """The FlatParameter layout of a family of FSDP1 flat optimizer files (src/merge/fsdp1_flat.h),
    or None when the family is not one. Raises (naming the files) when it is one whose layout the
    files do not give."""
    text = _core.fsdp1_layout(ckpt_dir, family)
    return json.loads(text) if text else None


def _flat_shard(flat, key, full, rank, world, dtype):
    """Rank `rank`'s shard of entry `key` (exp_avg, ...) of one FlatParameter at `world` ranks, as
    FSDP1 holds it (FlatParamHandle._get_shard): the unit's parameters flattened in order,
    elements [rank*S, rank*S + S) with S = ceil(numel / world), zero-padded past the end."""
    numel = flat["numel"]
    size = -(-numel // world)
    out = torch.zeros(size, dtype=dtype)
    lo, hi = rank * size, min((rank + 1) * size, numel)
    for p in flat["params"]:
        a, b = max(lo, p["offset"]), min(hi, p["offset"] + p["numel"])
        if a < b:
            src = full[f"state.{p['fqn']}.{key}"].reshape(-1)
            out[a - lo:b - lo] = src[a - p["offset"]:b - p["offset"]]
    return out


def _reshard_flat_optim(template, layout, full, rank, world, family):
    """Rank `rank`'s optimizer.state_dict() of FSDP1 at `world` ranks: rank 0's file with each
    FlatParameter's 1-D entries rebuilt from the merged per-parameter state; 0-d entries (step)
    are rank 0's (the merge checked every rank holds the same)."""
    state = template.get("state") if isinstance(template, dict) else None
    if not isinstance(state, dict) or len(state) != len(layout["flat_params"]):
        raise ValueError(f"{family}: rank 0's file holds state for {len(state or {})} parameters, the layout "
                         f"{len(layout['flat_params'])} FlatParameters")
    new_state = {}
    for i, (index, entries) in enumerate(sorted(state.items())):
        flat = layout["flat_params"][i]
        entries = dict(entries)
        for key in flat["flat_keys"]:
            entries[key] = _flat_shard(flat, key, full, rank, world, entries[key].dtype)
        new_state[index] = entries
    out = dict(template)
    out["state"] = new_state
    return out


def _tensor_names(obj, path=""):
    if isinstance(obj, torch.Tensor):
        return [path]
    join = (lambda k: f"{path}.{k}") if path else str
    if isinstance(obj, dict):
        return [n for k, v in obj.items() for n in _tensor_names(v, join(k))]
    if isinstance(obj, (list, tuple)):
        return [n for i, v in enumerate(obj) for n in _tensor_names(v, join(i))]
    return []


def _plan(ckpt_dir, family, old_world, files, world_size, tmp):
    """(how, rank 0's state, FSDP1 layout) for one family: "sharded" (DTensor / ShardedTensor
    leaves rebuilt), "flat" (FSDP1 flat optimizer state re-flattened), "copy" (per-rank state).
    Raises for a family a copy would get wrong."""
    with _FakeGroup(0, old_world):
        template = _load_template(files[0], tmp)
    if _has_sharded(template):
        return "sharded", template, None
    flat = _fsdp1_layout(ckpt_dir, family)
    if flat is not None:
        return "flat", template, flat
    tensors = _tensor_names(template)
    if world_size != old_world and family in ("model", "optim") and tensors:
        # A copy of rank r % W would be silently wrong (other shapes, or another rank's moments).
        raise NotImplementedError(
            f"{files[0]}: {family} files without sharded tensors ({len(tensors)} plain tensors, e.g. '{tensors[0]}'): "
            "a world-size-1 FSDP1 checkpoint (NO_SHARD) does not say which tensors are parameters or how they were "
            "flattened, so it cannot be resharded; resave it with FULL_STATE_DICT, or reshard a save of more ranks")
    return "copy", template, None


def reshard(ckpt_dir, world_size, out, *, fmt="zckpt", log=print, overwrite=True):
    """Writes `ckpt_dir`'s verl per-rank files resharded for `world_size` ranks into `out`.
    overwrite=False: FileExistsError, before anything is written, when a file it would write
    exists."""
    if world_size < 1:
        raise ValueError("world_size must be >= 1")
    _refuse_object_folders(ckpt_dir, out)
    families = _families(ckpt_dir)
    if not families:
        raise ValueError(f"{ckpt_dir}: no verl per-rank files (NAME_world_size_W_rank_R.zckpt or .pt)")
    if not overwrite:
        existing = _existing_outputs(ckpt_dir, out, families, world_size)
        if existing:
            raise FileExistsError(f"{len(existing)} output{'s exist' if len(existing) > 1 else ' exists'} "
                                  f"({existing[0]}{', ...' if len(existing) > 1 else ''}); nothing was written "
                                  "(--force overwrites)")
    os.makedirs(out, exist_ok=True)
    rank_files = set()
    with _workdir(out) as tmp:
        # Every family's way is decided (and a family that cannot be resharded refused) before
        # anything is written.
        plans = []
        for family, (old_world, files) in families.items():
            rank_files.update(os.path.basename(p) for p in files.values())
            plans.append((family, old_world, files) + _plan(ckpt_dir, family, old_world, files, world_size, tmp))
        for family, old_world, files, how, template, flat in plans:
            if how == "copy":
                for r in range(world_size):
                    # Re-saved rather than copied: torch.save records the file's own name inside
                    # (a copy would read as a renamed rank file to merge and load_into).
                    src = files[r % old_world]
                    state = template if r % old_world == 0 else _load_template(src, tmp)
                    _write_rank(state, tmp, out, family, world_size, r, fmt)
                log(f"{family}: no sharded tensors (per-rank state): new rank r is old rank r % {old_world}'s")
                continue
            merged = os.path.join(tmp, f"{family}.zckpt")
            stats = _core.merge(ckpt_dir, merged, family, "")
            full = load(merged, mmap=True)
            if how == "flat":
                for r in range(world_size):
                    _write_rank(_reshard_flat_optim(template, flat, full, r, world_size, family), tmp, out, family,
                                world_size, r, fmt)
                del full
                log(f"{family}: FSDP1 flat optimizer state, {old_world} -> {world_size} ranks "
                    f"({len(flat['flat_params'])} FlatParameters, {stats['tensors']} tensors, {stats['bytes']} bytes)")
                continue
            for r in range(world_size):
                with _FakeGroup(r, world_size):
                    meshes = {}

                    def rebuild(leaf, name):
                        if name not in full:
                            raise KeyError(f"{family}: the merged tensors have no '{name}'")
                        t = full[name]
                        if tuple(t.shape) != tuple(leaf.shape):
                            raise ValueError(f"{family}: '{name}' is {tuple(leaf.shape)} in rank 0's file, "
                                             f"{tuple(t.shape)} merged")
                        if hasattr(leaf, "device_mesh"):
                            return _reshard_dtensor(leaf, t, r, world_size, meshes)
                        return _reshard_sharded_tensor(leaf, t, r, world_size)

                    state = _walk(template, "", rebuild)
                    _write_rank(state, tmp, out, family, world_size, r, fmt)
                    del state
            del full
            log(f"{family}: {old_world} -> {world_size} ranks ({stats['tensors']} tensors, {stats['bytes']} bytes, "
                f"largest {stats['largest_tensor']})")
    _copy_rest(ckpt_dir, out, rank_files, world_size)


def _refuse_object_folders(ckpt_dir, out):
    """reshard reads and writes local folders only: its merge and FSDP1 layout (C++) take a local
    folder, .pt rank files are converted through local files, and the outputs appear by local
    rename beside a locked work folder in `out`. An s3:// folder is refused by name, before
    anything is read or written, rather than taken as a relative local path."""
    if _paths.is_url(os.fspath(ckpt_dir)):
        raise ValueError(f"{ckpt_dir}: reshard reads a local checkpoint folder, not an object folder (its merge and "
                         "the conversion of .pt rank files read local files): copy the folder here first "
                         "(e.g. `aws s3 cp --recursive`)")
    if _paths.is_url(os.fspath(out)):
        raise ValueError(f"{out}: reshard writes a local folder, not an object folder (each rank file is written "
                         "beside a locked work folder and renamed into place): reshard into a local folder, then "
                         "upload it")


def _write_rank(state, tmp, out, family, world_size, rank, fmt):
    """torch.save of one new rank's state, kept as .pt or converted to .zckpt."""
    name = f"{family}_world_size_{world_size}_rank_{rank}"
    pt = os.path.join(tmp, name + ".pt")
    _torch_save(state, pt)
    if fmt == "pt":
        _replace_regular(pt, os.path.join(out, name + ".pt"))
    else:
        _core.convert(pt, os.path.join(out, name + ".zckpt"), 0, 0, 0)
        os.unlink(pt)


def _torch_save(state, path):
    """torch.save to `path` through a file of ours: a write that fails (a full disk) is an OSError
    naming the path and the cause, where torch's own file writer says only 'iostream error'."""
    try:
        with open(path, "wb") as f:
            torch.save(state, f)
    except OSError as e:
        raise OSError(e.errno, e.strerror, path) from None
    except RuntimeError as e:
        cause = e.__cause__ or e.__context__
        if isinstance(cause, OSError):
            raise OSError(cause.errno, cause.strerror, path) from None
        raise


WORKDIR_PREFIX = ".zckpt-reshard-"
STALE_SECONDS = _core.format_constants()["stale_temp_seconds"]  # common/stale_temps.h's rule


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _remove_stale_workdirs(out):
    """Removes the work folders of dead reshards in `out` (the rule of common/stale_temps.h: nobody
    holds the folder's flock, and its pid is dead or it is old), so a reshard killed with SIGKILL
    leaves nothing once the next one starts. Best effort."""
    for name in os.listdir(out):
        m = re.fullmatch(re.escape(WORKDIR_PREFIX) + r"(\d+)-\w+", name)
        if not m:
            continue
        path = os.path.join(out, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if not _alive(int(m.group(1))) or time.time() - os.fstat(fd).st_mtime >= STALE_SECONDS:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass  # locked: its reshard is alive
        finally:
            os.close(fd)


@contextlib.contextmanager
def _workdir(out):
    """A folder in `out` for the intermediates (the merged container, each new rank's .pt), named
    with this process's pid and locked for its whole life: removed on the way out, and by the next
    reshard into `out` when this one is killed."""
    _remove_stale_workdirs(out)
    tmp = tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-", dir=out)
    fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        os.close(fd)


def _rest(ckpt_dir, out, rank_files):
    """(source, destination, top) of every file copied beside the rank files; top: directly in
    `ckpt_dir`."""
    for root, dirs, names in os.walk(ckpt_dir):
        rel = os.path.relpath(root, ckpt_dir)
        dirs[:] = [d for d in dirs if not d.startswith(WORKDIR_PREFIX)]
        for name in names:
            if rel == "." and (name in rank_files or RANK_FILE.match(name)):
                continue
            yield os.path.join(root, name), os.path.normpath(os.path.join(out, rel, name)), rel == "."


def _existing_outputs(ckpt_dir, out, families, world_size):
    """The files a reshard into `out` would write that exist already (a rank file under either
    extension: which one a family gets is known only once its files are read)."""
    rank_files = {os.path.basename(p) for _, files in families.values() for p in files.values()}
    planned = [os.path.join(out, f"{family}_world_size_{world_size}_rank_{r}.{ext}")
               for family in families for r in range(world_size) for ext in ("zckpt", "pt")]
    planned += [dst for _, dst, _ in _rest(ckpt_dir, out, rank_files)]
    return [p for p in planned if os.path.lexists(p)]


def _copy_rest(ckpt_dir, out, rank_files, world_size):
    for src, dst, top in _rest(ckpt_dir, out, rank_files):
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        # Through the C++ readers' and writers' rules: a FIFO or device among the files is refused
        # (never read, never blocks), and each output appears whole, replacing a regular file only.
        if top and os.path.basename(src) == "fsdp_config.json":
            config = json.loads(_core.read_regular_file(src))
            if isinstance(config, dict) and "world_size" in config:
                config["world_size"] = world_size
            _core.write_file_atomically(dst, json.dumps(config, indent=4).encode())
            continue
        _core.copy_file_atomically(src, dst)


def _replace_regular(src, dst):
    """os.replace(src, dst) unless dst exists as anything but a regular file (a FIFO, device,
    folder or symbolic link is refused and left alone, as AtomicFile does)."""
    try:
        st = os.lstat(dst)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ZckptError(f"{dst}: exists and is not a regular file; refusing to replace it")
    os.replace(src, dst)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="zckpt reshard", description=__doc__.split("\n\n")[0],
        epilog="FSDP2 (DTensor) and FSDP1 (ShardedTensor model files, FlatParameter optimizer shards placed by the "
               "model files) checkpoints of 2+ ranks; at --world-size 1 FSDP1 files are written as FSDP1 saves them "
               "there (plain tensors). Refused, before anything is written: a world-size-1 FSDP1 checkpoint, optimizer "
               "shards no FSDP1 wrapping of the model's parameters explains, 2-d meshes, placements other than Shard "
               "and Replicate. Exit codes: 0 written, 1 a file is corrupt or unsafe, 2 could not run or refused.")
    parser.add_argument("ckpt_dir")
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--format", choices=["zckpt", "pt"], default="zckpt",
                        help="write .zckpt containers (default) or torch.save .pt files")
    parser.add_argument("-f", "--force", action="store_true",
                        help="overwrite outputs that exist (default: refuse, exit 2, before anything is written)")
    args = parser.parse_args(argv)
    if os.path.abspath(args.output) == os.path.abspath(args.ckpt_dir):
        parser.error("the output folder is the checkpoint folder")
    try:
        reshard(args.ckpt_dir, args.world_size, args.output, fmt=args.format, overwrite=args.force)
    except ZckptError as e:
        print(f"zckpt reshard: {e}", file=sys.stderr)
        return 1 if isinstance(e, (CorruptError, UnsafeError)) else 2
    except (ValueError, KeyError, NotImplementedError, OSError) as e:
        print(f"zckpt reshard: {e}", file=sys.stderr)
        return 2
    return 0
