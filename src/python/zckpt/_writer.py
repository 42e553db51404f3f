"""A torch tensor written into a `_core.ContainerWriter` as one storage and one record viewing all
of it, from host bytes by address: what zckpt.dcp's writer saves each tensor piece with."""
import torch

from ._into import dtype_name

# Tensors on a device, and non-contiguous ones, go out in host pieces of at most this many bytes:
# a copy of one piece at a time, never of the whole tensor.
PIECE_BYTES = 64 << 20


def _row_major_pieces(t, limit):
    """Consecutive parts of `t` whose elements, each taken in row-major order, are `t`'s in
    row-major order, each of at most `limit` elements (one element at least): leading rows,
    narrowed along dimension 0 (a row above the limit split likewise, recursively)."""
    if t.dim() == 0 or t.numel() <= limit:
        yield t
        return
    row = t[0].numel()
    if t.dim() == 1 or row <= limit:
        rows = max(1, limit // row)
        for i in range(0, t.shape[0], rows):
            yield t[i:i + rows]
        return
    for i in range(t.shape[0]):
        yield from _row_major_pieces(t[i], limit)


def write_tensor(writer, key, name, tensor, extra=""):
    """Writes `tensor` (any device, any strides, conj/neg bits resolved) as storage `key` and
    record `name`; returns its byte count. A contiguous CPU tensor is written from its own memory;
    anything else in PIECE_BYTES host pieces (contiguous on its device first, a piece at a time)."""
    t = tensor.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    item = t.element_size()
    nbytes = t.numel() * item
    dtype, shape, location = dtype_name(t.dtype), list(t.shape), str(t.device)
    if t.device.type == "cpu" and t.is_contiguous():
        writer.add_tensor(key, name, dtype, shape, t.data_ptr(), nbytes, extra, location)
        return nbytes
    writer.begin_tensor(key, name, dtype, shape, nbytes, extra, location)
    flat = t.view(-1) if t.is_contiguous() else t  # a contiguous one: pieces of PIECE_BYTES exactly
    for piece in _row_major_pieces(flat, max(1, PIECE_BYTES // item)):
        if piece.numel() == 0:
            continue
        host = piece.contiguous().cpu()
        writer.append_bytes(host.data_ptr(), host.numel() * item)
        del host
    writer.end_tensor()
    return nbytes
