#!/usr/bin/env python3
"""Sums GoogleTest JSON reports into one closing line: `SUITE: N passed, M failed`.

Usage: gtest_summary.py SUITE EXPECTED_BINARY... -- REPORT_DIR
A binary whose report is missing (it crashed, hung, or never ran) counts as one failure, so
a suite that did not run can never look green. Exit status 0 only when nothing failed and at
least one test ran.
"""
import json
import os
import sys


def main() -> int:
    args = sys.argv[1:]
    if "--" not in args or len(args) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    split = args.index("--")
    suite, binaries, report_dir = args[0], args[1:split], args[split + 1]
    passed = failed = 0
    for name in binaries:
        path = os.path.join(report_dir, name + ".json")
        try:
            with open(path, encoding="utf-8") as f:
                report = json.load(f)
        except (OSError, ValueError) as e:
            print(f"{suite}: {name}: no test report ({e}) — it crashed, timed out or did not run",
                  file=sys.stderr)
            failed += 1
            continue
        for testsuite in report.get("testsuites", []):
            for case in testsuite.get("testsuite", []):
                if case.get("result") == "SKIPPED" or case.get("status") == "NOTRUN":
                    # A skipped RDMA test is not a pass.
                    print(f"{suite}: {name}: {testsuite['name']}.{case['name']} skipped", file=sys.stderr)
                    failed += 1
                elif case.get("failures"):
                    print(f"{suite}: {name}: {testsuite['name']}.{case['name']} FAILED", file=sys.stderr)
                    failed += 1
                else:
                    passed += 1
    print(f"{suite}: {passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
