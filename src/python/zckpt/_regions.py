"""Boxes of saved tensors read into destination tensors, on the torch-free core: what zckpt.dcp's
reader hands DCP's planner (a rank resuming at another world size asks for the part of each saved
piece that overlaps its own).

Every region is checked before a byte moves (one ZckptError listing each problem). Only the byte
ranges the boxes touch are read (whole chunks, each checked unless verify=False): straight into
a contiguous destination, on the CPU or a CUDA device, when the box is one contiguous byte run of
the same dtype; otherwise into host staging buffers (_load_ranges.load_staged), then copy_()'d
into the destination (which converts dtypes and crosses to a CUDA destination). A corrupt chunk is a CorruptError naming the file, the storage, its tensors and the byte range;
destinations may then be partly written."""
import math

import torch

from . import _core, _records
from ._errors import ZckptError
from ._into import saved_contiguous, saved_dtype, saved_view, target_problem, viewable_problem
from ._load_ranges import Staged, device_index, load_staged


def storage_tensors(path):
    """storage key -> names of the tensor records viewing it, in table order (every storage, an
    empty list for one no record views)."""
    ckpt = _core.open(path)
    keys = [s["key"] for s in ckpt.describe()["storages"]]
    out = {k: [] for k in keys}
    for rec in _records.of_checkpoint(ckpt):
        out[keys[rec.storage]].append(rec.name)
    return out


def _dims(values):
    return "[" + ", ".join(str(int(v)) for v in values) + "]"


def _narrow(rec, name, offsets, lengths):
    """(view, "") with view the record narrowed to the box (a Record: shape, storage_offset,
    byte_begin/byte_end the box's extent, empty when it has no elements), or (None, why)."""
    shape, stride = rec.shape, rec.stride
    if len(offsets) != len(shape) or len(lengths) != len(shape):
        return None, f"'{name}' has {len(shape)} dimensions, the box offsets {_dims(offsets)} lengths {_dims(lengths)}"
    for o, n, s in zip(offsets, lengths, shape):
        if o < 0 or n < 0 or o > s or n > s - o:
            return None, (f"box offsets {_dims(offsets)} lengths {_dims(lengths)} is outside '{name}' of shape "
                          f"{_dims(shape)}")
    storage_offset = rec.storage_offset + sum(o * st for o, st in zip(offsets, stride))
    item = torch.empty(0, dtype=saved_dtype(rec)).element_size()
    if math.prod(lengths) == 0:
        begin = end = 0
    else:
        last = sum((n - 1) * st for n, st in zip(lengths, stride))
        begin, end = storage_offset * item, (storage_offset + last + 1) * item
    return rec._replace(shape=tuple(lengths), storage_offset=storage_offset, byte_begin=begin, byte_end=end), ""


def _check(ckpt, regions):
    """(view, target) per region with elements; ZckptError listing every region that cannot load."""
    by_name = _records.by_name(_records.of_checkpoint(ckpt))
    checked, problems = [], []
    for name, offsets, lengths, target in regions:
        offsets, lengths = [int(o) for o in offsets], [int(n) for n in lengths]
        rec = by_name.get(name)
        if rec is None:
            problems.append(f"'{name}' is not in the file")
            continue
        why = target_problem(name, target)
        if not why and tuple(lengths) != tuple(target.shape):
            why = f"target '{name}' has shape {_dims(target.shape)}, the box has lengths {_dims(lengths)}"
        why = why or viewable_problem(rec, f"tensor '{name}' in {ckpt.path}")
        view = None
        if not why:
            view, why = _narrow(rec, name, offsets, lengths)
        if why:
            problems.append(why)
        elif view.byte_end > view.byte_begin:
            checked.append((view, target))
    if problems:
        raise ZckptError(f"cannot load regions of {ckpt.path}:" + "".join(f"\n  {p}" for p in problems))
    return checked


def _one_run(view, target):
    """The box's bytes are the target's, in order: one contiguous run, same dtype, no fix-ups."""
    return (saved_dtype(view) == target.dtype and saved_contiguous(view) and target.is_contiguous()
            and not target.is_conj() and not target.is_neg())


def _copy_into(view, target):
    """What a staged box's buffer becomes: its saved view copy_()'d into the target."""
    return lambda buffer: target.copy_(saved_view(buffer, view, saved_dtype(view), view.byte_begin))


def _plan(checked):
    """(direct (range, target) pairs, staged parts). A box that is one run of bytes goes straight
    into its target, on the CPU or a CUDA device; any other is staged."""
    direct, staged = [], []
    for view, target in checked:
        if _one_run(view, target):
            direct.append(((view.storage, view.byte_begin, view.byte_end, target.data_ptr(),
                            device_index(target.device)), target))
        else:
            staged.append(Staged(view.storage, view.byte_begin, view.byte_end, _copy_into(view, target)))
    return direct, staged


def load_regions(path, regions, verify=True, allow_globals=()):
    """Reads each region (tensor name, box offsets, box lengths, target tensor whose shape is the
    box's, cpu or cuda, any strides and dtype) of the container at `path` into its target.
    Returns {regions, direct, staged, stored_bytes, raw_bytes, chunks} (stored_bytes: bytes of
    the chunks read, the measure of reading only what is needed)."""
    ckpt = _core.open(path)  # one open file for the records, the pickle and the bytes
    _core.check_object_pickle(ckpt, list(allow_globals))
    checked = _check(ckpt, regions)
    direct, staged = _plan(checked)
    report = {"regions": len(regions), "direct": len(direct), "staged": len(staged)}
    report.update(load_staged(ckpt, direct, staged, verify))
    return report
