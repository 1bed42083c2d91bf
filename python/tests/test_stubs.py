"""The type stubs the package ships (hyperdcp/_dcp.pyi, with py.typed) against the extension
module at runtime: every name, class member and function signature the runtime has is in the
stub, and the stub declares nothing the runtime lacks. pybind11 writes each function's
signature into its docstring; that is what the stub is compared with."""

import ast
import re
from pathlib import Path

import hyperdcp
import hyperdcp._dcp as ext

STUB = Path(hyperdcp.__file__).parent / "_dcp.pyi"
# Members every exception has from BaseException; instance attributes set at raise time.
INHERITED = {"args", "add_note", "with_traceback", "code"}
# Set on every result by the package's save and load (the classes take attributes).
SET_PER_CALL = {"call_seconds", "python_seconds"}


def stub_tree():
    return ast.parse(STUB.read_text())


def declared(body):
    names = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, ast.Assign):
            names.update({t.id: node for t in node.targets if isinstance(t, ast.Name)})
    return names


def runtime_signatures(obj):
    """Parameter names of each overload pybind11 wrote into the docstring."""
    out = []
    for line in (getattr(obj, "__doc__", None) or "").split("\n"):
        m = re.match(r"^\s*(?:\d+\.\s*)?\w+\((.*)\)\s*->", line)
        if m:
            names = re.findall(r"(?:^|,\s*)\*?(\w+)\s*:", m.group(1))
            out.append([n for n in names if n != "self"])
    return out


def stub_params(fn):
    a = fn.args
    return [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg != "self"]


def test_every_runtime_name_is_in_the_stub_and_back():
    names = declared(stub_tree().body)
    runtime = {n for n in dir(ext) if not n.startswith("__")}
    assert runtime - set(names) == set(), "in the module, not in _dcp.pyi"
    assert {n for n in names if not n.startswith("__")} - runtime == set(), \
        "in _dcp.pyi, not in the module"


def test_class_members_match():
    problems = []
    for name, node in declared(stub_tree().body).items():
        if not isinstance(node, ast.ClassDef):
            continue
        in_stub = {n for n in declared(node.body) if not n.startswith("_")}
        at_runtime = {n for n in dir(getattr(ext, name)) if not n.startswith("_")} - INHERITED
        if name in ("SaveResult", "LoadResult", "HfSaveResult"):
            at_runtime |= SET_PER_CALL
        if at_runtime - in_stub or in_stub - at_runtime - INHERITED:
            problems.append((name, sorted(at_runtime - in_stub), sorted(in_stub - at_runtime)))
    assert not problems, "(class, missing from the stub, missing at runtime): %s" % problems


def test_the_results_carry_what_the_stub_says_the_package_sets(tmp_path):
    import torch

    saved = hyperdcp.save({"w": torch.ones(4)}, tmp_path / "c", no_dist=True)
    loaded = hyperdcp.load({"w": torch.zeros(4)}, tmp_path / "c", no_dist=True)
    for result in (saved, loaded):
        for name in SET_PER_CALL:
            assert isinstance(getattr(result, name), float), (type(result).__name__, name)


def test_signatures_match():
    problems = []
    compared = 0
    for name, node in declared(stub_tree().body).items():
        pairs = []
        if isinstance(node, ast.FunctionDef):
            pairs = [(node, getattr(ext, name))]
        elif isinstance(node, ast.ClassDef):
            owner = getattr(ext, name)
            pairs = [(f, getattr(owner, f.name)) for f in node.body
                     if isinstance(f, ast.FunctionDef) and hasattr(owner, f.name)]
        for fn, obj in pairs:
            sigs = runtime_signatures(obj)
            compared += bool(sigs)
            if sigs and stub_params(fn) not in sigs:
                problems.append((name, fn.name, stub_params(fn), sigs))
    assert not problems, problems
    # Most signatures are read from pybind11's docstrings: a parser that read none checks none.
    assert compared > 20, compared
