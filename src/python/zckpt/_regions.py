"""Boxes of saved tensors read into destination tensors, on the torch-free core: what zckpt.dcp's
reader hands DCP's planner (a rank resuming at another world size asks for the part of each saved
piece that overlaps its own).

Every region is checked before a byte moves (one ZckptError listing each problem). Only the byte
ranges the boxes touch are read (whole chunks, each checked unless verify=False): straight into
a contiguous destination, on the CPU or a CUDA device, when the box is one contiguous byte run of
the same dtype; otherwise into host staging buffers, filled at most _STAGED_BYTES_PER_PASS per
streaming pass, then copy_()'d into the destination (which converts dtypes and crosses to a CUDA
destination). A
corrupt chunk is a CorruptError naming the file, the storage, its tensors and the byte range;
destinations may then be partly written."""
import math

import torch

from . import _core
from ._errors import ZckptError
from ._host import byte_batches
from ._into import saved_contiguous, saved_dtype, saved_view, target_problem, viewable_problem
from ._ranges import device_index, load_ranges

# Staging buffers are filled at most this many bytes per pass (a box larger than this alone), so
# the host memory a load takes beyond its destinations stays bounded.
_STAGED_BYTES_PER_PASS = 256 << 20


def storage_tensors(path):
    """storage key -> names of the tensor records viewing it, in table order (every storage, an
    empty list for one no record views)."""
    ckpt = _core.open(path)
    keys = [s["key"] for s in ckpt.describe()["storages"]]
    out = {k: [] for k in keys}
    for rec in ckpt.tensor_records():
        out[keys[rec["storage"]]].append(rec["name"])
    return out


def _dims(values):
    return "[" + ", ".join(str(int(v)) for v in values) + "]"


def _narrow(rec, name, offsets, lengths):
    """(view, "") with view the record narrowed to the box (a record dict: shape, storage_offset,
    byte_begin/byte_end the box's extent, empty when it has no elements), or (None, why)."""
    shape, stride = rec["shape"], rec["stride"]
    if len(offsets) != len(shape) or len(lengths) != len(shape):
        return None, f"'{name}' has {len(shape)} dimensions, the box offsets {_dims(offsets)} lengths {_dims(lengths)}"
    for o, n, s in zip(offsets, lengths, shape):
        if o < 0 or n < 0 or o > s or n > s - o:
            return None, (f"box offsets {_dims(offsets)} lengths {_dims(lengths)} is outside '{name}' of shape "
                          f"{_dims(shape)}")
    view = dict(rec, shape=list(lengths))
    view["storage_offset"] = rec["storage_offset"] + sum(o * st for o, st in zip(offsets, stride))
    item = torch.empty(0, dtype=saved_dtype(rec)).element_size()
    if math.prod(lengths) == 0:
        view["byte_begin"] = view["byte_end"] = 0
    else:
        last = sum((n - 1) * st for n, st in zip(lengths, stride))
        view["byte_begin"] = view["storage_offset"] * item
        view["byte_end"] = (view["storage_offset"] + last + 1) * item
    return view, ""


def _check(ckpt, regions):
    """(view, target) per region with elements; ZckptError listing every region that cannot load."""
    by_name = {}
    for rec in ckpt.tensor_records():
        by_name.setdefault(rec["name"], rec)
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
        elif view["byte_end"] > view["byte_begin"]:
            checked.append((view, target))
    if problems:
        raise ZckptError(f"cannot load regions of {ckpt.path}:" + "".join(f"\n  {p}" for p in problems))
    return checked


def _one_run(view, target):
    """The box's bytes are the target's, in order: one contiguous run, same dtype, no fix-ups."""
    return (saved_dtype(view) == target.dtype and saved_contiguous(view) and target.is_contiguous()
            and not target.is_conj() and not target.is_neg())


class _Staged:
    """Bytes [begin, end) of a storage read into a host buffer, then copy_()'d into `dst`:
    a box rebuilt as its saved view (`view`), or a run of raw bytes (view None)."""

    __slots__ = ("storage", "begin", "end", "dst", "view")

    def __init__(self, storage, begin, end, dst, view=None):
        self.storage, self.begin, self.end, self.dst, self.view = storage, begin, end, dst, view

    def copy_from(self, buffer):
        src = buffer if self.view is None else saved_view(buffer, self.view, saved_dtype(self.view), self.begin)
        self.dst.copy_(src)


def _plan(checked):
    """(direct ranges, staged parts, direct targets, number of staged regions). A box that is one
    run of bytes goes straight into its target, on the CPU or a CUDA device; any other is staged."""
    direct, staged, direct_targets, staged_regions = [], [], [], 0
    for view, target in checked:
        storage, begin, end = view["storage"], view["byte_begin"], view["byte_end"]
        if _one_run(view, target):
            direct.append((storage, begin, end, target.data_ptr(), device_index(target.device)))
            direct_targets.append(target)
            continue
        staged_regions += 1
        staged.append(_Staged(storage, begin, end, target, view))
    return direct, staged, direct_targets, staged_regions


def load_regions(path, regions, verify=True, allow_globals=()):
    """Reads each region (tensor name, box offsets, box lengths, target tensor whose shape is the
    box's, cpu or cuda, any strides and dtype) of the container at `path` into its target.
    Returns {regions, direct, staged, stored_bytes, raw_bytes, chunks} (stored_bytes: bytes of
    the chunks read, the measure of reading only what is needed)."""
    ckpt = _core.open(path)  # one open file for the records, the pickle and the bytes
    _core.check_object_pickle(ckpt, list(allow_globals))
    checked = _check(ckpt, regions)
    direct, staged, direct_targets, staged_regions = _plan(checked)
    report = {"regions": len(regions), "direct": len(direct), "staged": staged_regions,
              "stored_bytes": 0, "raw_bytes": 0, "chunks": 0}
    # The first pass also fills the direct targets, so there is one even with nothing staged.
    passes = list(byte_batches(staged, lambda s: s.end - s.begin, _STAGED_BYTES_PER_PASS)) or [[]]
    with torch.no_grad():  # as load_state_dict: in-place copies into leaves
        for i, batch in enumerate(passes):
            buffers = [torch.empty(s.end - s.begin, dtype=torch.uint8) for s in batch]
            ranges = (direct if i == 0 else []) + [(s.storage, s.begin, s.end, b.data_ptr(), -1)
                                                    for s, b in zip(batch, buffers)]
            stats = load_ranges(ckpt, ranges, verify)
            for key in ("stored_bytes", "raw_bytes", "chunks"):
                report[key] += stats[key]
            for s, b in zip(batch, buffers):
                s.copy_from(b)
    # Bytes written behind autograd's back: bump the version counters as copy_ would have.
    for t in direct_targets:
        if not t.is_inference():
            torch.autograd.graph.increment_version(t)
    return report
