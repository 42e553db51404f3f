"""The public functions of the zckpt package that need torch (see __init__.py)."""
import pickle

import torch

from . import _core, _records
from ._arg_checks import allowed_globals as _allowed
from ._arg_checks import path_of as _path
from ._arg_checks import ring_sizes
from ._errors import CorruptError, ZckptError
from ._host import frombuffer, host_bytes
from ._into import load_into_targets
from ._oom import OutOfMemoryError  # noqa: F401 - zckpt.OutOfMemoryError
from ._load_ranges import device_bytes, device_index, load_ranges
from ._unpickle import unpickle
from ._sharded import process_rank
from ._fsdp import fsdp1_modules, load_into_fsdp1
from ._live_targets import optimizer_tensors, resolve


class _CallerError(Exception):
    """An exception raised by the caller's own map_location, carried through the unpickler."""

    def __init__(self, original):
        super().__init__(str(original))
        self.original = original


def _holds_sharded_tensors(ckpt):
    """Whether an open checkpoint's index records a ShardedTensor's local shard (the index and
    the vetted pickle agree on it: a ShardedTensor the pickle rebuilds)."""
    return any(r.sharded for r in _records.of_checkpoint(ckpt))


def _replay(path, pickle_bytes, storage_for_key, weights_only, legacy, ckpt):
    """torch's unpickler over the (already vetted) pickle of the open checkpoint `ckpt`. Its
    failures become CorruptError naming the file, except a weights-only refusal, which stays
    torch's pickle.UnpicklingError as torch.load raises it, errors of the caller's own
    map_location, and a file holding ShardedTensors replayed outside a process group."""
    try:
        return unpickle(pickle_bytes, storage_for_key, weights_only, legacy)
    except _CallerError as e:
        raise e.original
    except pickle.UnpicklingError:
        if weights_only:
            raise
        raise CorruptError(f"{path}: the object pickle could not be replayed by torch's unpickler") from None
    except (ZckptError, MemoryError):
        raise
    except RuntimeError as e:
        if process_rank() is None and _holds_sharded_tensors(ckpt):
            # torch rebuilds a ShardedTensor only inside a process group: the environment, not
            # the file, is what is missing.
            raise ZckptError(f"{path}: the file is intact, but it holds ShardedTensors (FSDP1's SHARDED_STATE_DICT), "
                             "which torch unpickles only inside a process group: call "
                             "torch.distributed.init_process_group first, or read its tensors torch-free with "
                             "`zckpt merge`") from e
        raise CorruptError(f"{path}: the object pickle could not be replayed by torch's unpickler: "
                           f"{type(e).__name__}: {e}") from e
    except Exception as e:  # AssertionError, EOFError, UnicodeDecodeError, KeyError, ...
        raise CorruptError(f"{path}: the object pickle could not be replayed by torch's unpickler: "
                           f"{type(e).__name__}: {e}") from e


class _MapLocation:
    """load's map_location, as torch.load takes it, resolved in one place: the device each
    storage is loaded onto (`device`), and what a callable map_location makes of it once loaded
    (`apply`)."""

    def __init__(self, map_location):
        self._map = map_location

    def _is_callable(self):
        return callable(self._map) and not isinstance(self._map, (str, torch.device, dict))

    def require_cpu(self):
        """mmap=True gives CPU tensors: ValueError unless map_location is None or 'cpu'."""
        if self._map not in (None, "cpu", torch.device("cpu")):
            raise ValueError("mmap=True gives CPU tensors; map_location must be None or 'cpu'")

    def device(self, location):
        """Where a storage saved at `location` is loaded: the CPU for a callable, which gets it
        then (apply)."""
        m = self._map
        if m is None:
            return torch.device(location)
        if isinstance(m, (str, torch.device)):
            return torch.device(m)
        if isinstance(m, dict):
            return torch.device(m.get(location, location))
        if self._is_callable():
            return torch.device("cpu")
        raise TypeError(f"map_location must be None, a str, a torch.device, a dict or a callable, not {m!r}")

    def apply(self, untyped, location):
        """The loaded storage as a callable map_location returns it (its errors are the caller's,
        carried as _CallerError); unchanged for any other map_location, or when it returns None."""
        if not self._is_callable():
            return untyped
        try:
            moved = self._map(untyped, location)
        except Exception as e:  # the caller's own error, not the file's
            raise _CallerError(e) from e
        if moved is None:
            return untyped
        return moved if isinstance(moved, torch.UntypedStorage) else moved.untyped_storage()


def load(f, map_location=None, weights_only=True, mmap=False, *, verify=True, allow_globals=(), threads=None,
         slots=None, slot_bytes=None):
    """Returns what torch.load returns for the original .pt file.

    Storages stream from the container onto their device (map_location as torch.load accepts
    it), each chunk's checksum checked unless verify=False. threads: threads reading and
    checking chunks (default half the hardware threads, 2 to 8, and from s3:// at least
    8, each handing its reads to the request pool that keeps up to ZCKPT_S3_CONNECTIONS, 64, GETs
    in flight; with mmap=True, the threads hashing the mapping); slots and
    slot_bytes: the ring of host buffers they fill (default max(4, threads + 2) slots of
    max(chunk size, 8 MiB)), as `zckpt load --threads --slots --slot-bytes`. The ring is the host memory a load takes beyond its CPU destinations, and on
    a CUDA target the device memory beyond the tensors.

    Nothing from the file runs before zckpt has vetted it: the kept pickle is first read by
    zckpt's own interpreter, which refuses (UnsafeError, naming the global and its offset) any
    global off its allowlist of data globals unless listed in allow_globals ('module.name'
    strings, or the classes themselves) or, with weights_only=True, registered with torch as a
    safe global; globals that could run code are refused whatever is listed. It must also
    describe the same storages and tensors as the container's index (CorruptError otherwise).
    Only then is it replayed through torch's unpickler (weights_only keeps torch's meaning).

    mmap=True gives CPU tensors that alias the file's page cache (copy-on-write), as
    torch.load(mmap=True) does. With verify=True (the default) every chunk is checked first,
    hashed where it lies in the mapping (no copy): a flipped bit raises CorruptError before
    anything is returned, a file truncated while it is checked raises ZckptError naming it, and
    the pages the tensors alias are the ones that were hashed, so reading them afterwards costs
    no page fault. verify=False reads nothing up front and checks nothing. As with
    torch.load(mmap=True), the views show the file as it is when their pages are read: another
    process rewriting it later changes them, and touching a view after another process truncated
    the file raises SIGBUS (the process dies unless it handles the signal). Without mmap, a file
    truncated or rewritten by another process during the load ends in ZckptError naming the
    file, never a crash.

    CPU storages of 64 KiB and more are 4 KiB-aligned host memory of zckpt's (so bytes not in the
    page cache are read straight into them, O_DIRECT): they cannot be resized (`resize_` raises),
    where torch.load's can; views, sharing, share_memory_ and saving work as with torch's.

    Errors: ZckptError and its subclasses, each naming the file: UnsafeError (a refused
    global), CorruptError (damaged, inconsistent or malformed file); pickle.UnpicklingError
    when weights_only=True refuses what torch.load(weights_only=True) refuses.
    """
    path = _path(f)
    sizes = ring_sizes(threads, slots, slot_bytes)
    where = _MapLocation(map_location)
    if mmap:
        where.require_cpu()
    allowed = _allowed(allow_globals, weights_only)
    # One open file for everything below: a checkpoint renamed over `path` meanwhile (a trainer
    # publishing `latest`) cannot give this file's pickle with that one's storages.
    ckpt = _core.open(path)
    info = ckpt.describe()
    devices = {s["key"]: where.device(s["location"]) for s in info["storages"]}
    return _load_storages(path, ckpt, info, devices, where, weights_only, allowed, verify, sizes, mmap)


def _replay_storages(path, ckpt, pickle_bytes, raw, where, weights_only, legacy):
    """The vetted pickle replayed over the loaded storages (`raw`: key -> uint8 tensor), each
    storage handed out (and given to a callable map_location) once."""
    restored = {}

    def storage_for_key(key, location, dtype):
        if key in restored:
            return restored[key]
        if key not in raw:
            raise CorruptError(f"{path}: the pickle names storage '{key}', which the container does not hold")
        untyped = where.apply(raw[key].untyped_storage(), location)
        restored[key] = untyped
        return untyped

    return _replay(path, pickle_bytes, storage_for_key, weights_only, legacy, ckpt)


def _load_storages(path, ckpt, info, devices, where, weights_only, allowed, verify, sizes, mmap):
    """load() on the torch-free core: each storage allocated here on its device (or the file
    mapped), filled by one streaming pass, then torch's unpickler replays the vetted pickle over
    them."""
    legacy = info["metadata"].get("zckpt.source.format") == "legacy"
    pickle_bytes = ckpt.vetted_pickle(allowed)
    if mmap:
        keys = [s["key"] for s in info["storages"]]
        raw = {key: frombuffer(b) for key, b in ckpt.map_storages(keys, verify, sizes["threads"]).items()}
        return _replay_storages(path, ckpt, pickle_bytes, raw, where, weights_only, legacy)
    for key, device in devices.items():  # every device checked before anything is allocated
        if device.type != "meta":
            device_index(device)
    raw, ranges = {}, []
    for index, s in enumerate(info["storages"]):
        key, n, device = s["key"], s["bytes"], devices[s["key"]]
        if device.type == "meta":
            # torch.load(map_location="meta") reads no tensor bytes: storages of the saved size on
            # the meta device (transformers' from_pretrained asks for this).
            raw[key] = torch.empty(n, dtype=torch.uint8, device="meta")
            continue
        if device.type == "cuda":
            raw[key], address = device_bytes(path, n, device, f"storage '{key}'")
        else:
            try:
                raw[key], address = host_bytes(n)
            except (MemoryError, RuntimeError) as e:
                raise OutOfMemoryError(f"{path}: cannot allocate {n} bytes of host memory for storage '{key}': {e}") from e
        ranges.append((index, 0, n, address, device_index(device)))
    load_ranges(ckpt, ranges, verify, **sizes)
    return _replay_storages(path, ckpt, pickle_bytes, raw, where, weights_only, legacy)


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


def _saved_param_groups(ckpt, optimizer, weights_only, allowed):
    """The saved param_groups (lr, betas, ...), checked against the optimizer's groups.

    The kept pickle is vetted by zckpt's interpreter, then replayed with every storage on the
    meta device: no tensor memory at all, and through torch's weights-only unpickler unless the
    caller says otherwise, so nothing the file names runs."""
    path = ckpt.path
    pickle_bytes = ckpt.vetted_pickle(allowed)
    meta = _replay(path, pickle_bytes, lambda key, loc, dtype: torch.UntypedStorage(0, device="meta"),
                   weights_only, False, ckpt)
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


def load_into(f, target, strict=True, *, verify=True, weights_only=True, allow_globals=(), threads=None, slots=None,
              slot_bytes=None):
    """Copies the checkpoint's tensors into existing tensors, in place, on whatever device each
    lives on: every data_ptr() stays. dtype and shape are checked for every target before the
    first byte moves. strict=True refuses missing and unexpected names, as load_state_dict does.
    Returns (missing, unexpected) names. An optimizer must already hold its state tensors (after
    one step, or a previous load); its param_groups' hyper-parameters are restored too, read with
    torch's weights-only unpickler unless weights_only=False. The kept pickle is vetted and
    checked against the index first, as by load (allow_globals likewise).

    Only live tensors are written, never a copy: a module's targets must share memory with its own
    parameters and buffers (else ZckptError naming the file and the entry), an optimizer's are
    taken from optimizer.state. DTensor / ShardedTensor entries are written through their local
    shard after the file's record (global shape, placements/mesh, shard offsets and sizes) is
    checked against them; a verl-style file (..._world_size_W_rank_R) of another rank or world
    size is refused. FSDP1 modules (FullyShardedDataParallel) are written straight into each
    rank's FlatParameter shard (see _fsdp.py; call on every rank, as load_state_dict). Extra
    memory: the loader's ring (slots x slot_bytes, by default max(4, threads + 2) x
    max(chunk size, 8 MiB); threads, slots and slot_bytes as for load), host and device alike;
    an FSDP1 fallback to FSDP's load_state_dict (a needed rank file missing) costs model/W + the
    largest parameter."""
    path = _path(f)
    allowed = _allowed(allow_globals, weights_only)
    sizes = ring_sizes(threads, slots, slot_bytes)
    if isinstance(target, torch.nn.Module) and fsdp1_modules(target):
        return load_into_fsdp1(path, target, strict, verify, weights_only, allowed, sizes)
    entries = _named_tensors(target)  # a target of the wrong type is refused before the file is opened
    # One open file for the records, the param_groups and the tensors (as load).
    ckpt = _core.open(path)
    named = resolve(path, target, entries, ckpt)
    saved_groups = None
    if isinstance(target, torch.optim.Optimizer):
        # Checked before any tensor is touched, as optimizer.load_state_dict does.
        saved_groups = _saved_param_groups(ckpt, target, weights_only, allowed)
    missing, unexpected = load_into_targets(ckpt, named, strict, verify, allowed, sizes)
    if saved_groups is not None:
        _restore_param_groups(target, saved_groups)
    return missing, unexpected
