"""The GoogleTest suites of a meson build, held against what meson's JUnit log says of them.

meson embeds a `protocol: 'gtest'` test's cases in testlog.junit.xml only when it can read the XML
file the executable wrote (NAME.xml, which it names relative to the test's working directory);
when it cannot, the whole executable is one case in the log, and hundreds of cases go uncounted
without a failure. `check` compares, for every such test the log holds, its cases there with the
cases `EXE --gtest_list_tests` lists (under the test's arguments and environment, as meson ran
it), and names each test whose numbers differ. `stale_outputs` names the XML files such tests
leave in the build folder, which a run must remove first: meson reads a test's file after the
test ends whatever wrote it, so a file from an earlier run stands in for a run that wrote none.
"""
import json
import os
import re
import subprocess
import xml.etree.ElementTree as ET

# Seconds one `--gtest_list_tests` may take: a LibTorch-linked executable loads in a few seconds
# on a busy machine; listing runs no test.
LIST_TIMEOUT_S = 300


def gtest_tests(build):
    """The build's `protocol: 'gtest'` tests, as `meson introspect --tests` gives them."""
    with open(os.path.join(build, "meson-info", "intro-tests.json")) as f:
        return [t for t in json.load(f) if t.get("protocol") == "gtest"]


def output_file(build, test):
    """Where meson has a gtest test write its XML: NAME.xml in its working directory (the build
    folder when it names none)."""
    return os.path.join(test.get("workdir") or build, test["name"] + ".xml")


def stale_outputs(build):
    """The gtest XML files of `build`'s tests that exist now (left by an earlier run)."""
    return [p for p in (output_file(build, t) for t in gtest_tests(build)) if os.path.exists(p)]


def listed_cases(build, test):
    """The number of cases `EXE --gtest_list_tests` lists (lines naming a case, indented under
    their suite's line)."""
    env = dict(os.environ, **test.get("env", {}))
    r = subprocess.run(test["cmd"] + ["--gtest_list_tests"], cwd=test.get("workdir") or build, env=env,
                       capture_output=True, text=True, timeout=LIST_TIMEOUT_S)
    if r.returncode != 0:
        raise RuntimeError(f"{test['name']}: --gtest_list_tests exited {r.returncode}: {r.stderr.strip()[-500:]}")
    return sum(1 for line in r.stdout.splitlines() if line.startswith("  ") and line.strip())


def _shown(name):
    """meson's name for test `name` in its log: NAME, or PROJECT:SUITE / NAME when the project has
    several suites."""
    return rf"(?:[^/]* / )?{re.escape(name)}"


def project_of(build):
    with open(os.path.join(build, "meson-info", "intro-projectinfo.json")) as f:
        return json.load(f)["descriptive_name"]


def junit_cases(root, project, name):
    """(cases meson embedded from the test's own XML, whether the log holds the test as one case
    of its own because it had none), from meson's testlog.junit.xml root. An embedded gtest suite
    is named PROJECT.SHOWN_NAME.GTEST_SUITE; the case of its own is SHOWN_NAME of class PROJECT."""
    suite = re.compile(rf"{re.escape(project)}\.{_shown(name)}\.")
    embedded = sum(len(s.findall("testcase")) for s in root.iter("testsuite") if suite.match(s.get("name", "")))
    return embedded, any(stands_for(c, project, name) for c in root.iter("testcase"))


def stands_for(case, project, name):
    """Whether junit `case` is the one case meson logs for test `name` when it read no XML of it
    (whose verdict meson leaves out for a timeout: no failure element)."""
    return case.get("classname") == project and re.fullmatch(_shown(name), case.get("name", "")) is not None


def check(build, junit_path):
    """One line per gtest test of `build` whose cases in the meson log `junit_path` are not the
    cases its executable lists, each a failure of the run (the case meson logs in place of the
    missing ones is no verdict: `stands_for`); tests the log does not hold (not run) are left
    out."""
    project = project_of(build)
    root = ET.parse(junit_path).getroot()
    problems = []
    for test in gtest_tests(build):
        embedded, alone = junit_cases(root, project, test["name"])
        if not embedded and not alone:
            continue
        try:
            listed = listed_cases(build, test)
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
            problems.append(f"{test['name']}: cannot list its cases: {e}")
            continue
        if alone or embedded != listed:
            why = "no case of its own XML (meson read no NAME.xml)" if alone else f"{embedded} cases"
            problems.append(f"{test['name']}: meson's log holds {why}, its executable lists {listed}")
    return problems


if __name__ == "__main__":  # gtest_cases.py remove-stale BUILD: before a run, as tools/run-tests.sh does
    import sys

    if len(sys.argv) != 3 or sys.argv[1] != "remove-stale":
        sys.exit("usage: gtest_cases.py remove-stale BUILD")
    for path in stale_outputs(sys.argv[2]):
        os.remove(path)
