"""load_into of CPU and CUDA targets on the torch-free core: the checks of the C++ LoadInto
(names, dtype, shape, device, every target before the first byte moves), then one streaming pass
that reads each tensor's bytes straight into its memory, host or device (`_ranges.load_ranges`),
or, for a view torch cannot take byte for byte (strided or offset in its storage, conj/neg bits,
a non-contiguous target), into a host staging buffer that is then copy_()'d into it."""
import torch

from ._errors import ZckptError
from ._host import byte_batches
from ._ranges import load_ranges
from ._sharded import FLAG_INTERNAL

# Tensor record flags (include/zckpt/format.h; _sharded.py has those of sharded tensors).
_FLAG_CONJ = 1 << 2
_FLAG_NEG = 1 << 3
_FLAG_QUANTIZED = 1 << 6

# Staging buffers (views not written straight) are filled at most this many bytes per pass, so the
# host memory a load_into takes beyond its targets stays bounded however many such views there are.
_STAGED_BYTES_PER_PASS = 256 << 20


def dtype_name(dtype):
    """zckpt's name of a torch dtype: zckpt names dtypes as torch does (`torch.<name>`,
    include/zckpt/dtype.h), so the name is the mapping both ways (saved_dtype is the inverse)."""
    return str(dtype).removeprefix("torch.")


def target_problem(name, t):
    """Why `t` cannot be written in place at all, or ""."""
    if t.layout != torch.strided:
        return f"target '{name}' is not a dense (strided) tensor"
    if t.device.type not in ("cpu", "cuda"):
        return f"target '{name}' is on {t.device}: only cpu and cuda targets are supported"
    # Wrapper subclasses (DTensor) have no storage of their own: writing through their data_ptr()
    # would write to nothing. Their local tensor is the target.
    try:
        no_storage = t.numel() > 0 and t.data_ptr() == 0
    except (RuntimeError, NotImplementedError):
        no_storage = True
    if no_storage:
        return f"target '{name}' has no storage of its own (a tensor subclass such as DTensor: pass its local tensor)"
    return ""


def saved_dtype(rec):
    """The torch dtype of a tensor record, or None when this torch has none of that name."""
    saved = getattr(torch, rec["dtype"], None)
    return saved if isinstance(saved, torch.dtype) else None


def viewable_problem(rec, what):
    """Why a record cannot be rebuilt as a plain tensor here (its dtype unknown to this torch, or
    quantized: the quantizer lives in the pickle), or ""."""
    if saved_dtype(rec) is None:
        return f"{what}: dtype {rec['dtype']} is not available in torch {torch.__version__}"
    if rec["flags"] & _FLAG_QUANTIZED or rec["dtype"].startswith("q"):
        return f"{what} is quantized: not supported here (zckpt.load rebuilds it through the pickle)"
    return ""


def _mismatch(rec, name, t):
    """Why the record `rec` cannot go into `t`, or ""."""
    why = target_problem(name, t) or viewable_problem(rec, f"'{name}'")
    if why:
        return why
    if saved_dtype(rec) != t.dtype:
        return f"dtype mismatch for '{name}': the file has {rec['dtype']}, the target has {dtype_name(t.dtype)}"
    if tuple(rec["shape"]) != tuple(t.shape):
        return (f"size mismatch for '{name}': the file has shape {list(rec['shape'])}, "
                f"the target has shape {list(t.shape)}")
    return ""


def saved_contiguous(rec):
    """The record's bytes are its elements in order, with no conj/neg fix-up."""
    if rec["flags"] & (_FLAG_CONJ | _FLAG_NEG):
        return False
    expected = 1
    for size, stride in zip(reversed(rec["shape"]), reversed(rec["stride"])):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _quoted(names):
    return ", ".join(f'"{n}"' for n in names)


def _check(path, records, named, strict):
    """(matched (tensor, record) pairs, missing, unexpected); ZckptError listing every problem
    when any target cannot take its record, or (strict) names do not match."""
    by_name = {}
    for r in records:
        by_name.setdefault(r["name"], r)
    matched, missing, problems, wanted = [], [], [], set()
    for name, t in named:
        rec = by_name.get(name)
        if rec is None:
            missing.append(name)
            continue
        wanted.add(name)
        why = _mismatch(rec, name, t)
        if why:
            problems.append(why)
        matched.append((t, rec))
    # Internal tensors (a DTensor's DeviceMesh) are not state entries: never "unexpected".
    unexpected = [r["name"] for r in records if r["name"] not in wanted and not r["flags"] & FLAG_INTERNAL]
    if strict and (missing or unexpected):
        keys = []
        if missing:
            keys.append(f"Missing key(s): {_quoted(missing)}")
        if unexpected:
            keys.append(f"Unexpected key(s): {_quoted(unexpected)}")
        problems.append("; ".join(keys))
    if problems:
        raise ZckptError(f"cannot load {path} into the given tensors:" + "".join(f"\n  {p}" for p in problems))
    return matched, missing, unexpected


def saved_view(buffer, rec, dtype, base):
    """The saved view rebuilt over `buffer`, a uint8 tensor holding the record's storage from its
    byte `base` on: a staging buffer of bytes byte_begin..byte_end (base byte_begin) or the whole
    storage (base 0). Conj/neg bits as torch set them."""
    item = torch.empty(0, dtype=dtype).element_size()
    offset = rec["storage_offset"] - base // item
    view = torch.as_strided(buffer.view(dtype), rec["shape"], rec["stride"], offset)
    if rec["flags"] & _FLAG_CONJ:
        view = view._conj()
    if rec["flags"] & _FLAG_NEG:
        view = view._neg_view()
    return view


def _index(t):
    """-1 for a CPU tensor, else its CUDA device's index."""
    return t.device.index if t.is_cuda else -1


def load_into_targets(ckpt, named, strict, verify, allowed, sizes):
    """Fills the CPU and CUDA tensors of `named` ((name, tensor) pairs) from the open `_core`
    checkpoint `ckpt`; returns (missing, unexpected). The object pickle is vetted and checked
    against the index first (as by load): one container, one answer."""
    ckpt.vetted_pickle(allowed)
    matched, missing, unexpected = _check(ckpt.path, ckpt.tensor_records(), named, strict)
    direct, staged = [], []
    for t, rec in matched:
        if rec["byte_end"] == rec["byte_begin"]:
            continue  # no elements
        if saved_contiguous(rec) and t.is_contiguous() and not t.is_conj() and not t.is_neg():
            direct.append((t, rec))
        else:
            staged.append((t, rec))
    ranges = [(rec["storage"], rec["byte_begin"], rec["byte_end"], t.data_ptr(), _index(t)) for t, rec in direct]
    # The first pass also fills the direct targets, so there is one even with nothing staged.
    passes = list(byte_batches(staged, lambda s: s[1]["byte_end"] - s[1]["byte_begin"],
                               _STAGED_BYTES_PER_PASS)) or [[]]
    with torch.no_grad():  # as load_state_dict: in-place copies into leaves
        for i, batch in enumerate(passes):
            buffers = [torch.empty(rec["byte_end"] - rec["byte_begin"], dtype=torch.uint8) for _, rec in batch]
            extra = [(rec["storage"], rec["byte_begin"], rec["byte_end"], b.data_ptr(), -1)
                     for (_, rec), b in zip(batch, buffers)]
            load_ranges(ckpt, (ranges if i == 0 else []) + extra, verify, **sizes)
            for (t, rec), b in zip(batch, buffers):
                t.copy_(saved_view(b, rec, t.dtype, rec["byte_begin"]))
    # Bytes written behind autograd's back: bump the version counters as copy_ would have.
    for t, _ in direct:
        if not t.is_inference():
            torch.autograd.graph.increment_version(t)
    return missing, unexpected


def load_element_runs(ckpt, runs, verify, allowed, sizes):
    """Element runs (name, first element, target): elements [begin, begin + target.numel()) of
    the file's tensor `name`, in row-major order, into the contiguous `target` (cpu or cuda, the
    saved dtype, any shape): FSDP1's FlatParameter shards (_fsdp.py). The saved tensor must be
    contiguous in its storage. Every run is checked before a byte moves (ZckptError listing each
    problem), then one streaming pass reads each run's bytes straight into its target."""
    ckpt.vetted_pickle(allowed)
    records = {}
    for r in ckpt.tensor_records():
        records.setdefault(r["name"], r)
    problems, ranges = [], []
    for name, begin, t in runs:
        rec = records.get(name)
        if rec is None:
            problems.append(f"'{name}' is not in the file")
            continue
        numel = 1
        for n in rec["shape"]:
            numel *= n
        why = target_problem(name, t) or viewable_problem(rec, f"'{name}'")
        if not why and saved_dtype(rec) != t.dtype:
            why = f"dtype mismatch for '{name}': the file has {rec['dtype']}, the target has {dtype_name(t.dtype)}"
        if not why and not saved_contiguous(rec):
            why = f"'{name}' is not contiguous in its storage: element ranges need a contiguous saved tensor"
        if not why and not t.is_contiguous():
            why = f"the target of '{name}' is not contiguous"
        if not why and begin + t.numel() > numel:
            why = f"elements [{begin}, {begin + t.numel()}) of '{name}' are past its {numel} elements"
        if why:
            problems.append(why)
        elif t.numel():
            first = rec["byte_begin"] + begin * t.element_size()
            ranges.append((rec["storage"], first, first + t.numel() * t.element_size(), t.data_ptr(), _index(t)))
    if problems:
        raise ZckptError(f"cannot load regions of {ckpt.path}:" + "".join(f"\n  {p}" for p in problems))
    load_ranges(ckpt, ranges, verify, **sizes)