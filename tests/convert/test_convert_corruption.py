"""Damaged containers: `zckpt verify` exit codes and messages (0 good, 1 corrupt, 2 cannot run;
2 wins over 1), and that export and ls refuse what they must."""
from __future__ import annotations

import os
import re
import shutil
import struct

import pytest

from conftest import assert_nothing_written


def flip(path, offset, mask=0x01):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ mask]))


def footer(path):
    """(index_offset, index_bytes) from the footer (spec §4)."""
    with open(path, "rb") as f:
        f.seek(-64, os.SEEK_END)
        return struct.unpack_from("<QQ", f.read(64))


@pytest.fixture
def state_dict_container(converted, tmp_path):
    """A private copy of module_state_dict.zckpt (tied embed.weight / head.weight)."""
    run, dst = converted["module_state_dict.pt"]
    assert run.rc == 0, run.text
    path = tmp_path / "sd.zckpt"
    shutil.copy(dst, path)
    return path


@pytest.fixture
def sd_ls(listings):
    """ls --json of module_state_dict.zckpt (the copies above are byte-identical)."""
    return listings["module_state_dict.pt"]


def _tensor(ls, name):
    return next(t for t in ls["tensors"] if t["name"] == name)


def test_flipped_chunk_byte_names_file_storage_tensors_and_range(state_dict_container, sd_ls, zckpt):
    path, ls = state_dict_container, sd_ls
    st = ls["storages"][_tensor(ls, "embed.weight")["storage"]]
    assert st["chunks"] == 1 and st["bytes"] == 16 * 8 * 4
    flip(path, st["offset"] + 100)
    run = zckpt("verify", path)
    assert run.rc == 1, run.text
    assert run.out.strip() == f"{path}: CORRUPT"
    msg = run.err
    assert f"{path}: storage '{st['key']}'" in msg, msg
    assert "embed.weight" in msg and "head.weight" in msg, msg
    assert f"file bytes [{st['offset']}, {st['offset'] + st['bytes']})" in msg, msg
    assert f"storage bytes [0, {st['bytes']})" in msg, msg
    assert msg.count("\n") == 1, "one bad chunk, one problem"
    # ls reads the index only: still fine.
    assert zckpt("ls", path).rc == 0


def test_flipped_byte_in_one_of_many_chunks(family, zckpt, tmp_path):
    path = tmp_path / "c.zckpt"
    zckpt.ok("convert", "--quiet", "--chunk-bytes", "4096", family["compressible.pt"].path, "-o", path)
    ls = zckpt.ls(path)
    st = next(s for s in ls["storages"] if s["bytes"] == 2 << 20)
    flip(path, st["offset"] + 3 * 4096 + 17)
    run = zckpt("verify", path)
    assert run.rc == 1, run.text
    assert "compressible" in run.err and f"storage '{st['key']}'" in run.err
    assert f"file bytes [{st['offset'] + 3 * 4096}, {st['offset'] + 4 * 4096})" in run.err, run.err
    assert "storage bytes [12288, 16384)" in run.err, run.err


def test_flipped_byte_in_zstd_chunk(family, zckpt, tmp_path):
    path = tmp_path / "z.zckpt"
    zckpt.ok("convert", "--quiet", "--zstd", "3", family["compressible.pt"].path, "-o", path)
    ls = zckpt.ls(path)
    st = next(s for s in ls["storages"] if s["bytes"] == 2 << 20)
    flip(path, st["offset"] + 40)
    run = zckpt("verify", path)
    assert run.rc == 1, run.text
    assert f"storage '{st['key']}' (tensors compressible)" in run.err, run.err
    out = tmp_path / "out"
    out.mkdir()
    assert zckpt("export", path, "-o", out / "x.pt").rc == 1
    assert_nothing_written(out, "export of a corrupt zstd chunk")


def test_flipped_blob_byte(state_dict_container, zckpt):
    path = state_dict_container
    # data.pkl is the first blob after the chunks; find it by content.
    data = path.read_bytes()
    at = data.index(b"\x80\x02ccollections\nOrderedDict\n")
    flip(path, at + 5)
    run = zckpt("verify", path)
    assert run.rc == 1, run.text
    assert "blob 'data.pkl'" in run.err, run.err


def test_nonzero_padding_is_corrupt(state_dict_container, sd_ls, zckpt):
    path, ls = state_dict_container, sd_ls
    st = next(s for s in ls["storages"] if s["bytes"] % 64)  # a small storage, padded to 64
    pad = st["offset"] + st["bytes"]
    assert path.read_bytes()[pad] == 0
    flip(path, pad)
    run = zckpt("verify", path)
    assert run.rc == 1, run.text
    assert re.search(rf"padding bytes \[{pad}, \d+\) are not zero", run.err), run.err
    assert zckpt("ls", path).rc == 0  # padding is checked by verify only


@pytest.mark.parametrize("where", ["index", "footer", "superblock_field", "footer_magic"])
def test_flipped_structure_byte_is_corrupt(where, state_dict_container, zckpt, tmp_path):
    path = state_dict_container
    size = os.path.getsize(path)
    index_offset, index_bytes = footer(path)
    offset = {"index": index_offset + index_bytes // 2, "footer": size - 64 + 8, "superblock_field": 16,
              "footer_magic": size - 1}[where]
    flip(path, offset)
    run = zckpt("verify", path)
    assert run.rc == 1, run.text
    assert str(path) in run.err
    assert zckpt("ls", path).rc == 1
    out = tmp_path / "out"
    out.mkdir()
    assert zckpt("export", path, "-o", out / "x.pt").rc == 1
    assert_nothing_written(out, f"export of a container with a bad {where}")


def test_flipped_superblock_magic_is_not_a_container(state_dict_container, zckpt):
    flip(state_dict_container, 1)
    run = zckpt("verify", state_dict_container)
    assert run.rc == 2, run.text
    assert "ERROR" in run.out


@pytest.mark.parametrize("keep", [128, 4096, "half", -64, -1])
def test_truncated_container_is_corrupt(keep, state_dict_container, zckpt):
    """Spec §4/§7: a truncated file has no valid footer (or a file_bytes that is not its size):
    the container is damaged, so corrupt, exit 1."""
    path = state_dict_container
    size = os.path.getsize(path)
    n = size // 2 if keep == "half" else keep if keep > 0 else size + keep
    os.truncate(path, n)
    run = zckpt("verify", path)
    assert run.rc == 1, run.text
    assert str(path) in run.err


@pytest.mark.parametrize("keep", [0, 63, 100])
def test_container_cut_below_minimum_size(keep, state_dict_container, zckpt):
    os.truncate(state_dict_container, keep)
    run = zckpt("verify", state_dict_container)
    assert run.rc in (1, 2), run.text
    assert str(state_dict_container) in run.err


def test_appended_bytes_are_corrupt(state_dict_container, zckpt):
    with open(state_dict_container, "ab") as f:
        f.write(bytes(64))
    run = zckpt("verify", state_dict_container)
    assert run.rc == 1, run.text


def test_missing_file_cannot_run(zckpt, tmp_path):
    run = zckpt("verify", tmp_path / "nope.zckpt")
    assert run.rc == 2 and "nope.zckpt" in run.text


@pytest.mark.parametrize("text", ["hello\n", "not a container\n" * 40])
def test_text_file_cannot_run(text, zckpt, tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text(text)
    run = zckpt("verify", path)
    assert run.rc == 2, run.text
    assert f"{path}: ERROR" in run.out


def test_pt_file_is_not_a_container(family, zckpt):
    run = zckpt("verify", family["strides.pt"].path)
    assert run.rc == 2, run.text


def test_several_files_worst_code_wins(state_dict_container, sd_ls, converted, zckpt, tmp_path):
    good = converted["strides.pt"][1]
    flip(state_dict_container, sd_ls["storages"][0]["offset"])
    run = zckpt("verify", good, state_dict_container)
    assert run.rc == 1, run.text
    assert f"{good}: OK" in run.out and f"{state_dict_container}: CORRUPT" in run.out
    run = zckpt("verify", good, state_dict_container, tmp_path / "missing.zckpt")
    assert run.rc == 2, run.text  # 2 wins over 1


def test_verify_json_lists_problems(state_dict_container, sd_ls, converted, zckpt):
    good = converted["strides.pt"][1]
    ls = sd_ls
    flip(state_dict_container, ls["storages"][0]["offset"])
    run = zckpt("verify", "--json", good, state_dict_container)
    assert run.rc == 1
    report = run.json()
    assert [r["status"] for r in report] == ["ok", "corrupt"]
    assert report[0]["problems"] == [] and len(report[1]["problems"]) == 1
    assert f"storage '{ls['storages'][0]['key']}'" in report[1]["problems"][0]
    assert report[1]["bytes"] == os.path.getsize(state_dict_container)
    # Beside each message, its kind and place: the chunk holding the flipped byte.
    assert report[0]["problem_places"] == [] and len(report[1]["problem_places"]) == 1
    place = report[1]["problem_places"][0]
    assert place["kind"] == "corrupt" and place["file"] == str(state_dict_container)
    assert place["storage"] == ls["storages"][0]["key"] and place["chunk"] == 0, place
    assert place["file_bytes"][0] == ls["storages"][0]["offset"] < place["file_bytes"][1], place
    assert place["storage_bytes"][0] == 0 and isinstance(place["tensors"], list), place


def test_export_of_corrupt_chunk_writes_nothing(state_dict_container, sd_ls, zckpt, tmp_path):
    flip(state_dict_container, sd_ls["storages"][0]["offset"] + 1)
    out = tmp_path / "out"
    out.mkdir()
    run = zckpt("export", state_dict_container, "-o", out / "back.pt")
    assert run.rc == 1, run.text
    assert "storage '" in run.err
    assert_nothing_written(out, "export of a corrupt chunk")
