#!/usr/bin/env python3
"""Counts every test case of a run from JUnit XML files and prints `N passed, N failed, N skipped`.

    count-tests.py [--meson-log BUILD JUNIT]... [JUNIT]...

Inputs: meson's testlog.junit.xml (which embeds each GoogleTest case of `protocol: 'gtest'`
suites) and pytest's --junitxml files. A suite that crashed before writing its cases still shows
as one failed case in meson's log. A log given with --meson-log is also held against the build it
came from (gtest_cases.check): every gtest executable it holds must show there with the cases
`EXE --gtest_list_tests` lists, else each such test is named and counted as one failure, so a
log that lost an executable's cases never passes as a smaller count.
"""
import argparse
import sys
import xml.etree.ElementTree as ET

import gtest_cases


def count(path, left_out=lambda case: False):
    """(passed, failed, skipped) of the cases in JUnit file `path`, but those `left_out` says."""
    passed = failed = skipped = 0
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"count-tests: cannot read {path}: {e}", file=sys.stderr)
        return 0, 1, 0
    for case in root.iter("testcase"):
        if left_out(case):
            continue
        tags = {child.tag for child in case}
        if "failure" in tags or "error" in tags:
            failed += 1
        elif "skipped" in tags or case.get("result") == "skipped" or case.get("status") == "notrun":
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--meson-log", nargs=2, action="append", default=[], metavar=("BUILD", "JUNIT"),
                        help="meson's JUnit log of a run in BUILD: counted, and its gtest cases checked")
    parser.add_argument("junits", nargs="*", metavar="JUNIT")
    args = parser.parse_args()
    totals = [0, 0, 0]
    for path in args.junits:
        for i, n in enumerate(count(path)):
            totals[i] += n
    for build, junit in args.meson_log:
        try:
            project, names = gtest_cases.project_of(build), [t["name"] for t in gtest_cases.gtest_tests(build)]
            problems = gtest_cases.check(build, junit)
        except (OSError, ValueError, KeyError, ET.ParseError) as e:
            project, names, problems = "", [], [f"cannot hold {junit} against {build}: {e}"]
        # A gtest test meson logged as one case of its own is counted by its problem line instead.
        counted = count(junit, lambda case: any(gtest_cases.stands_for(case, project, n) for n in names))
        for i, n in enumerate(counted):
            totals[i] += n
        for p in problems:
            print(f"count-tests: {p}", file=sys.stderr)
        totals[1] += len(problems)
    print(f"{totals[0]} passed, {totals[1]} failed, {totals[2]} skipped")
    return 1 if totals[1] else 0


if __name__ == "__main__":
    sys.exit(main())
