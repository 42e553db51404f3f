"""`.pt` -> convert -> verify -> export -> torch.load, for every file of the torch-written family,
and what `zckpt ls --json` says about each, checked against the object torch saved."""
from __future__ import annotations

import filecmp
import os
import shutil

import pytest
import torch

from conftest import FAMILY_NAMES, LEGACY_NAMES, ZIP_NAMES, rewrite_zip, zip_prefix, zip_records
from torch_family import assert_deep_equal, diff, is_dtensor, is_sharded, local_of


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_convert_verify_export_roundtrip(name, family, original, converted, verified, exported):
    w = family[name]
    run, dst = converted[name]
    assert run.rc == 0, f"convert {name} exited {run.rc}:\n{run.text}"
    assert run.out == "" and os.path.getsize(dst) > 128

    report, verify_run = verified
    assert report[name]["file"] == dst
    assert (report[name]["status"], report[name]["problems"]) == ("ok", []), report[name]
    assert report[name]["bytes"] == os.path.getsize(dst)
    assert verify_run.rc == (0 if all(r["status"] == "ok" for r in report.values()) else 1), verify_run.text

    export_run, back_path = exported[name]
    assert export_run.rc == 0, export_run.text
    back = w.load(back_path)
    assert_deep_equal(back, original(name))
    if w.loads_as_saved:
        assert_deep_equal(back, w.obj)  # and the object that was saved, storage sharing included


def test_verify_text_output(converted, zckpt):
    dst = converted["strides.pt"][1]
    run = zckpt("verify", dst)
    assert run.rc == 0 and run.out.startswith(f"{dst}: OK (") and "GB/s)" in run.out, run.text
    assert zckpt("verify", "--quiet", dst).out == ""


@pytest.mark.parametrize("name", LEGACY_NAMES)
def test_legacy_export_is_byte_identical(name, family, exported):
    assert filecmp.cmp(family[name].path, exported[name][1], shallow=False)


@pytest.mark.parametrize("name", ZIP_NAMES)
def test_zip_export_keeps_every_record(name, family, exported):
    """The exported archive has the source's prefix and records, in order, each byte-identical."""
    back = exported[name][1]
    assert zip_prefix(back) == zip_prefix(family[name].path)
    want, got = zip_records(family[name].path), zip_records(back)
    assert list(got) == list(want)
    for record in want:
        assert got[record] == want[record], f"record {record} differs"


# ---- what ls --json says, against the Python object -----------------------------------------


def expected_tensors(obj):
    """[(name, tensor)] in the naming of src/pickle/torch_model.h: dict keys and list/tuple
    indices joined with '.', depth-first, a tensor reached twice (memo) recorded under each of
    its paths, the whole pickle a tensor -> `tensor`, a taken name gets `~1`, `~2`."""
    out, taken = [], set()

    def add(path, t):
        name, n = path or "tensor", 0
        while name in taken:
            n += 1
            name = f"{path}~{n}"
        taken.add(name)
        out.append((name, t))

    def walk(x, path):
        join = lambda k: f"{path}.{k}" if path else str(k)  # noqa: E731
        if isinstance(x, torch.Tensor):
            add(path, x)
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(v, join(k))
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                walk(v, join(i))
        elif isinstance(x, torch.nn.Module):
            walk(vars(x), path)  # a BUILD state sits at the object's own path

    walk(obj, "")
    return out


def _has_record(t):
    """Dense tensors are one record each; meta tensors none (no storage); sparse and nested
    tensors are their component tensors (`<name>.<arg>...`)."""
    if is_sharded(t):
        return True
    return t.device.type != "meta" and not t.is_nested and t.layout == torch.strided


def _has_parts(t):
    return not is_sharded(t) and (t.is_nested or t.layout != torch.strided)


def expected_record(t):
    flags = set()
    if is_sharded(t):  # its one local shard is the record
        flags.add("sharded")
        t = local_of(t)
    if isinstance(t, torch.nn.Parameter):
        flags.add("param")
    if t.requires_grad:
        flags.add("grad")
    if is_dtensor(t):
        flags.add("dtensor")
        t = t._local_tensor
    if t.is_quantized:
        flags.add("quantized")
    else:
        if t.is_conj():
            flags.add("conj")
        if t.is_neg():
            flags.add("neg")
    return {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape), "stride": list(t.stride()),
            "storage_offset": t.storage_offset(), "flags": flags}


def helper_tensor_names(records, tensors):
    """Records ls may add besides the object's tensors: a DTensor's mesh (`<name>._spec...`), a
    per-channel quantizer (`<name>.scales`, `<name>.zero_points`), the parts of a sparse or
    nested tensor (`<name>.1.0`, ...)."""
    owners = [name for name, t in tensors if is_dtensor(t) or (not is_sharded(t) and t.is_quantized)]
    parts = [name + "." for name, t in tensors if _has_parts(t)]
    return {r for r in records
            if any(r.startswith(name + "._spec.") or r in (name + ".scales", name + ".zero_points") for name in owners)
            or any(r.startswith(p) for p in parts)}


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_ls_matches_saved_object(name, original, listings):
    ls = listings[name]
    all_tensors = expected_tensors(original(name))
    tensors = [(n, t) for n, t in all_tensors if _has_record(t)]
    records = {r["name"]: r for r in ls["tensors"]}
    assert len(records) == len(ls["tensors"]), "tensor names are not unique"
    want_names = [n for n, _ in tensors]
    extras = helper_tensor_names(records, all_tensors)
    assert [r["name"] for r in ls["tensors"] if r["name"] not in extras] == want_names

    storage_of = {}  # python storage -> ls storage index
    for tname, t in tensors:
        r = records[tname]
        got = dict(r, flags=set(filter(None, r["flags"].split(","))))
        want = expected_record(t)
        assert {k: got[k] for k in want} == want, tname
        local = local_of(t)
        if not local.is_quantized and local.untyped_storage().nbytes():
            storage_of.setdefault(local.untyped_storage().data_ptr(), set()).add(r["storage"])
    # Tensors share an ls storage exactly when they share a torch storage.
    assert all(len(s) == 1 for s in storage_of.values()), storage_of
    indices = [next(iter(s)) for s in storage_of.values()]
    assert len(set(indices)) == len(indices)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_ls_storages_and_metadata(name, family, listings):
    w, ls = family[name], listings[name]
    meta = ls["metadata"]
    assert meta["zckpt.source.format"] == w.format
    assert meta["zckpt.source.name"] == name
    assert meta["zckpt.source.bytes"] == str(os.path.getsize(w.path))
    # Format 1.1 only when a dtype needs it (bcomplex32, spec §9): the lowest version that holds it.
    assert ls["version"] == ("1.1" if any(t["dtype"] == "bcomplex32" for t in ls["tensors"]) else "1.0")
    if w.format == "zip":
        records = zip_records(w.path)
        assert meta["zckpt.source.prefix"] == zip_prefix(w.path)
        storages = {k: len(v) for k, v in records.items() if k.startswith("data/")}
        assert {"data/" + s["key"]: s["bytes"] for s in ls["storages"]} == storages
        assert {b["name"] for b in ls["blobs"]} == set(records) - set(storages)
    location = "cuda:0" if name == "cuda_shard.pt" else "cpu"
    assert {s["location"] for s in ls["storages"]} <= {location}
    assert ls["chunks"]["raw_bytes"] == sum(s["bytes"] for s in ls["storages"])
    assert ls["chunks"]["zstd"] == 0  # default options: no compression


def _by_name(ls):
    return {r["name"]: r for r in ls["tensors"]}


def test_ls_state_dict_and_tied_weights(family, listings):
    sd = family["module_state_dict.pt"].obj
    ls = listings["module_state_dict.pt"]
    t = _by_name(ls)
    assert [r["name"] for r in ls["tensors"]] == list(sd.keys())
    assert "embed.weight" in t and "head.weight" in t and "bn.num_batches_tracked" in t
    assert t["embed.weight"]["storage"] == t["head.weight"]["storage"]  # tied
    assert t["bn.num_batches_tracked"]["dtype"] == "int64" and t["bn.num_batches_tracked"]["shape"] == []
    assert t["mask"]["dtype"] == "bool"
    # Every storage once: 16x8 f32 embedding counted once for the two tied names.
    distinct = {v.untyped_storage().data_ptr(): v.untyped_storage().nbytes() for v in sd.values()}
    assert len(ls["storages"]) == len(distinct)
    assert ls["chunks"]["raw_bytes"] == sum(distinct.values())
    emb = ls["storages"][t["embed.weight"]["storage"]]
    assert emb["bytes"] == 16 * 8 * 4


def test_ls_shared_storage_views(listings):
    t = _by_name(listings["shared_storage.pt"])
    # The same tensor object twice: a record under each path, the same view of one storage.
    emb = t["embed.weight"]
    for alias in ("lm_head.weight", "list.0"):
        assert {k: v for k, v in t[alias].items() if k != "name"} == {k: v for k, v in emb.items() if k != "name"}
    base = t["base"]["storage"]
    assert [t[n]["storage"] for n in ("row", "tail", "col", "list.1")] == [base] * 4
    assert (t["row"]["storage_offset"], t["row"]["shape"]) == (20, [4, 5])
    assert (t["tail"]["storage_offset"], t["tail"]["shape"]) == (37, [23])
    assert (t["col"]["storage_offset"], t["col"]["stride"]) == (10, [20, 1])
    assert (t["list.1"]["storage_offset"], t["list.1"]["shape"]) == (55, [5])
    assert t["flat_a"]["storage"] == t["flat_b"]["storage"] != base
    assert t["flat_b"]["storage_offset"] == 50
    assert len(listings["shared_storage.pt"]["storages"]) == 3


def test_ls_optimizer_state(family, listings):
    sd = family["optimizer_adam.pt"].obj
    t = _by_name(listings["optimizer_adam.pt"])
    assert len(sd["state"]) >= 8
    for i, st in sd["state"].items():
        for k in ("exp_avg", "exp_avg_sq"):
            assert t[f"state.{i}.{k}"]["shape"] == list(st[k].shape)
            assert t[f"state.{i}.{k}"]["dtype"] == "float32"
        assert t[f"state.{i}.step"]["shape"] == [] and t[f"state.{i}.step"]["dtype"] == "float32"
    assert not any(n.startswith("param_groups") for n in t)


def test_ls_dtypes(family, listings):
    t = _by_name(listings["dtypes.pt"])
    for key, v in family["dtypes.pt"].obj.items():
        assert t[key]["dtype"] == str(v.dtype).replace("torch.", ""), key
        assert t[key]["bytes"] == v.numel() * v.element_size(), key
    for kind in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"):
        if hasattr(torch, kind):
            assert t[kind]["dtype"] == kind
    assert t["float8_e4m3fn_2d_t"]["stride"] == [1, 4]


def test_ls_flags(listings):
    p = _by_name(listings["parameters.pt"])
    assert p["p_grad"]["flags"] == "param,grad"
    assert p["p_frozen"]["flags"] == "param"
    assert p["plain_requires_grad"]["flags"] == "grad"
    assert p["in_list.1"]["flags"] == "param,grad"
    c = _by_name(listings["conj_neg.pt"])
    assert c["conj"]["flags"] == "conj" and c["neg"]["flags"] == "neg"
    assert c["plain_complex"]["flags"] == ""


def test_ls_dtensor_extra(listings):
    t = _by_name(listings["model_world_size_1_rank_0.pt"])
    emb = t["model.embed_tokens.weight"]
    assert emb["flags"] == "dtensor" and emb["dtype"] == "bfloat16"
    assert emb["extra"]["placements"] == [{"type": "Shard", "dim": 0}]
    assert emb["extra"]["global_shape"] == [32, 8] and emb["extra"]["mesh_shape"] == [1]
    norm = t["model.layers.0.input_layernorm.weight"]
    assert norm["extra"]["placements"] == [{"type": "Replicate"}]
    o = _by_name(listings["optim_world_size_1_rank_0.pt"])
    assert o["state.0.exp_avg"]["flags"] == "dtensor"
    assert o["state.0.exp_avg"]["extra"]["placements"] == [{"type": "Shard", "dim": 0}]
    assert o["state.0.step"]["flags"] == ""


def test_ls_quantized_extra(listings):
    t = _by_name(listings["quantized.pt"])
    q = t["per_tensor"]
    assert (q["dtype"], q["flags"]) == ("quint8", "quantized")
    assert q["extra"]["qscheme"] == "per_tensor_affine"
    assert q["extra"]["scale"] == pytest.approx(0.05) and q["extra"]["zero_point"] == 3
    pc = t["per_channel"]
    assert pc["dtype"] == "qint8" and pc["extra"]["axis"] == 0
    assert t["per_channel.scales"]["dtype"] == "float64" and t["per_channel.scales"]["shape"] == [4]


def test_ls_many_tensors(listings):
    ls = listings["many_tensors.pt"]
    assert len(ls["tensors"]) == 20_000 and len(ls["storages"]) == 20_000
    assert ls["tensors"][12345]["name"] == "layers.1543.p1"
    assert ls["tensors"][12345]["shape"] == [4]


# ---- options and destinations -----------------------------------------------------------------


@pytest.mark.parametrize("src_name,dst_name", [
    ("model.pt", "model.zckpt"),
    ("model.pth", "model.zckpt"),
    ("pytorch_model.bin", "pytorch_model.zckpt"),
    ("weights.ckpt", "weights.ckpt.zckpt"),
])
def test_default_destination(src_name, dst_name, family, zckpt, tmp_path):
    src = tmp_path / src_name
    shutil.copy(family["strides.pt"].path, src)
    zckpt.ok("convert", "--quiet", src)
    assert sorted(os.listdir(tmp_path)) == sorted([src_name, dst_name])
    zckpt.ok("verify", tmp_path / dst_name)


def _convert(family, zckpt, tmp_path, name, *options):
    """Converts family file `name` with options; returns (fixture, destination, ls --json)."""
    w = family[name]
    dst = tmp_path / "c.zckpt"
    zckpt.ok("convert", "--quiet", *options, w.path, "-o", dst)
    return w, dst, zckpt.ls(dst)


def _roundtrip(w, zckpt, dst, tmp_path):
    zckpt.ok("verify", dst)
    exported = tmp_path / "exported.pt"
    zckpt.ok("export", dst, "-o", exported)
    assert_deep_equal(w.load(exported), w.load())
    return exported


def test_zstd_compresses_and_roundtrips(family, zckpt, tmp_path):
    w, dst, ls = _convert(family, zckpt, tmp_path, "compressible.pt", "--zstd", "3")
    big = next(s for s in ls["storages"] if s["bytes"] == 2 << 20)
    assert big["chunks"] == 1 and ls["chunks"]["zstd"] >= 1
    assert ls["chunks"]["stored_bytes"] < ls["chunks"]["raw_bytes"] // 10
    assert os.path.getsize(dst) < os.path.getsize(w.path) // 10
    _roundtrip(w, zckpt, dst, tmp_path)


def test_small_chunks_roundtrip(family, zckpt, tmp_path):
    w, dst, ls = _convert(family, zckpt, tmp_path, "compressible.pt", "--chunk-bytes", "4096")
    assert ls["chunk_bytes"] == 4096
    big = next(s for s in ls["storages"] if s["bytes"] == 2 << 20)
    assert big["chunks"] == 512 and big["contiguous"] is True
    assert ls["chunks"]["count"] == 512 + 1 and ls["chunks"]["zstd"] == 0
    _roundtrip(w, zckpt, dst, tmp_path)


def test_small_zstd_chunks_roundtrip(family, zckpt, tmp_path):
    w, dst, ls = _convert(family, zckpt, tmp_path, "compressible.pt", "--zstd", "3", "--chunk-bytes", "4K")
    assert ls["chunks"]["count"] == 513 and ls["chunks"]["zstd"] >= 512
    _roundtrip(w, zckpt, dst, tmp_path)


def test_zstd_on_incompressible_data_stays_raw(family, zckpt, tmp_path):
    w, dst, ls = _convert(family, zckpt, tmp_path, "dtypes.pt", "--zstd", "19")
    assert ls["chunks"]["stored_bytes"] <= ls["chunks"]["raw_bytes"]
    _roundtrip(w, zckpt, dst, tmp_path)


@pytest.mark.parametrize("options", [("--zstd", "3"), ("--chunk-bytes", "4096", "--zstd", "1")])
def test_legacy_with_options_is_byte_identical(options, family, zckpt, tmp_path):
    w, dst, _ = _convert(family, zckpt, tmp_path, "legacy.pt", *options)
    assert filecmp.cmp(w.path, _roundtrip(w, zckpt, dst, tmp_path), shallow=False)


def test_cuda_locations_load_with_map_location(family, exported):
    """Storages that say cuda:0 are recorded, never acted on; the export says cuda:0 again."""
    back = exported["cuda_shard.pt"][1]
    assert b"cuda:0" in zip_records(back)["data.pkl"]
    assert diff(torch.load(back, weights_only=False, map_location="cpu"), family["cuda_shard.pt"].obj) is None


# ---- archives torch did not write, that torch.load reads ---------------------------------------


def _convert_export(zckpt, src, tmp_path):
    zckpt.ok("convert", "--quiet", src, "-o", tmp_path / "x.zckpt")
    zckpt.ok("verify", tmp_path / "x.zckpt")
    zckpt.ok("export", tmp_path / "x.zckpt", "-o", tmp_path / "back.pt")
    return tmp_path / "back.pt"


def test_unreferenced_records_come_back(family, zckpt, tmp_path):
    """Records no tensor references (a stray data/ record, an extra file) are kept verbatim."""
    w = family["strides.pt"]
    src = tmp_path / "extra.pt"
    rewrite_zip(w.path, src, add={"data/99": b"unreferenced", "notes/readme.txt": b"hello"})
    back = _convert_export(zckpt, src, tmp_path)
    assert zip_records(back) == zip_records(src)
    assert_deep_equal(torch.load(back, weights_only=False), w.obj)


def test_reordered_archive_keeps_its_order(family, zckpt, tmp_path):
    w = family["shared_storage.pt"]
    src = tmp_path / "reordered.pt"
    records = zip_records(w.path)
    rewrite_zip(w.path, src, drop=set(records), add=dict(reversed(list(records.items()))))
    assert list(zip_records(src))[-1] == "data.pkl"
    back = _convert_export(zckpt, src, tmp_path)
    assert list(zip_records(back)) == list(zip_records(src))
    assert_deep_equal(torch.load(back, weights_only=False), w.obj)


def test_record_name_with_newline_round_trips(family, zckpt, tmp_path):
    """Record names are kept NUL-separated (zckpt.source.records), so any other byte survives."""
    w = family["strides.pt"]
    src = tmp_path / "newline.pt"
    rewrite_zip(w.path, src, add={"extra\nrecord": b"hello"})
    assert_deep_equal(torch.load(src, weights_only=False), w.obj)  # torch reads it
    back = _convert_export(zckpt, src, tmp_path)
    assert zip_records(back) == zip_records(src)
    assert any("extra\nrecord" in name for name in zip_records(back))


def test_record_name_with_nul_is_refused(family, zckpt, tmp_path):
    """A NUL ends a zip name for C readers (torch's miniz): two readers would see two names."""
    w = family["strides.pt"]
    src = tmp_path / "nul.pt"
    rewrite_zip(w.path, src, add={"badXname": b"hello"})  # Python's zipfile cuts names at a NUL
    data = src.read_bytes()
    assert data.count(b"badXname") == 2  # local header and central directory
    src.write_bytes(data.replace(b"badXname", b"bad\x00name"))
    run = zckpt("convert", "--quiet", src, "-o", tmp_path / "x.zckpt")
    assert run.rc == 1 and "NUL" in run.err, run.text
    assert not (tmp_path / "x.zckpt").exists()


def test_legacy_trailer_comes_back_byte_identical(family, zckpt, tmp_path):
    w = family["legacy.pt"]
    src = tmp_path / "trailer.pt"
    src.write_bytes(open(w.path, "rb").read() + b"bytes after the data section")
    assert_deep_equal(torch.load(src, weights_only=False), w.obj)
    assert filecmp.cmp(src, _convert_export(zckpt, src, tmp_path), shallow=False)


def test_deflated_archive_is_refused_cleanly(family, zckpt, tmp_path):
    """torch.load reads DEFLATEd records; zckpt reads STORED ones in place and says so."""
    import zipfile

    w = family["strides.pt"]
    src = tmp_path / "deflated.pt"
    with zipfile.ZipFile(src, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data in zip_records(w.path).items():
            z.writestr(f"strides/{name}", data)
    assert_deep_equal(torch.load(src, weights_only=False), w.obj)
    (tmp_path / "out").mkdir()
    run = zckpt("convert", "--quiet", src, "-o", tmp_path / "out" / "x.zckpt")
    assert run.rc == 2, run.text
    assert "compressed" in run.err and str(src) in run.err
    assert os.listdir(tmp_path / "out") == []
