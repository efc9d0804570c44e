#!/usr/bin/env python3
"""ci/check-layers.py can fail: the repository passes, and a copy with a planted include fails
for each kind of defect — a cycle between folders, a cycle through a public header (counted
as the folder that implements it), a cycle only between top-level folders, and a folder
reaching above its layer.
  python3 tests/scripts/check_layers_test.py"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')
CHECK = os.path.join(ROOT, 'ci', 'check-layers.py')
FOLDERS = ['common', 'device', 'memory', 'transport', 'sidecar', 'ps', 'train', 'include', 'examples',
           os.path.join('perf', 'tools')]


def check(tree):
    done = subprocess.run([sys.executable, CHECK, '--tree', tree], capture_output=True, text=True)
    return done.returncode, done.stdout + done.stderr


class CheckLayers(unittest.TestCase):
    def setUp(self):
        self.tree = tempfile.mkdtemp(prefix='check-layers-test.')
        for folder in FOLDERS:
            shutil.copytree(os.path.join(ROOT, folder), os.path.join(self.tree, folder),
                            ignore=shutil.ignore_patterns('*.png', '*.json', '*.md'))

    def tearDown(self):
        shutil.rmtree(self.tree)

    def fails_with(self, path, include, said):
        """Plants `#include "include"` at the end of `path`: the check must fail saying `said`."""
        with open(os.path.join(self.tree, path), 'a') as f:
            f.write(f'\n#include "{include}"\n')
        status, output = check(self.tree)
        self.assertNotEqual(status, 0, output)
        self.assertIn(said, output)

    def test_the_repository_passes(self):
        status, said = check(ROOT)
        self.assertEqual(status, 0, said)
        self.assertIn('0 failed', said)

    def test_a_cycle_between_folders_fails(self):
        # memory already uses common.
        self.fails_with('common/unique_fd.hpp', 'memory/window_handle.hpp',
                        'include cycle between folders: common -> memory -> common')

    def test_a_cycle_through_a_public_header_fails(self):
        # transport calling the parameter server through its public header: ps uses transport.
        self.fails_with('transport/wire.cpp', 'gradlane/ps.hpp', 'transport may not include gradlane/ps.hpp (ps)')
        self.assertIn('include cycle between folders', check(self.tree)[1])

    def test_a_cycle_only_between_top_level_folders_fails(self):
        # transport -> sidecar/client while sidecar/peer -> transport: no two folders include
        # each other, but transport/ and sidecar/ do.
        self.fails_with('transport/wire.cpp', 'gradlane/sidecar.hpp',
                        'include cycle between top-level folders: sidecar -> transport -> sidecar')

    def test_a_worker_that_includes_the_servers_internals_fails(self):
        self.fails_with('ps/worker/worker.cpp', 'ps/server/shard_state.hpp',
                        'ps/worker may not include ps/server/shard_state.hpp (ps/server)')

    def test_an_example_that_includes_internals_fails(self):
        self.fails_with('examples/push_update.cpp', 'transport/wire.hpp',
                        'examples sees only the public API, not transport/wire.hpp')


if __name__ == '__main__':
    unittest.main()
