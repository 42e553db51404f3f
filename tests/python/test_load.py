"""zckpt.load of converted torch-written files against torch.load of the originals.

Every file of the torch family (tests/fixtures/torch_family.py) is converted with zckpt.convert
and read back with zckpt.load(..., map_location='cpu', weights_only=False); the result must be
what torch.load gives for the original, deep-equal: values bit for bit (NaN included), dtype,
shape, strides, storage offsets, which tensors share storage or are the same object, Parameter
and DTensor types, OrderedDict `_metadata`, numpy arrays. The explicit tests below check the
same properties by hand on the files that exercise them.
"""
import collections
import math
import pathlib
import random
import zipfile

import numpy as np
import pytest
import torch

import torch_family
import zckpt
from torch_family import assert_deep_equal, diff

FAMILY_NAMES = [f.name for f in torch_family.FAMILY]


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_load_equals_torch_load(family, name):
    got = zckpt.load(family.zckpt(name), map_location="cpu", weights_only=False)
    assert_deep_equal(got, family.torch_load(name))


def test_deep_equal_has_teeth(family):
    """The comparison the suite relies on notices the differences it claims to check."""
    sd = family.torch_load("shared_storage.pt")
    assert diff(sd, family.torch_load("shared_storage.pt")) is None
    untied = collections.OrderedDict(sd)
    untied["lm_head.weight"] = sd["embed.weight"].clone()
    assert "share a storage" in diff(sd, untied)
    strided = collections.OrderedDict(sd)
    strided["col"] = sd["col"].contiguous()
    assert "stride" in diff(sd, strided)
    nan_payload = torch.tensor([float("nan")])
    other_nan = nan_payload.view(torch.int32).add(1).view(torch.float32)
    assert "storage bytes" in diff(nan_payload, other_nan)


def test_default_arguments_are_torch_load_defaults(family):
    # weights_only defaults to True, as in torch >= 2.6; a plain state dict loads under it.
    got = zckpt.load(family.zckpt("module_state_dict.pt"))
    assert_deep_equal(got, torch.load(family.pt("module_state_dict.pt")))


def test_path_like_and_file_objects(family):
    path = pathlib.Path(family.zckpt("dtypes.pt"))
    assert_deep_equal(zckpt.load(path, weights_only=False), family.torch_load("dtypes.pt"))
    with open(path, "rb") as f, pytest.raises(TypeError, match="paths"):
        zckpt.load(f)


def test_every_dtype_bit_exact(family):
    got = zckpt.load(family.zckpt("dtypes.pt"), weights_only=False)
    original = family.written("dtypes.pt").obj
    assert set(got) == set(original)
    float8 = {k for k in got if k.startswith("float8_") and not k.endswith("_2d_t")}
    assert float8 == {k for k in torch_family.FLOAT8_KINDS if hasattr(torch, k)}
    for key, want in original.items():
        t = got[key]
        assert t.dtype == want.dtype, key
        assert t.shape == want.shape and t.stride() == want.stride(), key
        assert t.contiguous().view(torch.uint8).tolist() == want.contiguous().view(torch.uint8).tolist(), key
    assert got["uint64"].dtype == torch.uint64 and got["uint64"][3].item() == 2**63 - 1
    assert got["int64"][0].item() == -(2**63)
    assert got["bool"].tolist() == [True, False, True, True, False]
    f32 = got["float32"]
    assert math.isnan(f32[4].item()) and f32[5].item() == math.inf and f32[6].item() == -math.inf
    assert math.copysign(1.0, f32[1].item()) == -1.0  # -0.0 kept
    assert got["bfloat16"][2].item() == 1.5 and got["float16"][3].item() == -2.25
    assert got["complex64"][2].imag.item() == math.inf
    assert got["float8_e4m3fn_2d_t"].stride() == (1, 4)


def test_tied_weights_and_views_share_storage(family):
    got = zckpt.load(family.zckpt("shared_storage.pt"), weights_only=False)
    assert got["lm_head.weight"] is got["embed.weight"]
    assert got["list"][0] is got["embed.weight"]
    base_ptr = got["base"].untyped_storage().data_ptr()
    for key, offset, stride in (("row", 20, (5, 1)), ("tail", 37, (1,)), ("col", 10, (20, 1))):
        assert got[key].untyped_storage().data_ptr() == base_ptr, key
        assert got[key].storage_offset() == offset and got[key].stride() == stride, key
    assert got["list"][1].untyped_storage().data_ptr() == base_ptr and got["list"][1].storage_offset() == 55
    assert got["flat_b"].untyped_storage().data_ptr() == got["flat_a"].untyped_storage().data_ptr()
    assert got["flat_b"].storage_offset() == 50 and got["flat_b"][4, 9].item() == 99
    got["base"][1, 0, 0] = -1.0  # one storage: a write through the base shows in its views
    assert got["row"][0, 0].item() == -1.0


def test_strides_and_offsets(family):
    got = zckpt.load(family.zckpt("strides.pt"), weights_only=False)
    original = family.written("strides.pt").obj
    for key, want in original.items():
        assert (got[key].stride(), got[key].storage_offset()) == (want.stride(), want.storage_offset()), key
        assert torch.equal(got[key], want), key
    assert got["expand"].stride() == (1, 0)
    assert not got["transpose"].is_contiguous()


def test_scalars_and_empty(family):
    got = zckpt.load(family.zckpt("scalars_empty.pt"), weights_only=False)
    assert got["f32_scalar"].dim() == 0 and got["f32_scalar"].item() == 3.5
    assert got["i64_scalar"].item() == -7 and got["bool_scalar"].item() is True
    assert got["c64_scalar"].item() == 1 + 2j and math.isnan(got["nan_scalar"].item())
    assert got["empty_2d"].shape == (0, 4) and got["empty_2d"].dtype == torch.int32
    assert got["empty_mid"].shape == (3, 0, 2)
    view = got["empty_view_offset"]
    assert view.numel() == 0 and view.storage_offset() == 5
    assert view.untyped_storage().data_ptr() == got["base"].untyped_storage().data_ptr()
    assert got["element_of_base"].storage_offset() == 7 and got["element_of_base"].item() == 7.0


def test_parameters(family):
    got = zckpt.load(family.zckpt("parameters.pt"), weights_only=False)
    assert type(got["p_grad"]) is torch.nn.Parameter and got["p_grad"].requires_grad
    assert type(got["p_frozen"]) is torch.nn.Parameter and not got["p_frozen"].requires_grad
    assert got["p_bf16"].dtype == torch.bfloat16
    assert type(got["plain_requires_grad"]) is torch.Tensor and got["plain_requires_grad"].requires_grad
    assert got["in_list"][0] is got["p_grad"]
    assert torch.equal(got["p_grad"].detach(), family.written("parameters.pt").obj["p_grad"].detach())


def test_module_state_dict_keeps_metadata(family):
    got = zckpt.load(family.zckpt("module_state_dict.pt"), weights_only=False)
    want = family.torch_load("module_state_dict.pt")
    assert type(got) is collections.OrderedDict
    assert list(got) == list(want)
    assert got._metadata == want._metadata and got._metadata[""]["version"] == 1
    assert "bn" in got._metadata
    assert got["bn.num_batches_tracked"].dtype == torch.int64 and got["bn.num_batches_tracked"].item() == 3
    assert got["mask"].dtype == torch.bool
    # head.weight is tied to embed.weight in the module; state_dict() detaches each name.
    assert got["head.weight"].untyped_storage().data_ptr() == got["embed.weight"].untyped_storage().data_ptr()


def test_optimizer_state_after_adam_steps(family):
    got = zckpt.load(family.zckpt("optimizer_adam.pt"), weights_only=False)
    want = family.torch_load("optimizer_adam.pt")
    assert sorted(got["state"]) == sorted(want["state"])
    for idx, st in want["state"].items():
        assert got["state"][idx]["step"].dim() == 0 and got["state"][idx]["step"].item() == 3.0
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(got["state"][idx][k], st[k]), (idx, k)
    assert got["param_groups"] == want["param_groups"]
    assert got["param_groups"][0]["betas"] == (0.9, 0.999) and got["param_groups"][0]["lr"] == 0.005


def test_lr_schedulers(family):
    got = zckpt.load(family.zckpt("lr_schedulers.pt"), weights_only=False)
    want = family.torch_load("lr_schedulers.pt")
    assert got == want
    assert got["step"]["last_epoch"] == 3 and got["cosine"]["T_max"] == 10


def test_rng_states_with_numpy(family):
    got = zckpt.load(family.zckpt("rng_states.pt"), weights_only=False)
    original = family.written("rng_states.pt").obj
    assert got["cpu"].dtype == torch.uint8 and torch.equal(got["cpu"], original["cpu"])
    kind, keys, pos, has_gauss, cached = got["numpy"]
    assert kind == "MT19937" and keys.dtype == np.uint32 and keys.shape == (624,)
    assert np.array_equal(keys, original["numpy"][1]) and pos == original["numpy"][2]
    assert got["random"] == original["random"]
    assert isinstance(got["numpy_array_f32"], np.ndarray) and got["numpy_array_f32"].dtype == np.float32
    assert got["numpy_array_f32"].tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert type(got["numpy_scalar"]) is np.float64 and got["numpy_scalar"] == 2.5
    # The restored states replay the same streams.
    rs = np.random.RandomState()
    rs.set_state(got["numpy"])
    assert rs.randint(0, 2**31, 4).tolist() == np.random.RandomState(7).randint(0, 2**31, 4).tolist()
    r = random.Random()
    r.setstate(got["random"])
    assert r.random() == random.Random(7).random()
    torch.set_rng_state(got["cpu"])
    a = torch.rand(3)
    torch.set_rng_state(original["cpu"])
    assert torch.equal(a, torch.rand(3))


def test_containers_bytes_huge_ints_nan(family):
    got = zckpt.load(family.zckpt("containers.pt"), weights_only=False)
    assert got["huge_ints"] == [2**100, -(2**70), 2**63, -(2**63) - 1, 2**64, 0, -1]
    assert got["bytes"] == bytes(range(256)) and type(got["bytearray"]) is bytearray
    assert math.isnan(got["floats"][0]) and got["floats"][1:3] == [math.inf, -math.inf]
    assert math.copysign(1, got["floats"][3]) == -1 and got["floats"][4] == 1e-310
    assert got["set"] == {1, 2, "x", (3, 4)} and type(got["frozenset"]) is frozenset
    assert got["dict"][(1, 2)] == "tuple key" and got["dict"][None] == "none key"
    assert got["text"] == "naïve – 模型 ✓ \U0001F600" and got["complex"] == complex(1.5, -2)
    assert type(got["ordered"]) is collections.OrderedDict and list(got["ordered"]) == ["z", "a"]
    deep = got["list"][1][1]["deep"]
    assert deep[0] is got["list"][0] and deep[1][0].dtype == torch.int8


def test_legacy_format_views_and_ties(family):
    assert family.written("legacy.pt").format == "legacy"
    with open(family.pt("legacy.pt"), "rb") as f:
        assert not zipfile.is_zipfile(f)
    got = zckpt.load(family.zckpt("legacy.pt"), weights_only=False)
    assert got["tied"][0] is got["tied"][1] is got["base"]
    ptr = got["base"].untyped_storage().data_ptr()
    assert got["row"].untyped_storage().data_ptr() == ptr and got["row"].storage_offset() == 12
    assert got["col_t"].stride() == (1, 6) and torch.equal(got["col_t"], got["base"].t()[1:4])
    assert type(got["param"]) is torch.nn.Parameter
    assert math.isnan(got["meta"]["nan"]) and got["meta"]["huge"] == 2**100


@pytest.mark.parametrize("name,protocol", [("containers.pt", 2), ("protocol4.pt", 4), ("protocol5.pt", 5)])
def test_pickle_protocols(family, name, protocol):
    with zipfile.ZipFile(family.pt(name)) as z:
        (pkl,) = [n for n in z.namelist() if n.endswith("/data.pkl")]
        assert z.read(pkl)[:2] == bytes([0x80, protocol])
    got = zckpt.load(family.zckpt(name), weights_only=False)
    assert_deep_equal(got, family.torch_load(name))
    assert got["huge_ints"][0] == 2**100


def test_dtensor_triple(family):
    from torch.distributed.tensor import DTensor, Replicate, Shard

    model = zckpt.load(family.zckpt("model_world_size_1_rank_0.pt"), weights_only=False)
    want = family.torch_load("model_world_size_1_rank_0.pt")
    w = model["model.embed_tokens.weight"]
    assert type(w) is DTensor and w.placements == (Shard(0),) and w.shape == (32, 8)
    assert torch.equal(w.to_local(), want["model.embed_tokens.weight"].to_local())
    assert model["model.layers.0.input_layernorm.weight"].placements == (Replicate(),)
    optim = zckpt.load(family.zckpt("optim_world_size_1_rank_0.pt"), weights_only=False)
    assert type(optim["state"][0]["exp_avg"]) is DTensor and optim["state"][0]["step"].item() == 3.0
    extra = zckpt.load(family.zckpt("extra_state_world_size_1_rank_0.pt"), weights_only=False)
    assert set(extra["rng"]) == {"cpu", "cuda", "numpy", "random"}
    assert extra["lr_scheduler"] == family.torch_load("extra_state_world_size_1_rank_0.pt")["lr_scheduler"]
    assert extra["lr_scheduler"]["last_epoch"] == 1


def test_dtensor_weights_only(family):
    got = zckpt.load(family.zckpt("model_world_size_1_rank_0.pt"), map_location="cpu", weights_only=True)
    assert_deep_equal(got, family.torch_load("model_world_size_1_rank_0.pt", weights_only=True))


@pytest.mark.parametrize("name", ["module_state_dict.pt", "dtypes.pt", "shared_storage.pt", "strides.pt",
                                  "scalars_empty.pt", "parameters.pt", "optimizer_adam.pt", "legacy_state_dict.pt"])
def test_weights_only_plain_state_dicts(family, name):
    got = zckpt.load(family.zckpt(name), map_location="cpu", weights_only=True)
    assert_deep_equal(got, family.torch_load(name, weights_only=True))


def test_verify_false_loads_the_same(family):
    got = zckpt.load(family.zckpt("strides.pt"), weights_only=False, verify=False)
    assert_deep_equal(got, family.torch_load("strides.pt"))


def test_export_round_trip(family, tmp_path):
    out = tmp_path / "back.pt"
    zckpt.export(family.zckpt("shared_storage.pt"), out)
    assert_deep_equal(torch.load(out, weights_only=False), family.torch_load("shared_storage.pt"))


@pytest.mark.parametrize("name", ["compressible.pt", "dtypes.pt", "shared_storage.pt", "legacy.pt"])
@pytest.mark.parametrize("zstd_level,chunk_bytes", [(0, 4096), (3, 65536), (19, 0)],
                         ids=["raw-4k-chunks", "zstd3-64k-chunks", "zstd19"])
def test_convert_options(family, tmp_path, name, zstd_level, chunk_bytes):
    """Storages split over many chunks, compressed or not, load the same."""
    dst = tmp_path / (name + ".zckpt")
    stats = zckpt.convert(family.pt(name), dst, zstd_level=zstd_level, chunk_bytes=chunk_bytes)
    if name == "compressible.pt":
        assert stats["chunks"] >= (512 if chunk_bytes == 4096 else 32 if chunk_bytes else 1)
        assert (stats["compressed_chunks"] > 0) == (zstd_level > 0)
        assert stats["file_bytes"] < 1 << 20 or zstd_level == 0
    got = zckpt.load(dst, map_location="cpu", weights_only=False)
    assert_deep_equal(got, family.torch_load(name))
    assert zckpt.verify(dst) == []
