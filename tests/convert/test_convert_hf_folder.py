"""Hugging Face model folders convert as a whole: safetensors shards (and legacy
pytorch_model-*.bin shards) converted, the shard index rewritten to name the new files (every
other field kept), every other file copied unchanged.

The folders are laid out as transformers' save_pretrained writes them (shards named
model-0000K-of-0000N.safetensors, the index as json.dumps(index, indent=2, sort_keys=True) +
"\\n"), written with safetensors and torch directly: transformers is not a dependency of this
project (installing it in CI costs more than the layout it would provide)."""
from __future__ import annotations

import filecmp
import json
import os

import pytest
import torch

zckpt_py = pytest.importorskip("zckpt")
from safetensors.torch import load_file, save_file  # noqa: E402

OTHER = {"config.json": '{"model_type": "llama", "hidden_size": 8}\n', "generation_config.json": "{}\n",
         "tokenizer.json": '{"version": "1.0", "model": {"vocab": {"a": 0}}}\n', "tokenizer_config.json": "{}\n",
         "special_tokens_map.json": "{}\n", "tokenizer.model": "\x00sentencepiece\x01"}


def state(n=6):
    g = torch.Generator().manual_seed(0)
    out = {"model.embed_tokens.weight": torch.randn(16, 8, generator=g).to(torch.bfloat16)}
    for i in range(n):
        out[f"model.layers.{i}.self_attn.q_proj.weight"] = torch.randn(8, 8, generator=g).to(torch.bfloat16)
        out[f"model.layers.{i}.input_layernorm.weight"] = torch.ones(8)
    out["lm_head.weight"] = torch.randn(16, 8, generator=g).to(torch.bfloat16)
    return out


def write_sharded(folder, tensors, shards, kind):
    """transformers' layout: `kind` "safetensors" -> model-0000K-of-0000N.safetensors and
    model.safetensors.index.json; "bin" -> pytorch_model-0000K-of-0000N.bin and
    pytorch_model.bin.index.json."""
    os.makedirs(folder, exist_ok=True)
    names = list(tensors)
    per = (len(names) + shards - 1) // shards
    weight_map, total = {}, 0
    for k in range(shards):
        part = {n: tensors[n].contiguous() for n in names[k * per:(k + 1) * per]}
        stem = "model" if kind == "safetensors" else "pytorch_model"
        file = f"{stem}-{k + 1:05d}-of-{shards:05d}.{kind}"
        if kind == "safetensors":
            save_file(part, os.path.join(folder, file), metadata={"format": "pt"})
        else:
            torch.save(part, os.path.join(folder, file))
        for n, t in part.items():
            weight_map[n] = file
            total += t.numel() * t.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    index_name = "model.safetensors.index.json" if kind == "safetensors" else "pytorch_model.bin.index.json"
    with open(os.path.join(folder, index_name), "w") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
    for name, text in OTHER.items():
        with open(os.path.join(folder, name), "w", encoding="latin-1") as f:
            f.write(text)
    return index_name


def tree(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


@pytest.mark.parametrize("kind", ["safetensors", "bin"])
def test_sharded_folder_converts_as_a_whole(kind, zckpt, tmp_path):
    tensors = state()
    src, out = tmp_path / "model", tmp_path / "out"
    index_name = write_sharded(src, tensors, 3, kind)
    run = zckpt.ok("convert", src, "-o", out, "-j", "2")
    stem = "model" if kind == "safetensors" else "pytorch_model"
    shards = [f"{stem}-{k:05d}-of-00003" for k in (1, 2, 3)]
    # The index names containers, so it is named for them: transformers does not take it for a
    # safetensors / .bin index (and then fail inside torch.load with "Unsupported operand").
    out_index = f"{stem}.zckpt.index.json"
    assert tree(out) == sorted([s + ".zckpt" for s in shards] + [out_index] + list(OTHER))
    for name in OTHER:
        assert filecmp.cmp(src / name, out / name, shallow=False), name
    assert f"{src / index_name} -> {out / out_index} (index rewritten" in run.out
    # The index names the containers, and nothing else changed.
    before = json.loads((src / index_name).read_text())
    after = json.loads((out / out_index).read_text())
    assert after["metadata"] == before["metadata"]
    assert after["weight_map"] == {k: v.rsplit(".", 1)[0] + ".zckpt" for k, v in before["weight_map"].items()}
    assert (out / out_index).read_text().endswith("}\n")
    # Every tensor is where the new index says, equal to the original.
    loaded = {}
    for shard in sorted(set(after["weight_map"].values())):
        part = zckpt_py.load(out / shard)
        assert set(part) == {k for k, v in after["weight_map"].items() if v == shard}
        loaded.update(part)
    assert set(loaded) == set(tensors)
    for k, t in tensors.items():
        assert loaded[k].dtype == t.dtype and torch.equal(loaded[k], t), k
    if kind == "safetensors":  # and each shard goes back byte for byte
        back = tmp_path / "back.safetensors"
        zckpt.ok("export", out / (shards[0] + ".zckpt"), "-o", back)
        assert back.read_bytes() == (src / (shards[0] + ".safetensors")).read_bytes()
        assert zckpt.ls(out / (shards[1] + ".zckpt"))["metadata"]["zckpt.source.metadata"] == '{"format":"pt"}'


def test_single_file_model_folder(zckpt, tmp_path):
    src, out = tmp_path / "m", tmp_path / "out"
    src.mkdir()
    tensors = state(2)
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    (src / "config.json").write_text("{}\n")
    zckpt.ok("convert", "--quiet", src, "-o", out)
    assert tree(out) == ["config.json", "model.zckpt"]
    got = zckpt_py.load(out / "model.zckpt")
    want = load_file(src / "model.safetensors")
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)


def test_verl_step_with_huggingface_subfolder(zckpt, tmp_path):
    """verl's global_step_N/actor/: rank shards as .pt, and huggingface/ holding the model in
    safetensors shards: both converted."""
    step = tmp_path / "global_step_3" / "actor"
    step.mkdir(parents=True)
    torch.save({"w": torch.ones(2)}, step / "model_world_size_1_rank_0.pt")
    (step / "fsdp_config.json").write_text('{"FSDP_version": 2}\n')
    write_sharded(step / "huggingface", state(2), 2, "safetensors")
    out = tmp_path / "out"
    zckpt.ok("convert", "--quiet", tmp_path / "global_step_3", "-o", out)
    files = tree(out)
    assert "actor/model_world_size_1_rank_0.zckpt" in files
    assert "actor/huggingface/model-00001-of-00002.zckpt" in files
    assert not any(f.endswith(".safetensors") or f.endswith(".pt") for f in files), files
    index = json.loads((out / "actor/huggingface/model.zckpt.index.json").read_text())
    assert set(index["weight_map"].values()) == {"model-00001-of-00002.zckpt", "model-00002-of-00002.zckpt"}
    zckpt.ok("verify", out)


def test_index_naming_a_missing_shard_keeps_that_name(zckpt, tmp_path):
    src = tmp_path / "m"
    write_sharded(src, state(2), 2, "safetensors")
    os.remove(src / "model-00002-of-00002.safetensors")
    out = tmp_path / "out"
    zckpt.ok("convert", "--quiet", src, "-o", out)
    index = json.loads((out / "model.zckpt.index.json").read_text())
    assert set(index["weight_map"].values()) == {"model-00001-of-00002.zckpt", "model-00002-of-00002.safetensors"}


def test_index_that_is_not_an_index_is_refused(zckpt, tmp_path):
    src = tmp_path / "m"
    src.mkdir()
    save_file({"w": torch.ones(2)}, src / "model.safetensors")
    (src / "model.safetensors.index.json").write_text('{"weight_map": [1, 2]}')
    out = tmp_path / "out"
    run = zckpt("convert", "--quiet", src, "-o", out)
    assert run.rc == 1, run.text
    assert "model.safetensors.index.json: not a shard index" in run.err
    assert not (out / "model.safetensors.index.json").exists() and not (out / "model.zckpt.index.json").exists()
