"""zckpt.verl.make_optimizer_state: a fresh optimizer gets, before load_into fills it, exactly the
state entries its first step would make (names, shapes, dtypes, devices, scalar values), without
that step touching a parameter; a probe it cannot make falls back to the real zero-gradient step
at lr 0. (verl itself is not needed: the bit-identical resume through verl's own manager is
tests/frameworks/test_verl.py.)"""
import pytest
import torch

from zckpt.verl import make_optimizer_state

OPTIMIZERS = {
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-3),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.1),
    "adamw amsgrad": lambda ps: torch.optim.AdamW(ps, lr=1e-3, amsgrad=True),
    "adam fused": lambda ps: torch.optim.Adam(ps, lr=1e-3, fused=True),
    "adam foreach": lambda ps: torch.optim.Adam(ps, lr=1e-3, foreach=True),
    "sgd momentum": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9),
    "sgd": lambda ps: torch.optim.SGD(ps, lr=1e-2),
}


def _params(seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(5, 3, generator=g)),
            torch.nn.Parameter(torch.randn(7, generator=g, dtype=torch.float64)),
            torch.nn.Parameter(torch.randn(4, generator=g).to(torch.bfloat16)),
            torch.nn.Parameter(torch.empty(0))]


def _groups(params):
    """Two groups, the second with its own lr and an option the scheduler adds (initial_lr)."""
    return [{"params": params[:2]}, {"params": params[2:], "lr": 5e-4, "initial_lr": 5e-4}]


def _zero_step_state(make):
    """The reference: a real step with zero gradients at lr 0, as DCP makes an optimizer's state."""
    params = _params(0)
    opt = make(_groups(params))
    for group in opt.param_groups:
        group["lr"] = 0.0
        for p in group["params"]:
            if p.numel():
                p.grad = torch.zeros_like(p)
    opt.step()
    return [opt.state.get(p, {}) for p in params]


def _describe(value):
    if torch.is_tensor(value):
        if value.dim() == 0:
            return ("scalar", value.dtype, value.device, value.item())
        return ("tensor", tuple(value.shape), value.dtype, value.device)
    return ("value", value)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_state_entries_equal_a_first_steps(name):
    make = OPTIMIZERS[name]
    params = _params(0)
    before = [p.detach().clone() for p in params]
    opt = make(_groups(params))
    make_optimizer_state(opt)
    got = [{k: _describe(v) for k, v in opt.state.get(p, {}).items()} for p in params]
    want = [{k: _describe(v) for k, v in s.items()} for s in _zero_step_state(make)]
    assert got == want
    assert all(torch.equal(p, b) for p, b in zip(params, before)), "a parameter changed"
    assert all(p.grad is None for p in params), "a gradient was left behind"
    assert [g["lr"] for g in opt.param_groups] == [make(_groups(_params(0))).param_groups[i]["lr"] for i in range(2)]


def test_filled_state_steps_as_the_saved_optimizer():
    """State made this way and filled with a trained optimizer's bytes (what load_into does)
    continues exactly as the trained optimizer."""
    trained_params = _params(0)
    trained = torch.optim.AdamW(trained_params, lr=1e-2)
    for n in range(3):
        for p in trained_params:
            p.grad = torch.full_like(p, 0.1 * (n + 1))
        trained.step()
    params = [torch.nn.Parameter(p.detach().clone()) for p in trained_params]
    fresh = torch.optim.AdamW(params, lr=1e-2)
    make_optimizer_state(fresh)
    for p, q in zip(params, trained_params):
        for k, v in fresh.state.get(p, {}).items():
            v.copy_(trained.state[q][k])  # in place, as load_into writes the bytes
    for opt, ps in ((trained, trained_params), (fresh, params)):
        for p in ps:
            p.grad = torch.full_like(p, 0.5)
        opt.step()
    assert all(torch.equal(p, q) for p, q in zip(params, trained_params))


class NeedsExtraArgument(torch.optim.Adam):
    """An optimizer whose constructor the probe cannot call (a required argument of its own)."""

    def __init__(self, params, tag, **kwargs):
        super().__init__(params, **kwargs)
        self.tag = tag


def test_unprobeable_optimizer_gets_the_real_zero_step():
    params = _params(0)
    before = [p.detach().clone() for p in params]
    opt = NeedsExtraArgument(_groups(params), "mine", lr=1e-3)
    make_optimizer_state(opt)
    want = [{k: _describe(v) for k, v in s.items()} for s in _zero_step_state(lambda g: NeedsExtraArgument(g, "x", lr=1e-3))]
    assert [{k: _describe(v) for k, v in opt.state.get(p, {}).items()} for p in params] == want
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    assert [g["lr"] for g in opt.param_groups] == [1e-3, 5e-4]


def test_optimizer_with_state_is_left_alone():
    params = _params(0)
    opt = torch.optim.Adam(params, lr=1e-3)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    held = {id(p): {k: v.clone() for k, v in opt.state[p].items()} for p in params if p.numel()}
    make_optimizer_state(opt)
    for p in params:
        if p.numel():
            assert all(torch.equal(opt.state[p][k], v) for k, v in held[id(p)].items())
