"""The command line around convert/export/ls: bad options and destinations are usage errors
(exit 2) that write nothing, a failed conversion leaves an existing destination alone."""
from __future__ import annotations

import os

import pytest

from conftest import assert_nothing_written


@pytest.mark.parametrize("options,message", [
    (["--chunk-bytes", "1000"], "multiple of 4096"),
    (["--chunk-bytes", "2G"], "multiple of 4096"),
    (["--chunk-bytes", "12X"], "unknown size suffix"),
    (["--zstd", "23"], "--zstd takes 0..22"),
    (["--zstd", "-1"], "--zstd takes 0..22"),
    (["--large-alignment", "3000"], "power of two"),
    (["-j", "0"], "--jobs must be >= 1"),
    (["--bogus"], "unknown option --bogus"),
    (["--threads", "-1"], "--threads"),
])
def test_bad_option_is_a_usage_error(options, message, family, zckpt, tmp_path):
    run = zckpt("convert", "--quiet", *options, family["strides.pt"].path, "-o", tmp_path / "x.zckpt")
    assert run.rc == 2, run.text
    assert message in run.err, run.err
    assert_nothing_written(tmp_path, " ".join(options))


@pytest.mark.parametrize("threads", ["100000", "64", "1"])
def test_thread_counts(threads, family, zckpt, tmp_path):
    """Any --threads either converts or is refused; never a crash or a leftover temporary file."""
    run = zckpt("convert", "--quiet", "--threads", threads, family["strides.pt"].path, "-o", tmp_path / "x.zckpt")
    if run.rc == 0:
        assert os.listdir(tmp_path) == ["x.zckpt"]
        zckpt.ok("verify", tmp_path / "x.zckpt")
    else:
        assert run.rc == 2, run.text
        assert_nothing_written(tmp_path, f"--threads {threads}")


def test_large_alignment_option(family, zckpt, tmp_path):
    zckpt.ok("convert", "--quiet", "--large-alignment", "8192", family["compressible.pt"].path, "-o", tmp_path / "x")
    ls = zckpt.ls(tmp_path / "x")
    assert ls["large_alignment"] == 8192
    big = next(s for s in ls["storages"] if s["bytes"] == 2 << 20)
    assert big["offset"] % 8192 == 0


def test_failed_conversion_leaves_existing_destination_alone(family, zckpt, tmp_path):
    dst = tmp_path / "x.zckpt"
    dst.write_bytes(b"previous contents")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"\x80\x02cos\nsystem\n.")
    run = zckpt("convert", "--quiet", "--force", bad, "-o", dst)
    assert run.rc in (1, 2), run.text
    assert "exists" not in run.err, run.text  # refused for what it is, not for the destination
    assert dst.read_bytes() == b"previous contents"
    assert sorted(os.listdir(tmp_path)) == ["bad.pt", "x.zckpt"]


def test_successful_conversion_replaces_destination(family, zckpt, tmp_path):
    dst = tmp_path / "x.zckpt"
    dst.write_bytes(b"previous contents")
    zckpt.ok("convert", "--quiet", "--force", family["strides.pt"].path, "-o", dst)
    zckpt.ok("verify", dst)
    assert os.listdir(tmp_path) == ["x.zckpt"]


@pytest.mark.parametrize("command", ["convert", "export"])
def test_destination_folder_missing_or_a_folder(command, family, converted, zckpt, tmp_path):
    src = family["strides.pt"].path if command == "convert" else converted["strides.pt"][1]
    run = zckpt(command, src, "-o", tmp_path / "missing" / "x")
    assert run.rc == 2 and "missing/x" in run.err, run.text
    (tmp_path / "d").mkdir()
    run = zckpt(command, src, "-o", tmp_path / "d")
    assert run.rc == 2, run.text
    assert sorted(os.listdir(tmp_path)) == ["d"] and os.listdir(tmp_path / "d") == []


def test_export_and_ls_refuse_what_is_not_a_container(family, zckpt, tmp_path):
    pt = family["strides.pt"].path
    run = zckpt("export", pt, "-o", tmp_path / "x.pt")
    assert run.rc == 2 and "not a zckpt container" in run.err, run.text
    assert_nothing_written(tmp_path, "export of a .pt")
    run = zckpt("ls", pt)
    assert run.rc == 2 and "not a zckpt container" in run.err, run.text
    assert zckpt("ls", tmp_path / "missing.zckpt").rc == 2
    assert zckpt("export", tmp_path / "missing.zckpt", "-o", tmp_path / "x.pt").rc == 2
    assert zckpt("export", pt).rc == 2  # -o is required
    assert_nothing_written(tmp_path, "export without -o")


def test_missing_source(zckpt, tmp_path):
    run = zckpt("convert", tmp_path / "nope.pt", "-o", tmp_path / "out.zckpt")
    assert run.rc == 2 and "nope.pt" in run.err
    assert_nothing_written(tmp_path, "missing source")


def test_ls_text_output(converted, zckpt):
    run = zckpt.ok("ls", converted["shared_storage.pt"][1])
    lines = run.out.splitlines()
    assert lines[0].startswith(f"{converted['shared_storage.pt'][1]}: zckpt 1.0, ")
    assert "tensors, 3 storages" in lines[1]
    assert any(line.split()[:3] == ["embed.weight", "float32", "[10,"] for line in lines), run.out
    assert "zckpt.source.format = zip" in run.out
