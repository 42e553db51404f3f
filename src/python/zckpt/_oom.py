"""zckpt.OutOfMemoryError: a ZckptError that is also torch's OutOfMemoryError, so resume code
catches zckpt's allocation failures as it catches torch's own. Made once, when torch is first
needed, and handed to `_core`, whose loads raise it from then on; `_C` raises the same class."""
import torch

from . import _core

# torch.OutOfMemoryError from torch 2.5; torch.cuda.OutOfMemoryError (the same class there) before.
_TORCH_OOM = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError


class OutOfMemoryError(_core.OutOfMemoryError, _TORCH_OOM):
    """Memory (host or device) for a load could not be had; names the file and what was asked."""


OutOfMemoryError.__module__ = "zckpt"
_core.set_out_of_memory_error(OutOfMemoryError)
