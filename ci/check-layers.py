#!/usr/bin/env python3
"""Checks that every folder includes only what its layer may use, and that no include cycle
runs between folders. Prints `layers: N passed, M failed` (one check per source file, plus one
for the folder graph) and exits non-zero on any violation.

The layers, bottom up (a folder may include its own headers and those of the folders listed):
"""
import os
import re
import sys

# folder -> folders it may include (besides itself). Public headers are "gradlane/…".
ALLOWED = {
    "include/gradlane": set(),
    "common": {"include/gradlane"},
    "memory": {"include/gradlane", "common"},
    "transport": {"include/gradlane", "common"},
    "transport/ps": {"include/gradlane", "common"},
    "sidecar/core": set(),
    "train": set(),
    "sidecar/shm": {"include/gradlane", "common"},
    "sidecar/client": {"include/gradlane", "common", "sidecar/shm"},
    "sidecar/peer": {"include/gradlane", "common", "sidecar/core"},
    "sidecar/daemon": {"include/gradlane", "common", "sidecar/core", "sidecar/shm", "sidecar/peer"},
    # Users' view: tools and examples see only the public API.
    "perf/tools": {"include/gradlane"},
    "examples": {"include/gradlane", "train"},
}
# Public headers must not expose internal types: a detail:: name may appear only in a private
# section (a pimpl) or a forward declaration, never in what an embedder can call or touch.
DETAIL_IN_PUBLIC = re.compile(r"\bdetail::")
ACCESS = re.compile(r"^\s*(public|private|protected)\s*:")
CLASS_START = re.compile(r"^\s*(class|struct)\s+\w+[^;]*$")
# Include roots besides the repository root: the tools include their own "common/…" helpers.
EXTRA_ROOTS = ["perf/tools"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of(path):
    """The most specific folder of ALLOWED that contains `path`, or None."""
    best = None
    for folder in ALLOWED:
        if path == folder or path.startswith(folder + "/"):
            if best is None or len(folder) > len(best):
                best = folder
    return best


def resolve(include, source):
    if include.startswith("gradlane/"):
        return "include/" + include
    if "/" not in include:
        return os.path.join(os.path.dirname(source), include)
    for root in EXTRA_ROOTS:
        if source.startswith(root + "/") and os.path.exists(os.path.join(root, include)):
            return os.path.join(root, include)
    return include


def main(root):
    os.chdir(root)
    failures, passed = [], 0
    edges = {}
    for top in ALLOWED:
        for dirpath, _, names in os.walk(top):
            for name in sorted(names):
                if not name.endswith((".hpp", ".cpp", ".h")):
                    continue
                path = os.path.join(dirpath, name)
                own = layer_of(path)
                if own != top:
                    continue  # visited as part of a more specific folder
                bad = []
                access = "public"
                with open(path, encoding="utf-8") as f:
                    for lineno, line in enumerate(f, 1):
                        if CLASS_START.match(line):
                            access = "private" if line.lstrip().startswith("class") else "public"
                        elif ACCESS.match(line):
                            access = ACCESS.match(line).group(1)
                        m = INCLUDE.match(line)
                        if m:
                            target = layer_of(resolve(m.group(1), path))
                            if target is None or target == own:
                                continue
                            edges.setdefault(own, set()).add(target)
                            if target not in ALLOWED[own]:
                                bad.append(f"{path}:{lineno}: {own} may not include {m.group(1)} ({target})")
                        code = line.split("//")[0]
                        if (own == "include/gradlane" and access == "public" and DETAIL_IN_PUBLIC.search(code)
                                and not code.lstrip().startswith("namespace detail")):
                            bad.append(f"{path}:{lineno}: a public header names an internal detail:: type")
                if bad:
                    failures += bad
                else:
                    passed += 1
    # Cycles between folders, over the includes actually present.
    cycle = find_cycle(edges)
    if cycle:
        failures.append("include cycle between folders: " + " -> ".join(cycle))
    else:
        passed += 1
    for f in failures:
        print(f, file=sys.stderr)
    print(f"layers: {passed} passed, {len(failures)} failed")
    return 1 if failures else 0


def find_cycle(edges):
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")))
