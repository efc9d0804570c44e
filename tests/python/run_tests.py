#!/usr/bin/env python3
"""Runs the Python package's tests (tests/python/*_test.py) and writes their results as a
GoogleTest JSON report, so ci/gtest_summary.py counts them with the C++ suites: a skipped test
is reported skipped (not a pass), an error or a failure as a failure.
Usage: run_tests.py [--gtest_output=json:PATH] [--gtest_filter=FILTER]
FILTER as GoogleTest reads it: Class.test_name patterns with * and ?, separated by ':', and
after a '-' the patterns to leave out (e.g. 'ShardRun.*:Errors.*-*timeout*')."""
import fnmatch
import json
import os
import sys
import time
import unittest


def selected(name, gtest_filter):
    """Whether the test `name` (Class.test_name) passes `gtest_filter`, as GoogleTest decides."""
    positive, _, negative = gtest_filter.partition("-")

    def any_of(patterns):
        return any(fnmatch.fnmatchcase(name, p) for p in patterns.split(":") if p)
    return (any_of(positive) if positive else True) and not any_of(negative)


def main():
    report, pattern = None, None
    for arg in sys.argv[1:]:
        if arg.startswith("--gtest_output=json:"):
            report = arg[len("--gtest_output=json:"):]
        elif arg.startswith("--gtest_filter="):
            pattern = arg[len("--gtest_filter="):]
        else:
            print(__doc__, file=sys.stderr)
            return 2
    here = os.path.dirname(os.path.abspath(__file__))
    suite = unittest.defaultTestLoader.discover(here, pattern="*_test.py", top_level_dir=here)
    cases = []

    def flatten(s):
        for t in s:
            if isinstance(t, unittest.TestSuite):
                flatten(t)
            else:
                cases.append(t)
    flatten(suite)
    suites = {}
    failed = 0
    for case in cases:
        cls, name = type(case).__name__, case._testMethodName
        if pattern and not selected(f"{cls}.{name}", pattern):
            continue
        result = unittest.TestResult()
        started = time.monotonic()
        print(f"[ RUN      ] {cls}.{name}", flush=True)
        case.run(result)
        seconds = time.monotonic() - started
        entry = {"name": name, "status": "RUN", "result": "COMPLETED", "time": f"{seconds:.3f}s"}
        problems = [text for _, text in result.errors + result.failures]
        if result.skipped:
            entry["result"] = "SKIPPED"
            verdict = "SKIPPED "
        elif problems or result.testsRun == 0:
            entry["failures"] = [{"failure": p, "type": ""} for p in problems] or [{"failure": "did not run"}]
            failed += 1
            verdict = "  FAILED "
            for p in problems:
                print(p, file=sys.stderr)
        else:
            verdict = "      OK "
        print(f"[{verdict}] {cls}.{name} ({seconds * 1000:.0f} ms)", flush=True)
        suites.setdefault(cls, []).append(entry)
    if report:
        with open(report, "w", encoding="utf-8") as f:
            json.dump({"tests": sum(len(v) for v in suites.values()), "failures": failed,
                       "testsuites": [{"name": k, "testsuite": v} for k, v in suites.items()]}, f, indent=1)
    return 1 if failed or not suites else 0


if __name__ == "__main__":
    sys.exit(main())
