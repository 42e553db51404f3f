"""The public functions of the zckpt package (see __init__.py)."""
import os
import pickle

import torch

from . import _C
from ._restore import unpickle
from ._sharded import FLAG_SHARDED, process_rank
from ._fsdp import fsdp1_modules, load_into_fsdp1
from ._targets import optimizer_tensors, resolve

ZckptError = _C.ZckptError
CorruptError = _C.CorruptError
UnsafeError = _C.UnsafeError
OutOfMemoryError = _C.OutOfMemoryError  # also a torch.OutOfMemoryError


def _path(f):
    if isinstance(f, (str, os.PathLike)):
        return os.fspath(f)
    raise TypeError(f"zckpt works on paths, not {type(f).__name__}")


def _global_name(g):
    """'module.name' of an allow_globals entry: the string itself, or a class/function's own."""
    if isinstance(g, str):
        return g
    module, name = getattr(g, "__module__", None), getattr(g, "__qualname__", None)
    if not module or not name:
        raise TypeError(f"allow_globals takes 'module.name' strings, classes and functions, not {g!r}")
    return f"{module}.{name}"


def _ring(threads, slots, slot_bytes):
    """The loader's ring from load's and load_into's keyword arguments (the names of `zckpt load
    --threads --slots --slot-bytes`): None or 0 leaves the library's default (LoadOptions in
    zckpt/load_options.h says what each resolves to)."""
    values = {"threads": threads, "slots": slots, "slot_bytes": slot_bytes}
    for name, v in values.items():
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ValueError(f"{name} must be a positive integer (or None for the default), not {v!r}")
    return _C.Ring(**{k: v or None for k, v in values.items()})


def _allowed(allow_globals, weights_only=False):
    """The globals ('module.name') a pickle may name besides zckpt's allowlist: what the caller
    lists and, for a weights-only load, what the caller registered with torch as safe globals
    (torch.serialization.add_safe_globals / safe_globals)."""
    if isinstance(allow_globals, (str, bytes)):
        raise TypeError("allow_globals takes a list of names, not one string")
    names = [_global_name(g) for g in allow_globals]
    if weights_only:
        for g in torch.serialization.get_safe_globals():
            if isinstance(g, tuple):  # (obj, "module.name")
                names.append(g[1])
            else:
                names.append(_global_name(g))
    return names


class _CallerError(Exception):
    """An exception raised by the caller's own map_location, carried through the unpickler."""

    def __init__(self, original):
        super().__init__(str(original))
        self.original = original


def _holds_sharded_tensors(ckpt):
    """Whether an open checkpoint's index records a ShardedTensor's local shard (the index and
    the vetted pickle agree on it: a ShardedTensor the pickle rebuilds)."""
    return any(r["flags"] & FLAG_SHARDED for r in ckpt.tensor_records())


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
                             "`zckpt merge` / zckpt._C.load_tree") from e
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

    Errors: ZckptError and its subclasses, each naming the file: UnsafeError (a refused
    global), CorruptError (damaged, inconsistent or malformed file); pickle.UnpicklingError
    when weights_only=True refuses what torch.load(weights_only=True) refuses.
    """
    path = _path(f)
    ring = _ring(threads, slots, slot_bytes)
    # One open file for everything below: a checkpoint renamed over `path` meanwhile (a trainer
    # publishing `latest`) cannot give this file's pickle with that one's storages.
    ckpt = _C.open(path)
    info = ckpt.describe()
    legacy = info["metadata"].get("zckpt.source.format") == "legacy"
    pickle_bytes = ckpt.vetted_pickle(_allowed(allow_globals, weights_only))
    locations = {s["key"]: s["location"] for s in info["storages"]}
    where = _MapLocation(map_location)

    if mmap:
        where.require_cpu()
        raw = ckpt.map_storages(verify, ring.threads)
    else:
        devices, meta = {}, set()
        for key, location in locations.items():
            dev = where.device(location)
            if dev.type == "meta":
                # torch.load(map_location="meta") reads no tensor bytes: storages of the saved size
                # on the meta device (transformers' from_pretrained asks for this).
                meta.add(key)
                continue
            devices[key] = str(dev)
        raw = ckpt.load_storages(devices, verify, ring)
        sizes = {s["key"]: s["bytes"] for s in info["storages"]}
        for key in meta:
            raw[key] = torch.empty(sizes[key], dtype=torch.uint8, device="meta")

    restored = {}  # key -> storage handed out: each storage is restored (and mapped) once

    def storage_for_key(key, location, dtype):
        if key in restored:
            return restored[key]
        if key not in raw:
            raise CorruptError(f"{path}: the pickle names storage '{key}', which the container does not hold")
        untyped = where.apply(raw[key].untyped_storage(), location)
        restored[key] = untyped
        return untyped

    return _replay(path, pickle_bytes, storage_for_key, weights_only, legacy, ckpt)


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
    ring = _ring(threads, slots, slot_bytes)
    if isinstance(target, torch.nn.Module) and fsdp1_modules(target):
        return load_into_fsdp1(path, target, strict, verify, weights_only, allowed, ring)
    entries = _named_tensors(target)  # a target of the wrong type is refused before the file is opened
    # One open file for the records, the param_groups and the tensors (as load).
    ckpt = _C.open(path)
    named = resolve(path, target, entries, ckpt)
    saved_groups = None
    if isinstance(target, torch.optim.Optimizer):
        # Checked before any tensor is touched, as optimizer.load_state_dict does.
        saved_groups = _saved_param_groups(ckpt, target, weights_only, allowed)
    with torch.no_grad():
        missing, unexpected = ckpt.load_into(named, strict, verify, allowed, ring)
    if saved_groups is not None:
        _restore_param_groups(target, saved_groups)
    return missing, unexpected


def convert(src, dst=None, *, chunk_bytes=0, zstd_level=0, threads=0, allow_globals=()):
    """Converts a torch.save file to a container (no Python code from the file runs): its
    pickle's globals must be on zckpt's allowlist of data globals or in allow_globals
    ('module.name' strings or the classes themselves); UnsafeError otherwise.
    Returns a dict of statistics."""
    src = _path(src)
    return _C.convert(src, _path(dst) if dst is not None else "", chunk_bytes, zstd_level, threads,
                      _allowed(allow_globals))


def export(src, dst, *, format=None, allow_globals=()):
    """Writes a container back as a .pt file that torch.load reads (format="pt"), or as a
    .safetensors file (format="safetensors"; the default when dst ends in .safetensors). The
    object pickle (every pickle torch.load will read) is vetted first (allowlist plus
    allow_globals, checked against the index), and the archive is checked complete and safe to
    unpack."""
    dst = _path(dst)
    if format is None:
        format = "safetensors" if dst.endswith(".safetensors") else "pt"
    _C.export(_path(src), dst, format, _allowed(allow_globals))


def verify(path, *, threads=None, raise_on_error=True):
    """Checks every byte of a container, and that its kept pickle is readable, names no
    code-running global and describes the same tensors as its index, on `threads` checking
    threads per file (None or 0: all cores, as `zckpt verify --threads`). Returns the list of
    problems (messages; empty when good); with raise_on_error, raises CorruptError listing them
    instead. That CorruptError's `problems` holds each one as a dict: "kind" ("corrupt" or
    "unsafe"), "message", and where it lies, "file", "storage", "tensors" (a list), "chunk",
    "file_bytes" and "storage_bytes" ((begin, end) byte ranges), None for what it is not about;
    its own attributes of those names are the first problem's (as every ZckptError's are its
    own). A file that could not be checked at all (missing, unreadable, not a container,
    unsupported) raises its ZckptError, where `zckpt verify` exits 2."""
    found = _C.verify(_path(path), _ring(threads, None, None).threads)
    problems = [p["message"] for p in found]
    if problems and raise_on_error:
        error = CorruptError("\n".join(problems))
        error.problems = found
        for field, value in found[0].items():
            if field not in ("kind", "message"):
                setattr(error, field, value)
        raise error
    return problems
