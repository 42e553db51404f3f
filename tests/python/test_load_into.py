"""zckpt.load_into: the checkpoint's tensors copied into existing tensors, in place (every
data_ptr kept), into an nn.Module, a plain (nested) state dict, or an optimizer; names and
then dtypes/shapes checked before the first byte moves."""
import collections
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import zckpt
from zckpt_testing import HERE, save_converted


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.bn = torch.nn.BatchNorm1d(8)
        self.fc = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.register_buffer("mask", torch.tril(torch.ones(4, 4, dtype=torch.bool)))
        self.register_buffer("scale", torch.tensor(0.5, dtype=torch.bfloat16))

    def forward(self, idx):
        h = torch.relu(self.fc(self.bn(self.norm(self.embed(idx)))))
        return self.head(h) * self.scale.float()


def _train(model, opt, steps, sched=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        idx = torch.randint(0, 16, (6,), generator=g)
        loss = model(idx).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(loss.item())
    return losses


def _trained(seed=1, steps=3):
    torch.manual_seed(seed)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    _train(model, opt, steps, sched, seed=seed)
    return model, opt, sched


def _bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8).tolist()


def _ptrs(named):
    return {k: v.data_ptr() for k, v in named.items()}


def _module_tensors(model):
    return model.state_dict(keep_vars=True)


def _snapshot(d):
    return {k: v.detach().clone() for k, v in d.items()}


def _assert_untouched(target, snapshot):
    for k, v in snapshot.items():
        assert torch.equal(target[k], v), f"{k} changed although the load was refused"


def test_module_in_place(tmp_path):
    src, _, _ = _trained(seed=1)
    src.eval()
    _, path = save_converted(src.state_dict(), tmp_path, "model")
    torch.manual_seed(99)
    dst = Net().eval()
    before = _ptrs(_module_tensors(dst))
    assert not torch.equal(dst.fc.weight, src.fc.weight)
    assert zckpt.load_into(path, dst) == ([], [])
    assert _ptrs(_module_tensors(dst)) == before
    for k, v in src.state_dict().items():
        assert torch.equal(_module_tensors(dst)[k].detach(), v), k
    assert dst.bn.num_batches_tracked.item() == 3
    assert dst.head.weight is dst.embed.weight
    assert dst.fc.weight.requires_grad and dst.fc.weight.is_leaf and dst.fc.weight.grad is None
    idx = torch.arange(8)
    assert torch.equal(dst(idx), src(idx))


def test_module_from_legacy_file(tmp_path):
    src, _, _ = _trained(seed=2)
    _, path = save_converted(src.state_dict(), tmp_path, "legacy", _use_new_zipfile_serialization=False)
    dst = Net()
    before = _ptrs(_module_tensors(dst))
    assert zckpt.load_into(path, dst) == ([], [])
    assert _ptrs(_module_tensors(dst)) == before
    assert all(torch.equal(dst.state_dict()[k], v) for k, v in src.state_dict().items())


@pytest.mark.parametrize("name", ["dtypes.pt", "strides.pt", "scalars_empty.pt", "module_state_dict.pt"])
def test_plain_state_dict_from_family(family, name):
    want = family.torch_load(name)
    target = {k: torch.zeros_like(v) for k, v in want.items()}
    before = _ptrs(target)
    zckpt.load_into(family.zckpt(name), target, strict=False)
    assert _ptrs(target) == before
    for k, v in want.items():
        assert target[k].dtype == v.dtype and target[k].shape == v.shape, k
        # bit for bit (NaN, -0.0, float8 and unsigned kinds included)
        assert _bytes(target[k]) == _bytes(v), k


def test_strided_saved_tensor_and_non_contiguous_target(tmp_path):
    base = torch.arange(48.0).reshape(6, 8)
    saved = {"t": base.t(), "slice": base[1::2, 2:5], "plain": torch.arange(12, dtype=torch.int32).reshape(3, 4)}
    _, path = save_converted(saved, tmp_path, "strided")
    target = {
        "t": torch.zeros(8, 6),                       # contiguous target, strided source
        "slice": torch.zeros(3, 3),
        "plain": torch.zeros(4, 3, dtype=torch.int32).t(),  # non-contiguous target
    }
    before = _ptrs(target)
    assert zckpt.load_into(path, target) == ([], [])
    assert _ptrs(target) == before and target["plain"].stride() == (1, 3)
    for k, v in saved.items():
        assert torch.equal(target[k], v), k


def test_nested_state_dict(tmp_path):
    saved = {"model": {"w": torch.arange(4.0), "inner": {"b": torch.ones(2, dtype=torch.int64)}}, "step": 7}
    _, path = save_converted(saved, tmp_path, "nested")
    target = {"model": {"w": torch.zeros(4), "inner": {"b": torch.zeros(2, dtype=torch.int64)}}}
    assert zckpt.load_into(path, target) == ([], [])
    assert target["model"]["w"].tolist() == [0.0, 1.0, 2.0, 3.0] and target["model"]["inner"]["b"].tolist() == [1, 1]


def _opt_tensors(opt):
    return {f"{i}.{k}": v for i, st in opt.state_dict()["state"].items() for k, v in st.items()
            if isinstance(v, torch.Tensor)}


def test_optimizer_after_a_step(tmp_path):
    src_model, src_opt, src_sched = _trained(seed=3, steps=3)
    _, model_path = save_converted(src_model.state_dict(), tmp_path, "model")
    _, opt_path = save_converted(src_opt.state_dict(), tmp_path, "optim")
    saved_groups = [dict(g) for g in src_opt.state_dict()["param_groups"]]
    assert saved_groups[0]["lr"] == 0.005 and saved_groups[0]["initial_lr"] == 0.01

    torch.manual_seed(42)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=0.3, betas=(0.5, 0.6))
    _train(model, opt, 1, seed=42)  # the optimizer now holds its state tensors
    before = _ptrs(_opt_tensors(opt))
    assert len(before) == 3 * len(list(model.parameters()))
    zckpt.load_into(model_path, model)
    assert zckpt.load_into(opt_path, opt) == ([], [])
    assert _ptrs(_opt_tensors(opt)) == before
    for k, v in _opt_tensors(src_opt).items():
        assert torch.equal(_opt_tensors(opt)[k], v), k
    assert opt.state_dict()["state"][0]["step"].item() == 3.0
    group = opt.param_groups[0]
    assert group["lr"] == 0.005 and group["betas"] == (0.9, 0.999) and group["initial_lr"] == 0.01
    # The next step matches the original run's next step.
    _train(src_model, src_opt, 1, seed=7)
    _train(model, opt, 1, seed=7)
    for (name, a), b in zip(src_model.named_parameters(), model.parameters()):
        assert torch.equal(a, b), name


def test_optimizer_param_group_mismatch_refused_before_any_write(tmp_path):
    """optimizer.load_state_dict refuses a different number of param groups before touching
    anything; load_into must too (its state tensors match by index, so only the groups differ)."""
    _, src_opt, _ = _trained(seed=8)
    _, path = save_converted(src_opt.state_dict(), tmp_path, "optim")
    torch.manual_seed(9)
    model = Net()
    params = list(model.parameters())
    opt = torch.optim.Adam([{"params": params[:2]}, {"params": params[2:], "lr": 0.5}], lr=0.3)
    _train(model, opt, 1, seed=9)
    with pytest.raises(ValueError, match="parameter groups"):
        opt.load_state_dict(src_opt.state_dict())
    snap = _snapshot(_opt_tensors(opt))
    with pytest.raises(ValueError, match="param groups"):
        zckpt.load_into(path, opt)
    _assert_untouched(_opt_tensors(opt), snap)
    assert [g["lr"] for g in opt.param_groups] == [0.3, 0.5]


def test_optimizer_without_state_is_refused(tmp_path):
    _, src_opt, _ = _trained(seed=4)
    _, path = save_converted(src_opt.state_dict(), tmp_path, "optim")
    fresh = torch.optim.Adam(Net().parameters(), lr=0.1)
    with pytest.raises(zckpt.ZckptError, match=r"state\.0\.exp_avg"):
        zckpt.load_into(path, fresh)
    assert fresh.param_groups[0]["lr"] == 0.1


@pytest.fixture
def abc_file(tmp_path):
    saved = collections.OrderedDict(
        [("a", torch.arange(4.0)), ("b", torch.arange(6, dtype=torch.int64).reshape(2, 3)),
         ("only.in.file", torch.ones(3)), ("z.last", torch.full((2, 2), 7.0))])
    return saved, save_converted(saved, tmp_path, "abc")[1]


def _target(**extra):
    t = collections.OrderedDict([("a", torch.zeros(4)), ("b", torch.zeros(2, 3, dtype=torch.int64)),
                                 ("z.last", torch.zeros(2, 2))])
    t.update(extra)
    return t


def test_strict_names_missing_and_unexpected(abc_file):
    _, path = abc_file
    target = _target(**{"only.in.target": torch.zeros(1)})
    snap = _snapshot(target)
    with pytest.raises(zckpt.ZckptError) as e:
        zckpt.load_into(path, target)
    assert "only.in.target" in str(e.value) and "only.in.file" in str(e.value)
    assert "Missing" in str(e.value) and "Unexpected" in str(e.value)
    _assert_untouched(target, snap)


def test_strict_missing_only(abc_file):
    _, path = abc_file
    target = _target(**{"only.in.file": torch.zeros(3), "extra.weight": torch.zeros(2)})
    with pytest.raises(zckpt.ZckptError, match=r"Missing key\(s\): \"extra\.weight\""):
        zckpt.load_into(path, target)


def test_strict_unexpected_only(abc_file):
    _, path = abc_file
    with pytest.raises(zckpt.ZckptError, match=r"Unexpected key\(s\): \"only\.in\.file\""):
        zckpt.load_into(path, _target())


def test_not_strict_returns_names_and_loads_the_rest(abc_file):
    saved, path = abc_file
    target = _target(**{"only.in.target": torch.zeros(1)})
    missing, unexpected = zckpt.load_into(path, target, strict=False)
    assert (missing, unexpected) == (["only.in.target"], ["only.in.file"])
    for k in ("a", "b", "z.last"):
        assert torch.equal(target[k], saved[k]), k
    assert target["only.in.target"].item() == 0.0


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("bad", ["dtype", "shape"])
def test_mismatch_refused_before_any_value_changes(abc_file, bad, strict):
    _, path = abc_file
    wrong = torch.zeros(2, 2, dtype=torch.float64) if bad == "dtype" else torch.zeros(4, 1)
    target = _target(**{"z.last": wrong, "only.in.file": torch.zeros(3)})  # z.last is last in the file
    snap = _snapshot(target)
    ptrs = _ptrs(target)
    with pytest.raises(zckpt.ZckptError) as e:
        zckpt.load_into(path, target, strict=strict)
    msg = str(e.value)
    assert path in msg
    if bad == "dtype":
        assert "dtype mismatch for 'z.last': the file has float32" in msg
    else:
        assert "size mismatch for 'z.last': the file has shape [2, 2], the target has shape [4, 1]" in msg
    assert "'a'" not in msg and "'b'" not in msg
    _assert_untouched(target, snap)
    assert _ptrs(target) == ptrs


def test_wrong_target_type():
    with pytest.raises(TypeError, match="list"):
        zckpt.load_into(os.devnull, [torch.zeros(1)])


def test_tied_weight_saved_once_fills_both_names(tmp_path):
    """A state dict holding the same tensor under two names (tied embedding and head, e.g.
    dict(model.named_parameters(remove_duplicate=False))) loads with load_state_dict(strict=True);
    load_into must accept it the same way."""
    src, _, _ = _trained(seed=5)
    saved = collections.OrderedDict(src.named_parameters(remove_duplicate=False))
    assert saved["embed.weight"] is saved["head.weight"]
    _, path = save_converted(saved, tmp_path, "tied")
    by_torch = torch.load(os.path.join(tmp_path, "tied.pt"), weights_only=True)
    assert by_torch["head.weight"] is by_torch["embed.weight"]
    target = {k: torch.zeros_like(v) for k, v in saved.items()}
    missing, unexpected = zckpt.load_into(path, target, strict=False)
    assert (missing, unexpected) == ([], [])
    assert torch.equal(target["head.weight"], src.embed.weight.detach())


def _run_child(body, timeout=120):
    """Runs `body` in a fresh interpreter (a crash must not take the suite down)."""
    script = f"import sys\nsys.path.insert(0, {HERE!r})\nimport zckpt_testing, torch_family, torch, zckpt\n" + body
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout)


def test_dtensor_targets(family):
    """verl's FSDP2 case: the model state dict holds DTensors; load_into fills their local
    shards. Run in a child process: the failure mode once seen is a segmentation fault."""
    r = _run_child(textwrap.dedent(f"""
        torch_family.ensure_process_group()
        want = torch.load({family.pt("model_world_size_1_rank_0.pt")!r}, weights_only=False)
        target = {{k: torch.zeros_like(v) for k, v in want.items()}}
        missing, unexpected = zckpt.load_into({family.zckpt("model_world_size_1_rank_0.pt")!r}, target, strict=False)
        assert missing == [], missing
        for k, v in want.items():
            assert type(target[k]).__name__ == "DTensor", k
            assert torch.equal(target[k].to_local(), v.to_local()), k
        print("LOADED", len(want))
    """))
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    assert "LOADED 4" in r.stdout


def test_wrapper_subclass_target_is_refused_not_crashed(tmp_path):
    pytest.importorskip("torch.testing._internal.two_tensor")
    _, path = save_converted({"w": torch.arange(12.0).reshape(3, 4)}, tmp_path, "w")
    r = _run_child(textwrap.dedent(f"""
        from torch.testing._internal.two_tensor import TwoTensor
        target = {{"w": TwoTensor(torch.zeros(3, 4), torch.zeros(3, 4))}}
        try:
            zckpt.load_into({path!r}, target)
        except zckpt.ZckptError as e:
            print("REFUSED", e)
        else:
            assert torch.equal(target["w"].a, torch.arange(12.0).reshape(3, 4))
            print("LOADED")
    """))
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    assert "REFUSED" in r.stdout and "'w'" in r.stdout or "LOADED" in r.stdout


def _device_mesh_holds_a_tensor():
    """torch 2.15's DeviceMesh pickles an int tensor `_rank_map` with every DTensor."""
    try:
        import inspect

        from torch.distributed.device_mesh import DeviceMesh

        return "_rank_map" in inspect.getsource(DeviceMesh)
    except Exception:  # noqa: BLE001 - no torch.distributed, no source: no such tensor
        return False


def test_dtensor_local_shards_and_strict(family):
    """The documented way for DTensors today: targets are the local shards. strict=True must
    accept a file whose only tensors are the model's (the DeviceMesh's internal tensor that
    DTensor pickles carry is not a state-dict entry)."""
    from torch_family import ensure_process_group

    ensure_process_group()
    want = family.torch_load("model_world_size_1_rank_0.pt")
    target = {k: torch.zeros_like(v.to_local()) for k, v in want.items()}
    missing, unexpected = zckpt.load_into(family.zckpt("model_world_size_1_rank_0.pt"), target, strict=False)
    assert missing == []
    for k, v in want.items():
        assert torch.equal(target[k], v.to_local()), k
    assert unexpected == []


def test_module_on_cuda(tmp_path, needs_cuda):
    src, _, _ = _trained(seed=6)
    _, path = save_converted(src.state_dict(), tmp_path, "model")
    dst = Net().cuda()
    before = _ptrs(_module_tensors(dst))
    assert zckpt.load_into(path, dst) == ([], [])
    assert _ptrs(_module_tensors(dst)) == before
    for k, v in src.state_dict().items():
        assert torch.equal(dst.state_dict()[k].cpu(), v), k


def test_module_whose_state_dict_hands_out_copies_is_refused(tmp_path):
    """The FSDP1 failure in general: a module whose state_dict() returns copies. Filling them
    would report success and change nothing; load_into must refuse before writing."""
    src, _, _ = _trained(seed=7)
    _, path = save_converted(src.state_dict(), tmp_path, "model")

    class Copying(Net):
        def state_dict(self, *args, **kwargs):
            return collections.OrderedDict((k, v.detach().clone()) for k, v in super().state_dict(*args, **kwargs).items())

    torch.manual_seed(8)
    dst = Copying()
    before = _snapshot(_module_tensors(dst))
    with pytest.raises(zckpt.ZckptError, match=r"returned a copy of it, not the module's own parameter") as e:
        zckpt.load_into(path, dst)
    assert path in str(e.value)
    for k, v in Net.state_dict(dst, keep_vars=True).items():
        assert torch.equal(v, before[k]), k
