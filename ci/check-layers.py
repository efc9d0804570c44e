#!/usr/bin/env python3
"""Checks that every folder includes only what its layer may use, and that no include cycle
runs between folders, nor between top-level folders. A public header ("gradlane/…") counts as
the folder that implements it (PUBLIC_HOME), so a folder that calls another through the public
API depends on it as much as through an internal header. Prints `layers: N passed, M failed`
(one check per source file, plus one per folder graph) and exits non-zero on any violation.
`--tree DIR` checks another checkout (the tests plant cycles in a copy).

The layers, bottom up (a folder may include its own headers and those of the folders listed):
"""
import os
import re
import sys

# The parameter server's roles that have public headers.
PS_ROLES = ("ps/worker", "ps/server", "ps/aggregator")
# folder -> folders it may include (besides itself).
ALLOWED = {
    "common": set(),
    "device": {"common"},
    "memory": {"common", "device"},
    "transport": {"common", "device", "memory"},
    "sidecar/core": set(),
    # Prometheus metrics: the exporter and the family builders every program's source uses.
    "metrics": {"common"},
    "train": set(),
    "sidecar/shm": {"common"},
    "sidecar/client": {"common", "sidecar/shm", "sidecar/core"},
    "sidecar/peer": {"common", "device", "memory", "transport", "sidecar/core", "sidecar/client"},
    "sidecar/daemon": {"common", "device", "memory", "transport", "sidecar/core", "sidecar/shm", "sidecar/client",
                       "sidecar/peer", "metrics"},
    # The parameter server, a folder per role: what every role speaks, what every receiver of
    # updates runs, then the roles; the aggregator forwards through a worker.
    "ps/protocol": {"common", "device", "memory", "transport"},
    "ps/receiving": {"common"},
    "ps/worker": {"common", "device", "memory", "transport", "sidecar/core", "sidecar/client", "ps/protocol"},
    "ps/server": {"common", "device", "memory", "transport", "sidecar/core", "sidecar/client", "ps/protocol",
                  "ps/receiving"},
    "ps/aggregator": {"common", "device", "memory", "transport", "sidecar/core", "sidecar/client", "ps/protocol",
                      "ps/receiving", "ps/worker"},
    # The roles as metrics sources: they read what the roles count, through the public API.
    "ps/metrics": {"common", "device", "memory", "transport", "sidecar/client", "metrics", *PS_ROLES},
    # gradlane/ps.hpp: the parameter server's public headers, all roles.
    "ps": {"common", "device", "memory", "transport", "sidecar/client", "ps/worker", "ps/server", "ps/aggregator"},
    # The umbrella header: every public header, for programs.
    "api": {"common", "device", "memory", "transport", "sidecar/client", "ps", *PS_ROLES},
    # Users' view: tools, examples and the trainer see only the public API (the trainer also train/).
    "perf/tools": {"common", "device", "memory", "transport", "sidecar/client", "ps", *PS_ROLES, "api", "metrics",
                   "ps/metrics"},
    "examples": {"common", "device", "memory", "transport", "sidecar/client", "ps", *PS_ROLES, "api", "metrics",
                 "ps/metrics"},
    "python": {"common", "device", "memory", "transport", "sidecar/client", "ps", *PS_ROLES, "api", "metrics",
               "ps/metrics"},
    "trainer": {"common", "device", "memory", "transport", "sidecar/client", "ps", *PS_ROLES, "api", "metrics",
                "ps/metrics", "train"},
}
# The folder that implements each public header: including it depends on that folder.
PUBLIC_HOME = {
    "include/gradlane/error.hpp": "common",
    "include/gradlane/device.hpp": "device",
    "include/gradlane/memory.hpp": "memory",
    "include/gradlane/memory_window.hpp": "memory",
    "include/gradlane/registration_cache.hpp": "memory",
    "include/gradlane/options.hpp": "transport",
    "include/gradlane/completion_queue.hpp": "transport",
    "include/gradlane/connection.hpp": "transport",
    "include/gradlane/sidecar.hpp": "sidecar/client",
    "include/gradlane/ps.hpp": "ps",
    "include/gradlane/metrics.hpp": "metrics",
    "include/gradlane/ps/metrics.hpp": "ps/metrics",
    "include/gradlane/ps/aggregator.hpp": "ps/aggregator",
    "include/gradlane/ps/server.hpp": "ps/server",
    "include/gradlane/ps/sharded.hpp": "ps/worker",
    "include/gradlane/ps/worker.hpp": "ps/worker",
    "include/gradlane/gradlane.hpp": "api",
}
# Folders that users' code lives in: they may include public headers only.
USERS = {"perf/tools", "examples", "python", "trainer"}
# Public headers must not expose internal types: a detail:: name may appear only in a private
# section (a pimpl) or a forward declaration, never in what an embedder can call or touch.
DETAIL_IN_PUBLIC = re.compile(r"\bdetail::")
ACCESS = re.compile(r"^\s*(public|private|protected)\s*:")
CLASS_START = re.compile(r"^\s*(class|struct)\s+\w+[^;]*$")
# Include roots besides the repository root: the tools include their own "common/…" helpers.
EXTRA_ROOTS = ["perf/tools"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of(path):
    """The folder `path` belongs to: its public header's home, else the most specific folder of
    ALLOWED that contains it, or None."""
    if path in PUBLIC_HOME:
        return PUBLIC_HOME[path]
    best = None
    for folder in ALLOWED:
        if path == folder or path.startswith(folder + "/"):
            if best is None or len(folder) > len(best):
                best = folder
    return best


def top(folder):
    return folder.split("/")[0]


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
    for start in list(ALLOWED) + ["include/gradlane"]:
        for dirpath, _, names in os.walk(start):
            for name in sorted(names):
                if not name.endswith((".hpp", ".cpp", ".h")):
                    continue
                path = os.path.join(dirpath, name)
                own = layer_of(path)
                if own is None or (start != "include/gradlane" and own != start):
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
                            included = resolve(m.group(1), path)
                            target = layer_of(included)
                            if own in USERS and not m.group(1).startswith("gradlane/") and target != own and \
                                    target is not None and target != "train":
                                bad.append(f"{path}:{lineno}: {own} sees only the public API, not {m.group(1)}")
                                continue
                            if target is None or target == own:
                                continue
                            edges.setdefault(own, set()).add(target)
                            if target not in ALLOWED[own]:
                                bad.append(f"{path}:{lineno}: {own} may not include {m.group(1)} ({target})")
                        code = line.split("//")[0]
                        if (path.startswith("include/gradlane/") and access == "public" and DETAIL_IN_PUBLIC.search(code)
                                and not code.lstrip().startswith("namespace detail")):
                            bad.append(f"{path}:{lineno}: a public header names an internal detail:: type")
                if bad:
                    failures += bad
                else:
                    passed += 1
    # Cycles between folders, and between top-level folders, over the includes actually present.
    tops = {}
    for source, targets in edges.items():
        for target in targets:
            if top(source) != top(target):
                tops.setdefault(top(source), set()).add(top(target))
    for what, graph in (("folders", edges), ("top-level folders", tops)):
        cycle = find_cycle(graph)
        if cycle:
            failures.append(f"include cycle between {what}: " + " -> ".join(cycle))
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
    if len(sys.argv) == 3 and sys.argv[1] == "--tree":
        sys.exit(main(sys.argv[2]))
    if len(sys.argv) > 1:
        sys.exit(main(sys.argv[1]))
    sys.exit(main(os.path.join(os.path.dirname(__file__), "..")))
