#!/usr/bin/env python3
"""The documentation's checks (ctest docs.check):

- every relative link in README.md, CONTRIBUTING.md, CHANGELOG.md and docs/*.md resolves to a
  file of the repository, and its #anchor to a heading of that file;
- every docs/ page is linked from README.md;
- every DCP_* environment variable the sources read appears in docs/environment.md;
- no page narrates the project's history ("stop 12", "issue 14");
- every Python code block of README.md and docs/python.md is valid Python (python/tests/
  test_docs.py runs them all, in the Python package's tests);
- the modules of python/hyperdcp import one another without a circle (imports inside
  functions included: they are cycles all the same once called).

  check_docs.py ROOT            # the checks; exit 1 with one line per problem
  check_docs.py ROOT --cxx CXX [-I DIR ...]   # also compile README's C++ quick start
  check_docs.py --self-test     # each check finds a planted problem
"""

import ast
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
ENV_READ = re.compile(r"\"(DCP_[A-Z0-9_]+)\"")
# DCP_* strings that are no environment variables: torch's safetensors metadata keys
# (src/hf/torch_hf_format.h).
NOT_ENVIRONMENT = {"DCP_SHARDING_INFO", "DCP_VERSION"}
HISTORY = re.compile(r"\b(stop|issue) [0-9]+\b", re.IGNORECASE)


def pages(root: Path):
    out = [root / n for n in ("README.md", "CONTRIBUTING.md", "CHANGELOG.md")]
    out += sorted((root / "docs").glob("*.md"))
    return [p for p in out if p.exists()]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[`*]", "", heading.strip().lower())  # GitHub keeps underscores
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path):
    found, fence = set(), False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found


def code_blocks(path: Path, language: str):
    blocks, current, fence = [], None, False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            if not fence:
                fence = True
                current = [] if line.strip() == "```" + language else None
            else:
                fence = False
                if current is not None:
                    blocks.append(textwrap.dedent("\n".join(current)))
            continue
        if fence and current is not None:
            current.append(line)
    return blocks


def check_links(root: Path):
    problems = []
    for page in pages(root):
        text = page.read_text()
        for target in LINK.findall(text):
            if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            if not dest.exists():
                problems.append(f"{page.relative_to(root)}: link to {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{page.relative_to(root)}: link to {target}: no such heading")
    readme = (root / "README.md").read_text()
    for page in sorted((root / "docs").glob("*.md")):
        if f"docs/{page.name}" not in readme:
            problems.append(f"README.md: docs/{page.name} is not linked")
    return problems


def check_environment(root: Path):
    documented = (root / "docs" / "environment.md").read_text()
    read = set()
    for sub in ("src", "include", "tools", "python/hyperdcp", "python/src"):
        for path in (root / sub).rglob("*"):
            if path.suffix in (".cc", ".h", ".py") and not path.name.endswith("_test.cc"):
                read |= set(ENV_READ.findall(path.read_text(errors="replace")))
    return [f"docs/environment.md: {v} is read by the sources but not documented"
            for v in sorted(read - NOT_ENVIRONMENT) if f"`{v}`" not in documented]


def check_history(root: Path):
    problems = []
    for page in pages(root):
        if page.name == "CHANGELOG.md":
            continue
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if HISTORY.search(line):
                problems.append(f"{page.relative_to(root)}:{n}: development history: {line.strip()}")
    return problems


def check_python_blocks(root: Path):
    problems = []
    for name in ("README.md", "docs/python.md"):
        path = root / name
        for i, block in enumerate(code_blocks(path, "python"), 1):
            try:
                compile(block, f"{name} python block {i}", "exec")
            except SyntaxError as e:
                problems.append(f"{name}: python block {i}: {e}")
    return problems


def import_graph(package: Path):
    # The extension module (_dcp) is known by its stub.
    modules = {p.stem for p in package.glob("*.py")} | {p.stem for p in package.glob("*.pyi")}
    graph = {m: set() for m in modules}
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    target = node.module.split(".")[0]
                    if target in modules:
                        graph[path.stem].add(target)
                else:
                    # `from . import x`: module x, or a name of the package's face (__init__).
                    graph[path.stem] |= {a.name if a.name in modules else "__init__"
                                         for a in node.names}
    return graph


def check_import_cycles(root: Path):
    graph = import_graph(root / "python" / "hyperdcp")
    state, stack, cycles = {}, [], []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == "open":
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return [f"python/hyperdcp: import circle {' -> '.join(c)}" for c in cycles]


def check_cpp_quick_start(root: Path, cxx: str, includes):
    """README's C++ block, its #includes kept and the rest made a function body whose free
    names (argc, argv, ptr, r) are its parameters, compiled against the public headers."""
    blocks = code_blocks(root / "README.md", "cpp")
    if not blocks:
        return ["README.md: no C++ block"]
    problems = []
    for i, block in enumerate(blocks, 1):
        lines = block.splitlines()
        head = [l for l in lines if l.startswith("#include")]
        body = [l for l in lines if not l.startswith("#include")]
        source = "\n".join(["#include <cstdint>", *head,
                            "void Example(int argc, char** argv, void* ptr, int64_t r) {",
                            *body, "}"]) + "\n"
        with tempfile.NamedTemporaryFile("w", suffix=".cc", delete=False) as f:
            f.write(source)
        cmd = [cxx, "-std=c++20", "-fsyntax-only", "-I", str(root / "include"),
               *[f"-I{d}" for d in includes], f.name]
        p = subprocess.run(cmd, capture_output=True, text=True)
        Path(f.name).unlink()
        if p.returncode != 0:
            problems.append(f"README.md: C++ block {i} does not compile:\n{p.stderr[:2000]}")
    return problems


CHECKS = [check_links, check_environment, check_history, check_python_blocks,
          check_import_cycles]


def run(root: Path):
    problems = []
    for check in CHECKS:
        problems += check(root)
    return problems


def self_test():
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "docs").mkdir()
        (root / "src").mkdir()
        pkg = root / "python" / "hyperdcp"
        pkg.mkdir(parents=True)
        (root / "README.md").write_text("# T\n[a](docs/a.md) [b](docs/a.md#nope) [c](docs/x.md)\n"
                                        "done in stop 12\n```python\ndef f(:\n```\n")
        (root / "docs" / "a.md").write_text("# A\n")
        (root / "docs" / "b.md").write_text("# B\n")
        (root / "docs" / "environment.md").write_text("`DCP_ONE`\n")
        (root / "docs" / "python.md").write_text("# P\n")
        (root / "src" / "x.cc").write_text('getenv("DCP_ONE"); getenv("DCP_TWO");\n')
        (pkg / "a.py").write_text("from .b import x\n")
        (pkg / "b.py").write_text("def f():\n    from . import a\n")
        # A name of the package's face closes a circle through __init__.
        (pkg / "__init__.py").write_text("from .c import g\n")
        (pkg / "c.py").write_text("def g():\n    from . import h\n")
        found = "\n".join(run(root))
        expected = ["docs/a.md#nope: no such heading", "docs/x.md: no such file",
                    "docs/b.md is not linked", "DCP_TWO", "development history",
                    "python block 1", "import circle a -> b -> a",
                    "import circle __init__ -> c -> __init__"]
        missing = [e for e in expected if e not in found]
        if missing or "DCP_ONE" in found:
            print("self-test failed; missing:", missing, "\nfound:\n" + found)
            return 1
    print("check_docs self-test: every planted problem found")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    args = sys.argv[1:]
    root = Path(args[0] if args else ".").resolve()
    problems = run(root)
    if "--cxx" in args:
        cxx = args[args.index("--cxx") + 1]
        includes = [args[i + 1] for i, a in enumerate(args) if a == "-I"]
        problems += check_cpp_quick_start(root, cxx, includes)
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"check_docs: {len(pages(root))} pages, links, environment, history, python blocks, "
          "imports: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
