#!/usr/bin/env python3
"""Counts every test case of a run from JUnit XML files and prints `N passed, N failed, N skipped`.

Inputs: meson's testlog.junit.xml (which embeds each GoogleTest case of `protocol: 'gtest'`
suites) and pytest's --junitxml files. A suite that crashed before writing its cases still shows
as one failed case in meson's log.
"""
import sys
import xml.etree.ElementTree as ET


def count(path):
    passed = failed = skipped = 0
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"count-tests: cannot read {path}: {e}", file=sys.stderr)
        return 0, 1, 0
    for case in root.iter("testcase"):
        tags = {child.tag for child in case}
        if "failure" in tags or "error" in tags:
            failed += 1
        elif "skipped" in tags or case.get("result") == "skipped" or case.get("status") == "notrun":
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped


def main():
    totals = [0, 0, 0]
    for path in sys.argv[1:]:
        for i, n in enumerate(count(path)):
            totals[i] += n
    print(f"{totals[0]} passed, {totals[1]} failed, {totals[2]} skipped")
    return 1 if totals[1] else 0


if __name__ == "__main__":
    sys.exit(main())
