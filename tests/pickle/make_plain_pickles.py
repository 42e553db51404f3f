"""Writes pickles of plain Python objects at protocols 0-5 into OUTDIR, with the rendering the
C++ interpreter must give each (zckpt::pickle::Render, see src/pickle/value.h).

OUTDIR/expected.txt: one line per file, "<file name>\t<expected rendering>".
Also writes a few hand-made pickles (Python 2 opcodes, text opcodes) and renders what
Python's own unpickler makes of them, so both readings are compared.
Runs without torch.
"""
import collections
import math
import os
import pickle
import sys


ESCAPES = {0x5C: b"\\\\", 0x27: b"\\'", 0x0A: b"\\n", 0x0D: b"\\r", 0x09: b"\\t"}


def quote(raw, is_bytes):
    """Single-quoted, escaping quote/backslash/controls; text keeps its UTF-8, bytes do not."""
    out = bytearray(b"'")
    for c in raw:
        if c in ESCAPES:
            out += ESCAPES[c]
        elif c < 0x20 or c == 0x7F or (is_bytes and c >= 0x80):
            out += b"\\x%02x" % c
        else:
            out.append(c)
    out += b"'"
    return out.decode("utf-8")


def render_float(x):
    if math.isnan(x):
        return "nan"
    return repr(x)


def render(obj, active=()):
    if id(obj) in active:
        if isinstance(obj, list):
            return "[...]"
        if isinstance(obj, (dict, set)):
            return "{...}"
        if isinstance(obj, tuple):
            return "(...)"
        return "<...>"
    active = active + (id(obj),)
    r = lambda o: render(o, active)
    if obj is None or isinstance(obj, bool):
        return repr(obj)
    if isinstance(obj, int):
        return str(obj)
    if isinstance(obj, float):
        return render_float(obj)
    if isinstance(obj, str):
        return quote(obj.encode("utf-8"), False)
    if isinstance(obj, bytearray):
        return "bytearray(b" + quote(bytes(obj), True) + ")"
    if isinstance(obj, bytes):
        return "b" + quote(obj, True)
    if isinstance(obj, tuple):
        inner = ", ".join(r(x) for x in obj)
        return "(" + inner + (",)" if len(obj) == 1 else ")")
    if isinstance(obj, list):
        return "[" + ", ".join(r(x) for x in obj) + "]"
    if isinstance(obj, collections.OrderedDict):
        return "OrderedDict({" + ", ".join(r(k) + ": " + r(v) for k, v in obj.items()) + "})"
    if isinstance(obj, dict):
        return "{" + ", ".join(r(k) + ": " + r(v) for k, v in obj.items()) + "}"
    if isinstance(obj, frozenset):
        return "frozenset(" + ("{" + ", ".join(r(x) for x in obj) + "}" if obj else "") + ")"
    if isinstance(obj, set):
        return "{" + ", ".join(r(x) for x in obj) + "}" if obj else "set()"
    raise TypeError(type(obj))


def cases():
    rec = [1]
    rec.append(rec)
    rec_tuple = ([],)
    rec_tuple[0].append(rec_tuple)
    rec_dict = {"a": 1}
    rec_dict["self"] = rec_dict
    shared = [1, 2]
    return {
        "none": None,
        "bools": [True, False],
        "ints": [0, 1, -1, 255, 256, 65535, 65536, 2**31 - 1, 2**31, -2**31, -2**31 - 1,
                 2**63 - 1, -2**63, 2**63, -2**63 - 1, 2**64, 10**30, -10**30, 2**1000, -(2**1000)],
        "floats": [0.0, -0.0, 1.5, -2.25, 1e16, 1e15, 1e-5, 0.0001, 123456789.125, 0.1,
                   float("nan"), float("inf"), float("-inf"), 1e308, 5e-324, -1.7976931348623157e308],
        "bytes": [b"", b"abc", bytes(range(256)), b"'\"\\"],
        "bytearrays": [bytearray(b"x\x00y"), bytearray()],
        "strs": ["", "ascii", "h\u00e9llo w\u00f6rld", "\u65e5\u672c\u8a9e", "\n\t\\'\"\r", "emoji \U0001F600",
                 "\x00\x7f\x80\xff", "back\\slash u\\u1234"],
        "nested": {"a": [1, (2, 3), {"b": None}], "c": (True, False), 5: "int key", (1, 2): "tuple key",
                   -7: [[[[]]]]},
        "tuples": [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)],
        "recursive_list": rec,
        "recursive_tuple": rec_tuple,
        "recursive_dict": rec_dict,
        "sets": [{1, 2, 3}, frozenset({"a"}), set(), frozenset(), {("t", 1)}],
        "ordered": collections.OrderedDict([("x", 1), ("y", [2]), ("z", collections.OrderedDict())]),
        "shared": [shared, shared, {"k": shared}],
        "long_list": list(range(2500)),
        "big_dict": {"k%d" % i: i for i in range(1500)},
    }


# Hand-made pickles: Python 2 and text-protocol opcodes that Python 3's pickler never writes.
HANDMADE = {
    "py2_string": b"S'hello\\n\\'q\\''\np0\n.",
    "py2_string_dq": b"S\"it's\"\n.",
    "py2_string_octal": b"S'\\101\\x42C'\n.",
    "py2_binstring": b"\x80\x02T\x03\x00\x00\x00abcq\x00.",
    "py2_short_binstring": b"\x80\x02U\x02hi.",
    "text_int_bool": b"(I01\nI00\nI-42\nI123456789012345678901234567890\nl.",
    "text_long": b"(L12L\nL-99999999999999999999999999\nL0\nl.",
    "text_float": b"(F1.5\nF-0.0\nF1e+16\nF2.5e-07\nl.",
    "text_dict": b"(dp0\nS'a'\np1\nI1\nsS'b'\ng1\ns.",
    "unicode_escapes": b"V\\u00e9t\\u00e9 \\U0001f600 \\\\u not\np0\n.",
    "pop_and_dup": b"\x80\x02K\x01K\x020K\x032\x86\x86.",
    "pop_mark": b"\x80\x02K\x07(K\x01K\x021.",
    "memoize_proto4": b"\x80\x04\x95\x09\x00\x00\x00\x00\x00\x00\x00]\x94(K\x01h\x00e.",
    "binget_long": b"\x80\x02K\x05r\x00\x01\x00\x00j\x00\x01\x00\x00\x86.",
    "bytes_opcodes": b"\x80\x03(C\x02abB\x03\x00\x00\x00cde\x8e\x01\x00\x00\x00\x00\x00\x00\x00fl.",
    "unicode8": b"\x80\x04\x8d\x02\x00\x00\x00\x00\x00\x00\x00hi.",
    "empty_set_additems": b"\x80\x04\x8f(K\x01K\x02\x90.",
    "frozenset_op": b"\x80\x04(K\x03\x91.",
    "long4": b"\x80\x02\x8b\x09\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01.",
    "bytearray8": b"\x80\x05\x96\x03\x00\x00\x00\x00\x00\x00\x00xyz.",
}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    lines = []
    for name, obj in cases().items():
        expected = render(obj)
        for proto in range(0, 6):
            fname = "%s_p%d.pkl" % (name, proto)
            with open(os.path.join(out, fname), "wb") as f:
                f.write(pickle.dumps(obj, protocol=proto))
            lines.append("%s\t%s" % (fname, expected))
    for name, data in HANDMADE.items():
        obj = pickle.loads(data, encoding="utf-8")
        fname = "handmade_%s.pkl" % name
        with open(os.path.join(out, fname), "wb") as f:
            f.write(data)
        lines.append("%s\t%s" % (fname, render(obj)))
    with open(os.path.join(out, "expected.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote %d pickles" % len(lines))


if __name__ == "__main__":
    main()
