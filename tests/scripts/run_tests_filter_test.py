"""tests/python/run_tests.py selects tests as GoogleTest does, so one --gtest_filter (ci/test.sh's
quick tier passes the same list to every suite) means the same to the C++ and the Python suites."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
from run_tests import selected  # noqa: E402


class GtestFilter(unittest.TestCase):
    def test_an_exact_name_a_wildcard_and_a_colon_list_select_as_in_googletest(self):
        name = "ShardRun.test_a_gradient_is_applied"
        self.assertTrue(selected(name, name))
        self.assertTrue(selected(name, "ShardRun.*"))
        self.assertTrue(selected(name, "*.test_a_?radient_*"))
        self.assertTrue(selected(name, "Errors.*:ShardRun.test_a_gradient_is_applied"))
        self.assertFalse(selected(name, "Errors.*:WithGradlaned.*"))
        self.assertFalse(selected(name, "ShardRun"), "a class name alone is no GoogleTest pattern")
        self.assertFalse(selected(name, "ShardRun.test_a"), "a prefix is not a match")

    def test_patterns_after_a_minus_are_left_out(self):
        name = "Errors.test_nobody_listening_is_a_timeout_not_a_hang"
        self.assertFalse(selected(name, "Errors.*-*timeout*"))
        self.assertTrue(selected("Errors.test_an_unknown_device", "Errors.*-*timeout*"))
        self.assertFalse(selected(name, "-Errors.*"), "only negatives: everything but them")
        self.assertTrue(selected("ShardRun.x", "-Errors.*"))


if __name__ == "__main__":
    unittest.main()
