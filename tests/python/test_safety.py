"""Safety: zckpt.convert refuses a .pt whose pickle names a code-running global (and writes
nothing), every global off zckpt's allowlist needs the caller's explicit allow_globals (convert,
load, load_into), and zckpt.load(weights_only=True) still refuses what
torch.load(weights_only=True) refuses, with torch's own pickle.UnpicklingError, running nothing."""
import os
import pickle
import re

import pytest
import torch

import zckpt
import zckpt_testing
from torch_family import assert_deep_equal
from zckpt_testing import CallsGlobal, Config, run_cli, save_converted, save_hostile


def test_exception_hierarchy():
    assert issubclass(zckpt.CorruptError, zckpt.ZckptError)
    assert issubclass(zckpt.UnsafeError, zckpt.ZckptError)
    assert issubclass(zckpt.ZckptError, RuntimeError)
    assert not issubclass(zckpt.UnsafeError, zckpt.CorruptError)


HOSTILE = [("os", "system", False), ("posix", "system", False), ("builtins", "eval", False),
           ("subprocess", "Popen", False), ("os", "system", True)]


@pytest.mark.parametrize("module,name,legacy", HOSTILE,
                         ids=[f"{m}.{n}{'-legacy' if lg else ''}" for m, n, lg in HOSTILE])
def test_convert_refuses_hostile_pickle(tmp_path, module, name, legacy):
    src_dir, out_dir = tmp_path / "src", tmp_path / "out"
    src_dir.mkdir()
    out_dir.mkdir()
    marker = tmp_path / "pwned"
    src = str(src_dir / "evil.pt")
    save_hostile(src, module, name, f"touch {marker}", legacy=legacy)
    with open(src, "rb") as f:
        assert f"c{module}\n{name}\n".encode() in f.read()
    dst = out_dir / "evil.zckpt"
    with pytest.raises(zckpt.UnsafeError) as e:
        zckpt.convert(src, dst)
    assert f"{module}.{name}" in str(e.value)
    assert "evil.pt" in str(e.value)
    assert os.listdir(out_dir) == [], "something was written at the destination"
    assert os.listdir(src_dir) == ["evil.pt"]
    assert not marker.exists()


def test_convert_default_destination_not_created(tmp_path):
    src = str(tmp_path / "evil.pt")
    save_hostile(src, "os", "system", "true")
    with pytest.raises(zckpt.UnsafeError, match=r"os\.system"):
        zckpt.convert(src)
    assert sorted(os.listdir(tmp_path)) == ["evil.pt"]


def test_cli_convert_refuses_hostile_pickle(tmp_path):
    src = str(tmp_path / "evil.pt")
    save_hostile(src, "os", "system", "true")
    r = run_cli("convert", src, "-o", tmp_path / "evil.zckpt")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "os.system" in r.stderr + r.stdout
    assert sorted(os.listdir(tmp_path)) == ["evil.pt"]


def _unsupported_global(message):
    m = re.search(r"GLOBAL ([\w.]+)", message)
    assert m, message
    return m.group(1)


@pytest.mark.parametrize("name", ["rng_states.pt", "extra_state_world_size_1_rank_0.pt"])
def test_weights_only_refuses_numpy(family, name):
    with pytest.raises(pickle.UnpicklingError) as by_torch:
        torch.load(family.pt(name), weights_only=True)
    with pytest.raises(pickle.UnpicklingError) as by_zckpt:
        zckpt.load(family.zckpt(name), map_location="cpu", weights_only=True)
    assert type(by_zckpt.value) is type(by_torch.value)
    refused = _unsupported_global(str(by_torch.value))
    assert refused.startswith("numpy.")
    assert refused in str(by_zckpt.value)


def test_weights_only_is_the_default(family):
    with pytest.raises(pickle.UnpicklingError, match="numpy"):
        zckpt.load(family.zckpt("rng_states.pt"))


@pytest.fixture
def config_file(tmp_path):
    obj = {"w": torch.arange(3.0), "config": Config("tiny", 2)}
    return obj, save_converted(obj, tmp_path, "config", allow_globals=[Config])


def test_custom_class_needs_explicit_permission_to_convert(tmp_path):
    pt = tmp_path / "config.pt"
    torch.save({"config": Config("tiny", 2)}, pt)
    with pytest.raises(zckpt.UnsafeError, match=r"refused global 'zckpt_testing\.Config' at pickle byte offset \d+"):
        zckpt.convert(pt, tmp_path / "config.zckpt")
    assert sorted(os.listdir(tmp_path)) == ["config.pt"]
    zckpt.convert(pt, tmp_path / "config.zckpt", allow_globals=["zckpt_testing.Config"])  # by name, or
    zckpt.convert(pt, tmp_path / "config2.zckpt", allow_globals=[Config])                 # the class itself


def test_weights_only_refuses_custom_class(config_file):
    obj, (pt, path) = config_file
    with pytest.raises(pickle.UnpicklingError) as by_torch:
        torch.load(pt, weights_only=True)
    assert _unsupported_global(str(by_torch.value)) == "zckpt_testing.Config"
    # zckpt's own vetting comes first: a class off its allowlist needs the caller's permission,
    # whatever weights_only says.
    for weights_only in (True, False):
        with pytest.raises(zckpt.UnsafeError, match=r"zckpt_testing\.Config") as vetted:
            zckpt.load(path, weights_only=weights_only)
        assert path in str(vetted.value)
    # Allowed by zckpt, the weights-only unpickler still refuses it as torch.load does.
    with pytest.raises(pickle.UnpicklingError) as by_zckpt:
        zckpt.load(path, weights_only=True, allow_globals=[Config])
    assert "zckpt_testing.Config" in str(by_zckpt.value)
    got = zckpt.load(path, weights_only=False, allow_globals=["zckpt_testing.Config"])
    assert got["config"] == Config("tiny", 2)
    assert torch.equal(got["w"], obj["w"])


def test_safe_globals_are_honoured(config_file):
    _, (pt, path) = config_file
    with torch.serialization.safe_globals([Config]):
        got = zckpt.load(path, weights_only=True)
        assert_deep_equal(got, torch.load(pt, weights_only=True))
    assert got["config"] == Config("tiny", 2)


def test_weights_only_runs_nothing(tmp_path):
    """A global off both allowlists but not on the deny list (a function of the caller's own)
    is refused by convert unless allowed; kept in the container with permission, loading it
    must still not call it: not without the permission again, and not with weights_only=True."""
    marker = tmp_path / "ran"
    obj = {"w": torch.ones(2), "side_effect": CallsGlobal(zckpt_testing.touch, str(marker))}
    with pytest.raises(zckpt.UnsafeError, match=r"zckpt_testing\.touch"):
        save_converted(obj, tmp_path, "touch")
    _, path = save_converted(obj, tmp_path, "touch", allow_globals=[zckpt_testing.touch])
    assert not marker.exists()
    for weights_only in (True, False):
        with pytest.raises(zckpt.UnsafeError, match=r"zckpt_testing\.touch"):
            zckpt.load(path, weights_only=weights_only)
    with pytest.raises(pickle.UnpicklingError, match="touch"):
        zckpt.load(path, weights_only=True, allow_globals=[zckpt_testing.touch])
    assert not marker.exists()
    # The caller's explicit choice, twice over (allowed by zckpt, weights_only=False for torch).
    got = zckpt.load(path, weights_only=False, allow_globals=["zckpt_testing.touch"])
    assert marker.exists() and got["side_effect"] == str(marker)


def test_load_into_optimizer_runs_nothing(tmp_path):
    """load_into never asks for weights_only=False, so nothing from the file may run: restoring
    an optimizer's param_groups must not call a global the pickle names (the converter keeps
    globals that are off its deny list, such as this harmless `touch`)."""
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    sd = opt.state_dict()
    marker = tmp_path / "ran"
    sd["param_groups"][0]["note"] = CallsGlobal(zckpt_testing.touch, str(marker))
    _, path = save_converted(sd, tmp_path, "optim", allow_globals=[zckpt_testing.touch])
    assert not marker.exists()
    for allow in ((), [zckpt_testing.touch]):
        try:
            zckpt.load_into(path, opt, allow_globals=allow)
        except (pickle.UnpicklingError, zckpt.UnsafeError):
            pass  # refusing, as weights_only=True refuses, is fine
    assert not marker.exists(), "load_into(optimizer) ran code from the checkpoint"
    assert "note" not in opt.param_groups[0] or opt.param_groups[0]["note"] != str(marker)
