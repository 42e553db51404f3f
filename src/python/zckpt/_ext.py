"""zckpt._C, the extension that links LibTorch, imported only after _abi has checked that the
running torch is the one it was built for. Every module that needs `_C` takes it from here
(`from ._ext import _C`); what needs no torch uses `_core` and never imports this."""
from ._abi import check_torch

check_torch()

from . import _C  # noqa: E402
