"""Lists a zip's entries as Python's zipfile sees them, reading only the small ones.

Usage: zip_probe.py ZIP

Prints one line per entry: name <TAB> file_size <TAB> header_offset <TAB> CRC <TAB> data, where
data is the hex of zipfile.read() (which checks the CRC) for entries under 1 MiB, else "-".
For archives too large to read whole (sparse ZIP64 tests).
"""
import sys
import zipfile

with zipfile.ZipFile(sys.argv[1]) as z:
    for info in z.infolist():
        data = z.read(info).hex() if info.file_size < (1 << 20) else "-"
        print(f"{info.filename}\t{info.file_size}\t{info.header_offset}\t{info.CRC}\t{data}")
