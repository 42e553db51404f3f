"""Fixtures of the Python suite. The torch-written `.pt` files come from
tests/fixtures/torch_family.py (written and converted lazily, once per session, only those a
test asks for)."""
import os

import pytest
import torch

import zckpt_testing  # noqa: F401  (puts tests/fixtures on sys.path)
import torch_family  # noqa: E402
import zckpt  # noqa: E402


class Family:
    """The torch family in one folder: `.pt(name)` the torch.save file, `.zckpt(name)` its
    conversion (default options), `.written(name)` the fixture's record (obj, load_kwargs)."""

    def __init__(self, root):
        self.root = root
        self._written = {}
        self._converted = {}

    def written(self, name):
        if name not in self._written:
            why = torch_family.BY_NAME[name].needs()
            if why:
                pytest.skip(why)
            self._written[name] = torch_family.write_fixture(torch_family.BY_NAME[name], self.root)
        return self._written[name]

    def pt(self, name):
        return self.written(name).path

    def zckpt(self, name):
        if name not in self._converted:
            src = self.pt(name)
            dst = os.path.join(self.root, name + ".zckpt")
            stats = zckpt.convert(src, dst)
            assert stats["destination"] == dst and os.path.exists(dst)
            self._converted[name] = dst
        return self._converted[name]

    def torch_load(self, name, **kwargs):
        kwargs.setdefault("map_location", "cpu")
        kwargs.setdefault("weights_only", False)
        return torch.load(self.pt(name), **kwargs)


@pytest.fixture(scope="session")
def family(tmp_path_factory):
    return Family(str(tmp_path_factory.mktemp("family")))


@pytest.fixture
def needs_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device: torch.cuda.is_available() is False on this machine")
