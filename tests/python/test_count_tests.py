"""tools/ci/count-tests.py --meson-log against this build: a GoogleTest suite whose cases meson's
JUnit log lost (meson read no NAME.xml: the suite was killed by its timeout, crashed, or its file
went elsewhere) is named and counted as failed, never as one passed case; a log holding every case
the executable lists passes. The logs are made as meson 1.0 makes them, around the XML the build's
own format_vectors suite writes."""
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from zckpt_testing import build_root

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COUNT = os.path.join(ROOT, "tools", "ci", "count-tests.py")
NAME = "format_vectors"
SHOWN = f"zckpt:format / {NAME}"  # meson's name for it in the log of a project with several suites


def _test():
    with open(os.path.join(build_root(), "meson-info", "intro-tests.json")) as f:
        found = [t for t in json.load(f) if t["name"] == NAME]
    if not found:
        pytest.skip(f"the build has no {NAME} suite (tests disabled?)")
    return found[0]


def _gtest_xml(tmp_path):
    """The XML the suite writes itself, as under `meson test`: its <testsuite> elements."""
    t = _test()
    out = tmp_path / f"{NAME}.xml"
    subprocess.run(t["cmd"] + [f"--gtest_output=xml:{out}"], env=dict(os.environ, **t["env"]), check=True,
                   capture_output=True, timeout=300)
    return ET.parse(out).getroot().findall("testsuite")


def _meson_log(tmp_path, suites=(), alone=None):
    """A log as meson writes it: each suite the test's XML held embedded as zckpt.SHOWN.SUITE, or,
    when it read none, the test as one case of class zckpt (`alone`: its verdict element, if any)."""
    root = ET.Element("testsuites")
    for s in suites:
        s.set("name", f"zckpt.{SHOWN}.{s.get('name')}")
        root.append(s)
    if alone is not None:
        own = ET.SubElement(root, "testsuite", name="zckpt")
        case = ET.SubElement(own, "testcase", name=SHOWN, classname="zckpt")
        if alone:
            ET.SubElement(case, alone)
    path = tmp_path / "testlog.junit.xml"
    ET.ElementTree(root).write(path)
    return path


def _count(log):
    r = subprocess.run([sys.executable, COUNT, "--meson-log", build_root(), str(log)], capture_output=True,
                       text=True, timeout=600)
    return r.returncode, r.stdout.strip().splitlines()[-1], r.stderr


def test_every_case_of_the_suite_passes(tmp_path):
    suites = _gtest_xml(tmp_path)
    n = sum(len(s.findall("testcase")) for s in suites)
    assert n >= 3
    assert _count(_meson_log(tmp_path, suites)) == (0, f"{n} passed, 0 failed, 0 skipped", "")


@pytest.mark.parametrize("verdict", ["", "failure", "error"])  # "": meson 1.0's timeout leaves none
def test_a_suite_logged_without_its_cases_fails_naming_it(tmp_path, verdict):
    listed = sum(len(s.findall("testcase")) for s in _gtest_xml(tmp_path))
    rc, counts, err = _count(_meson_log(tmp_path, alone=verdict))
    assert (rc, counts) == (1, "0 passed, 1 failed, 0 skipped"), err
    assert f"{NAME}: meson's log holds no case of its own XML" in err and f"lists {listed}" in err, err


def test_a_suite_missing_one_case_fails(tmp_path):
    suites = _gtest_xml(tmp_path)
    n = sum(len(s.findall("testcase")) for s in suites)
    first = suites[0]
    first.remove(first.findall("testcase")[0])
    rc, counts, err = _count(_meson_log(tmp_path, suites))
    assert (rc, counts) == (1, f"{n - 1} passed, 1 failed, 0 skipped"), err
    assert f"{NAME}: meson's log holds {n - 1} cases, its executable lists {n}" in err, err
