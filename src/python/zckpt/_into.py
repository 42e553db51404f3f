"""load_into of CPU and CUDA targets on the torch-free core: the core's checks (names, dtype,
shape, device, every target before the first byte moves: src/loader/into_check.h, the one home
of the checks zckpt::LoadInto runs too; Python hands them what they need of each target), then
streaming passes that read each tensor's bytes straight into its memory, host or device, or, for
a view torch cannot take byte for byte (strided or offset in its storage, conj/neg bits, a
non-contiguous target), into host staging buffers then copy_()'d into it
(`_load_ranges.load_staged`)."""
import torch

from . import _core, _records
from ._errors import ZckptError
from ._load_ranges import Staged, device_index, load_ranges, load_staged


def dtype_name(dtype):
    """zckpt's name of a torch dtype: zckpt names dtypes as torch does (`torch.<name>`,
    include/zckpt/dtype.h), so the name is the mapping both ways (saved_dtype is the inverse)."""
    return str(dtype).removeprefix("torch.")


def target_problem(name, t):
    """Why `t` cannot be written in place at all, or "": for DCP's regions and FSDP1's element
    runs, which the core's check_into does not cover (load_into's own targets go through it, and
    its loader::TargetProblem says the same)."""
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
    saved = getattr(torch, rec.dtype, None)
    return saved if isinstance(saved, torch.dtype) else None


def viewable_problem(rec, what):
    """Why a record cannot be rebuilt as a plain tensor here (its dtype unknown to this torch, or
    quantized: the quantizer lives in the pickle), or ""."""
    if saved_dtype(rec) is None:
        return f"{what}: dtype {rec.dtype} is not available in torch {torch.__version__}"
    if rec.quantized or rec.dtype.startswith("q"):
        return f"{what} is quantized: not supported here (zckpt.load rebuilds it through the pickle)"
    return ""


def saved_contiguous(rec):
    """The record's bytes are its elements in order, with no conj/neg fix-up."""
    if rec.conj or rec.neg:
        return False
    expected = 1
    for size, stride in zip(reversed(rec.shape), reversed(rec.stride)):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _facts(name, t):
    """What the core's checks of a load into `t` need of it: [name, strided, device, has_storage,
    dtype name, shape]. Wrapper subclasses (DTensor) have no storage of their own: writing
    through their data_ptr() would write to nothing."""
    try:
        has_storage = not (t.numel() > 0 and t.data_ptr() == 0)
    except (RuntimeError, NotImplementedError):
        has_storage = False
    return [name, t.layout == torch.strided, str(t.device), has_storage, dtype_name(t.dtype), list(t.shape)]


def _check(ckpt, named, strict):
    """(matched (tensor, record) pairs, missing, unexpected): the core's checks
    (src/loader/into_check.h), ZckptError listing every problem when any target cannot take its
    record, or (strict) names do not match."""
    named = list(named)
    found = _core.check_into(ckpt, [_facts(name, t) for name, t in named], strict)
    records = _records.of_checkpoint(ckpt)
    matched = [(named[i][1], records[r]) for i, r in found["matched"]]
    return matched, found["missing"], found["unexpected"]


def saved_view(buffer, rec, dtype, base):
    """The saved view rebuilt over `buffer`, a uint8 tensor holding the record's storage from its
    byte `base` on: a staging buffer of bytes byte_begin..byte_end (base byte_begin) or the whole
    storage (base 0). Conj/neg bits as torch set them."""
    item = torch.empty(0, dtype=dtype).element_size()
    offset = rec.storage_offset - base // item
    view = torch.as_strided(buffer.view(dtype), rec.shape, rec.stride, offset)
    if rec.conj:
        view = view._conj()
    if rec.neg:
        view = view._neg_view()
    return view


def load_into_targets(ckpt, named, strict, verify, allowed, sizes):
    """Fills the CPU and CUDA tensors of `named` ((name, tensor) pairs) from the open `_core`
    checkpoint `ckpt`; returns (missing, unexpected). The object pickle is vetted and checked
    against the index first (as by load): one container, one answer."""
    ckpt.vetted_pickle(allowed)
    matched, missing, unexpected = _check(ckpt, named, strict)
    direct, staged = [], []
    for t, rec in matched:
        if rec.byte_end == rec.byte_begin:
            continue  # no elements
        if saved_contiguous(rec) and t.is_contiguous() and not t.is_conj() and not t.is_neg():
            direct.append(((rec.storage, rec.byte_begin, rec.byte_end, t.data_ptr(), device_index(t.device)), t))
        else:
            staged.append(Staged(rec.storage, rec.byte_begin, rec.byte_end, _copy_into(t, rec)))
    load_staged(ckpt, direct, staged, verify, sizes)
    return missing, unexpected


def _copy_into(t, rec):
    """What a staged record's buffer becomes: copied into `t` as the saved view."""
    return lambda buffer: t.copy_(saved_view(buffer, rec, t.dtype, rec.byte_begin))


def load_element_runs(ckpt, runs, verify, allowed, sizes):
    """Element runs (name, first element, target): elements [begin, begin + target.numel()) of
    the file's tensor `name`, in row-major order, into the contiguous `target` (cpu or cuda, the
    saved dtype, any shape): FSDP1's FlatParameter shards (_fsdp.py). The saved tensor must be
    contiguous in its storage. Every run is checked before a byte moves (ZckptError listing each
    problem), then one streaming pass reads each run's bytes straight into its target."""
    ckpt.vetted_pickle(allowed)
    records = _records.by_name(_records.of_checkpoint(ckpt))
    problems, ranges = [], []
    for name, begin, t in runs:
        rec = records.get(name)
        if rec is None:
            problems.append(f"'{name}' is not in the file")
            continue
        numel = 1
        for n in rec.shape:
            numel *= n
        why = target_problem(name, t) or viewable_problem(rec, f"'{name}'")
        if not why and saved_dtype(rec) != t.dtype:
            why = f"dtype mismatch for '{name}': the file has {rec.dtype}, the target has {dtype_name(t.dtype)}"
        if not why and not saved_contiguous(rec):
            why = f"'{name}' is not contiguous in its storage: element ranges need a contiguous saved tensor"
        if not why and not t.is_contiguous():
            why = f"the target of '{name}' is not contiguous"
        if not why and begin + t.numel() > numel:
            why = f"elements [{begin}, {begin + t.numel()}) of '{name}' are past its {numel} elements"
        if why:
            problems.append(why)
        elif t.numel():
            first = rec.byte_begin + begin * t.element_size()
            ranges.append((rec.storage, first, first + t.numel() * t.element_size(), t.data_ptr(), device_index(t.device)))
    if problems:
        raise ZckptError(f"cannot load regions of {ckpt.path}:" + "".join(f"\n  {p}" for p in problems))
    load_ranges(ckpt, ranges, verify, **sizes)