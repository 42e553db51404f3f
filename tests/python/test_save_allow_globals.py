"""zckpt.save(..., allow_globals=...): the save vets its pickle as zckpt.load does.

An object of a class off zckpt's allowlist (as transformers' TrainingArguments is) is refused
with UnsafeError naming the class, leaving nothing at the path; listed in allow_globals (the
class itself or its 'module.name'), it is written, and zckpt.load given the same allow_globals
gives back an equal object. AsyncSaver.save takes the same argument, and refuses such an object
itself, before its snapshot.
"""
import dataclasses

import pytest
import torch

import zckpt


@dataclasses.dataclass
class RunArguments:
    """A trainer's arguments object: plain fields and a tensor, pickled by its class's name."""

    output_dir: str
    learning_rate: float
    steps: list
    scale: torch.Tensor


def _arguments():
    return {"args": RunArguments("out", 3e-4, [1, 2, 3], torch.arange(6, dtype=torch.float32).reshape(2, 3)),
            "weight": torch.ones(4, 4, dtype=torch.bfloat16)}


def _name():
    return f"{RunArguments.__module__}.{RunArguments.__qualname__}"


def _assert_equal(got, want):
    assert got.keys() == want.keys()
    assert torch.equal(got["weight"], want["weight"]) and got["weight"].dtype == want["weight"].dtype
    a, b = got["args"], want["args"]
    assert type(a) is RunArguments
    assert (a.output_dir, a.learning_rate, a.steps) == (b.output_dir, b.learning_rate, b.steps)
    assert torch.equal(a.scale, b.scale)


def test_save_refuses_a_global_off_the_allowlist(tmp_path):
    path = tmp_path / "args.zckpt"
    with pytest.raises(zckpt.UnsafeError, match=_name().replace(".", r"\.")):
        zckpt.save(_arguments(), path)
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []  # no temporary left either


@pytest.mark.parametrize("allowed", ["class", "name"])
def test_save_with_allow_globals_round_trips(tmp_path, allowed):
    path = tmp_path / "args.zckpt"
    allow = [RunArguments] if allowed == "class" else [_name()]
    obj = _arguments()
    zckpt.save(obj, path, allow_globals=allow)
    assert zckpt.verify(path) is not None
    with pytest.raises(zckpt.UnsafeError):
        zckpt.load(path, weights_only=False)
    _assert_equal(zckpt.load(path, weights_only=False, allow_globals=allow), obj)


def test_async_save_takes_allow_globals(tmp_path):
    saver = zckpt.AsyncSaver()
    try:
        # Refused by the call itself, before a snapshot is taken: no Future, nothing written.
        with pytest.raises(zckpt.UnsafeError, match=_name().replace(".", r"\.")):
            saver.save(_arguments(), tmp_path / "refused.zckpt")
        assert saver.buffer_bytes == 0
        assert not (tmp_path / "refused.zckpt").exists()
        obj = _arguments()
        saver.save(obj, tmp_path / "args.zckpt", allow_globals=[RunArguments]).result(timeout=60)
        _assert_equal(zckpt.load(tmp_path / "args.zckpt", weights_only=False, allow_globals=[RunArguments]), obj)
    finally:
        saver.close()


def test_allow_globals_takes_a_list_not_one_string(tmp_path):
    with pytest.raises(TypeError):
        zckpt.save(_arguments(), tmp_path / "args.zckpt", allow_globals=_name())
