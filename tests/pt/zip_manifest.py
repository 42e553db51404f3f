"""Describes a zip archive the way Python's zipfile reads it, for the C++ tests to compare with.

Usage: zip_manifest.py ZIP MANIFEST BYTES [--crc-skipped]

Checks zipfile.testzip() (every CRC) first and exits 1 if it reports a bad entry; with
--crc-skipped (torch told not to compute CRCs, so they are all 0) reads without checking. Writes:
  MANIFEST  one line per entry, in central directory order:
            name-hex <TAB> size <TAB> crc32 <TAB> data offset <TAB> compress type
            (name as hex of its bytes; data offset from the LOCAL header, as a reader must)
  BYTES     every entry's data as zipfile.read() returns it, concatenated in the same order
"""
import struct
import sys
import zipfile


def describe_zip(path, manifest_path, bytes_path, crc_skipped=False):
    with zipfile.ZipFile(path) as z:
        bad = None if crc_skipped else z.testzip()
        if bad is not None:
            raise SystemExit(f"zipfile.testzip() reports a bad entry in {path}: {bad}")
        with open(path, "rb") as raw, open(manifest_path, "w") as manifest, open(bytes_path, "wb") as blob:
            for info in z.infolist():
                raw.seek(info.header_offset)
                local = raw.read(30)
                name_len, extra_len = struct.unpack("<HH", local[26:30])
                data_offset = info.header_offset + 30 + name_len + extra_len
                name_bytes = info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437")
                manifest.write(f"{name_bytes.hex()}\t{info.file_size}\t{info.CRC}\t{data_offset}\t{info.compress_type}\n")
                if crc_skipped:
                    del info.CRC  # zipfile checks the CRC only when the ZipInfo has one
                blob.write(z.read(info))


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5) or (len(sys.argv) == 5 and sys.argv[4] != "--crc-skipped"):
        raise SystemExit(__doc__)
    describe_zip(sys.argv[1], sys.argv[2], sys.argv[3], crc_skipped=len(sys.argv) == 5)
