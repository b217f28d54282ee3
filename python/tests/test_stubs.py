"""The hand-written stubs (`_native.pyi`) describe exactly what the
extension exports, and the package ships them with `py.typed`."""

from __future__ import annotations

import ast
from pathlib import Path

import context_engine
from context_engine import _native

PKG = Path(context_engine.__file__).parent


def stub_tree() -> ast.Module:
    return ast.parse((PKG / "_native.pyi").read_text(encoding="utf-8"))


def public(names):
    return {n for n in names if not n.startswith("_")}


def test_shipped_with_py_typed():
    assert (PKG / "py.typed").is_file()
    assert (PKG / "_native.pyi").is_file()


def test_module_names_match():
    tree = stub_tree()
    declared = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            declared.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            declared.add(node.target.id)
    exported = public(dir(_native)) | {"__version__"}
    aliases = {"Message", "Messages", "Report"}  # typing aliases of the stub
    assert declared - aliases == {n for n in exported if not n.startswith("__") or n == "__version__"}
    assert set(context_engine.__all__) <= exported


def test_compressor_members_match():
    tree = stub_tree()
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Compressor")
    declared = set()
    for node in cls.body:
        if isinstance(node, ast.FunctionDef):
            declared.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            declared.add(node.target.id)
    actual = public(dir(_native.Compressor))
    assert public(declared) == actual
