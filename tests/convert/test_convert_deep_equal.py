"""The comparison every round-trip test rests on: torch_family.diff must see each kind of
difference a broken converter or exporter could introduce."""
from __future__ import annotations

import collections
import copy

import numpy as np
import pytest
import torch

from torch_family import deep_equal, diff


def _state():
    base = torch.arange(12, dtype=torch.float32)
    sd = collections.OrderedDict([("w", base.view(3, 4)), ("tied", base.view(3, 4)), ("row", base[4:8])])
    sd._metadata = collections.OrderedDict([("", {"version": 1})])
    return sd


def test_equal_objects():
    a = {"sd": _state(), "nan": float("nan"), "t": torch.tensor([float("nan"), 1.0]), "np": np.arange(3)}
    assert diff(a, copy.deepcopy(a)) is None
    assert deep_equal(torch.tensor(float("nan")), torch.tensor(float("nan")))


def test_sees_a_changed_value():
    a, b = _state(), _state()
    b["row"][1] = 100.0
    assert "storage bytes differ" in diff(a, b)


def test_sees_nan_payload_and_signed_zero():
    a = torch.tensor([0.0])
    assert diff(a, torch.tensor([-0.0])) is not None
    assert diff(-0.0, 0.0) is not None


@pytest.mark.parametrize("change,words", [
    (lambda t: t.to(torch.float64), "dtype"),
    (lambda t: t.reshape(12), "shape"),
    (lambda t: t.t().contiguous().t(), "stride"),
    (lambda t: torch.arange(13, dtype=torch.float32)[1:].view(3, 4), "storage_offset"),
    (lambda t: t.clone().requires_grad_(), "requires_grad"),
    (lambda t: torch.nn.Parameter(t.clone()), "type"),
    (lambda t: torch.zeros(2, dtype=torch.complex64).conj(), "dtype"),
])
def test_sees_tensor_metadata(change, words):
    t = torch.arange(12, dtype=torch.float32).view(3, 4)
    assert words in diff(t, change(t))


def test_sees_conj_bit():
    c = torch.randn(3, dtype=torch.complex64)
    assert "conj/neg" in diff(c.conj(), c.conj().resolve_conj())


def test_sees_lost_aliasing():
    a, b = _state(), _state()
    b["tied"] = b["tied"].clone()  # same values, own storage
    assert "share a storage" in diff(a, b)


def test_sees_lost_identity():
    t = torch.ones(2)
    assert "same object" in diff([t, t], [t, t.view(2)])


def test_sees_types_and_metadata():
    a = _state()
    assert "type" in diff(a, dict(a))
    b = _state()
    b._metadata[""]["version"] = 2
    assert "_metadata" in diff(a, b)
    c = _state()
    del c._metadata
    assert "attributes" in diff(a, c)
    assert "type" in diff((1, 2), [1, 2])
    assert "type" in diff(1, True)


def test_sees_numpy_and_container_changes():
    assert diff(np.arange(3, dtype=np.int32), np.arange(3, dtype=np.int64)) is not None
    assert diff({"a": 1, "b": 2}, {"b": 2, "a": 1}) is not None  # key order
    assert diff({1, 2}, {1, 3}) is not None
    assert diff(2**100, 2**100 + 1) is not None
    assert diff(b"\x00", b"\x01") is not None


def test_sees_quantizer_changes():
    x = torch.randn(4)
    assert "quantizer" in diff(torch.quantize_per_tensor(x, 0.1, 3, torch.quint8),
                               torch.quantize_per_tensor(x, 0.1, 4, torch.quint8))


def test_sees_sparse_changes():
    a = torch.eye(3).to_sparse()
    b = (torch.eye(3) * 2).to_sparse()
    assert "_values()" in diff(a, b)
