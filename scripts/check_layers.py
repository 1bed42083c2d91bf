#!/usr/bin/env python3
"""Checks every #include of the library against the arrows of src/layers.txt.

The compiler already refuses a forbidden include (each layer sees only its allowed headers,
cmake/DcpLayers.cmake; the CLI and the Python extension see only the public headers and the
tooling they name); this check reports all of them at once, by file and line, without
compiling, and also covers what the build does not compile (comm/mpi without MPI).

  check_layers.py [ROOT]      exit 0 if clean, 1 listing each forbidden include
  check_layers.py --self-test builds a small tree with known violations and checks they are found
"""
import os
import re
import sys
import tempfile

# Quoted and angle-bracket includes: both reach the project's folders through the include path.
INCLUDE = re.compile(r'^\s*#\s*include\s*["<]([^">]+)[">]', re.M)


def read_layers(root):
    """{name: (kind, deps, owned public headers)} from src/layers.txt."""
    layers = {}
    with open(os.path.join(root, "src", "layers.txt")) as f:
        for line in f:
            line = line.split("#", 1)[0].split()
            if not line:
                continue
            name, kind, rest = line[0], line[1], [w for w in line[2:] if w != "-"]
            deps = [w for w in rest if not w.endswith(".h")]
            headers = [w for w in rest if w.endswith(".h")]
            layers[name] = (kind, deps, headers)
    for name, (kind, deps, _) in layers.items():
        for d in deps:
            if d not in layers:
                raise SystemExit(f"src/layers.txt: layer {name} names unknown layer {d}")
            if kind == "lib" and layers[d][0] != "lib":
                raise SystemExit(f"src/layers.txt: library layer {name} may not include the "
                                 f"{layers[d][0]} layer {d}: the installed library never sees tooling")
        if name in closure(layers, deps):
            raise SystemExit(f"src/layers.txt: layer {name} depends on itself (a cycle)")
    return layers


def closure(layers, names):
    seen, todo = [], list(names)
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.append(n)
            todo.extend(layers[n][1])
    return set(seen)


def allowed_for(layers, name):
    """(internal folders, public headers) a layer may include."""
    kind, deps, _ = layers[name]
    if kind == "cli":
        libs = [n for n, (k, _, _) in layers.items() if k == "lib"]
        folders = set(deps) | {name}
        headers = {h for n in closure(layers, libs) for h in layers[n][2]}
        return folders, headers
    folders = {name, *deps}
    headers = {h for n in closure(layers, folders) for h in layers[n][2]}
    return folders, headers


def sources(root, layers):
    """(layer, path) for every library, tooling and CLI source and public header."""
    owner_of_header = {h: n for n, (_, _, hs) in layers.items() for h in hs}
    for name, (kind, _, _) in layers.items():
        base = os.path.join(root, name if kind == "cli" else os.path.join("src", name))
        for dirpath, _, files in os.walk(base):
            for f in sorted(files):
                if f.endswith((".cc", ".h")) and not f.endswith("_test.cc"):
                    yield name, os.path.join(dirpath, f)
    pub = os.path.join(root, "include", "dcp")
    for f in sorted(os.listdir(pub)):
        if f.endswith(".h"):
            if f not in owner_of_header:
                yield None, os.path.join(pub, f)
            else:
                yield owner_of_header[f], os.path.join(pub, f)


def check(root):
    layers = read_layers(root)
    folders_all = set(os.listdir(os.path.join(root, "src")))
    problems = []
    for layer, path in sources(root, layers):
        rel = os.path.relpath(path, root)
        if layer is None:
            problems.append(f"{rel}: public header owned by no layer in src/layers.txt")
            continue
        folders, headers = allowed_for(layers, layer)
        if rel.startswith("include/"):
            folders = set()  # a public header includes public headers only
        with open(path) as f:
            text = f.read()
        for m in INCLUDE.finditer(text):
            inc = m.group(1)
            line = text.count("\n", 0, m.start()) + 1
            top = inc.split("/", 1)[0]
            if top in ("..", "src", "include"):
                # A path around the include views (relative to the file, or from the root).
                problems.append(f"{rel}:{line}: {layer} includes \"{inc}\" by a path that "
                                "goes around src/layers.txt")
            elif top == "dcp":
                if inc.split("/", 1)[1] not in headers:
                    problems.append(f"{rel}:{line}: {layer} may not include \"{inc}\"")
            elif top in folders_all or top == "tools" or inc.startswith("python/"):
                if top not in folders:
                    problems.append(f"{rel}:{line}: {layer} may not include \"{inc}\"")
    return problems


def self_test():
    """A tree with one allowed and three forbidden includes: exactly the three are reported."""
    with tempfile.TemporaryDirectory() as root:
        def write(rel, text):
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        write("src/layers.txt", "core lib - a.h c.h\nplanner lib core\nstorage lib core b.h\n"
                                "tools cli -\n")
        write("include/dcp/a.h", "#pragma once\n")
        write("include/dcp/b.h", '#include "dcp/a.h"\n')
        write("src/core/x.cc", '#include "dcp/a.h"\n#include "dcp/b.h"\n')       # b.h: forbidden
        write("src/planner/p.cc", '#include "core/x.h"\n#include "storage/s.h"\n')  # storage
        write("src/storage/s.h", '#include "core/x.h"\n')
        write("src/storage/s_test.cc", '#include "planner/p.h"\n')  # tests are exempt
        write("tools/main.cc", '#include "dcp/b.h"\n#include "planner/p.h"\n')  # planner
        write("include/dcp/c.h", '#include <vector>\n#include "core/x.h"\n')  # internal
        write("src/planner/q.cc", '#include "../storage/s.h"\n#include <storage/s.h>\n')
        write("include/dcp/orphan.h", "#pragma once\n")  # owned by no layer
        found = check(root)
        expected = ['src/core/x.cc:2: core may not include "dcp/b.h"',
                    'src/planner/p.cc:2: planner may not include "storage/s.h"',
                    'tools/main.cc:2: tools may not include "planner/p.h"',
                    'include/dcp/c.h:2: core may not include "core/x.h"',
                    'src/planner/q.cc:1: planner includes "../storage/s.h" by a path that goes '
                    'around src/layers.txt',
                    'src/planner/q.cc:2: planner may not include "storage/s.h"',
                    'include/dcp/orphan.h: public header owned by no layer in src/layers.txt']
        if sorted(found) != sorted(expected):
            print("check_layers self-test FAILED: found", found, "expected", expected)
            return 1
        # A table whose library layer includes a tool layer is refused.
        write("src/layers.txt", "core lib -\nworkload tool core\nplanner lib core workload\n")
        try:
            read_layers(root)
            print("check_layers self-test FAILED: a library layer including tooling was accepted")
            return 1
        except SystemExit:
            pass
    print("check_layers self-test: every planted violation was found, nothing else")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    problems = check(os.path.abspath(root))
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} include(s) against the arrows of src/layers.txt")
        return 1
    print("check_layers: every include follows src/layers.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
