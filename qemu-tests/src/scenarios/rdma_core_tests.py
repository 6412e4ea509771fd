"""rdma-core's own test suite, unmodified, with each test's outcome recorded as it ends.

`python3 rdma_core_tests.py TESTS_DIR OUT MODULE --dev DEV [--port P]` does what the suite's own
`run_tests.py` does (parse its arguments, load its `tests` package, run `tests.MODULE` with
unittest) but writes one JSON line per test to OUT, flushed, before the next one starts:
`{"id": ..., "outcome": "ok" | "skip" | "fail" | "error", "detail": ...}`, and
`{"id": ..., "outcome": "started"}` as each begins, so a test that crashes the interpreter
(some do, natively, on rxe) is still named: the last "started" without an outcome.
Python's random generator (the suite draws QP capabilities and sizes from it) is seeded with
a constant, so both sides of a comparison draw the same values.
"""

import json
import os
import random
import sys
import traceback
import unittest
from importlib.machinery import SourceFileLoader


class Recorder(unittest.TextTestResult):
    def __init__(self, out, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.out = out

    def record(self, test, outcome, detail=""):
        self.out.write(json.dumps({"id": test.id(), "outcome": outcome, "detail": detail}) + "\n")
        self.out.flush()
        os.fsync(self.out.fileno())

    def startTest(self, test):
        self.record(test, "started")
        super().startTest(test)

    def addSuccess(self, test):
        super().addSuccess(test)
        self.record(test, "ok")

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.record(test, "skip", str(reason))

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.record(test, "fail", "".join(traceback.format_exception_only(err[0], err[1])).strip())

    def addError(self, test, err):
        super().addError(test, err)
        self.record(test, "error", "".join(traceback.format_exception_only(err[0], err[1])).strip())

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self.record(test, "ok", "expected failure")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self.record(test, "fail", "unexpected success")


def main():
    tests_dir, out_path, module = sys.argv[1:4]
    sys.argv[1:] = sys.argv[4:]
    sys.path.insert(0, tests_dir)
    from args_parser import parser

    parser.parse_args()
    tests = SourceFileLoader("tests", os.path.join(tests_dir, "__init__.py")).load_module()
    suite = unittest.defaultTestLoader.loadTestsFromName(module, tests)
    random.seed(0x7672646D61)
    with open(out_path, "a", encoding="utf-8") as out:
        runner = unittest.TextTestRunner(
            verbosity=2, resultclass=lambda *a, **k: Recorder(out, *a, **k)
        )
        result = runner.run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
