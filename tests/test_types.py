"""mypy is clean on tfgc at the strictness pyproject.toml's [tool.mypy] states (and says
why): tfgc's annotations, the calls between its modules and the bodies of the functions
it annotates agree; and every public function and method is annotated, so that mypy
checks every body a user's call reaches."""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_mypy_finds_nothing_in_tfgc(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "tfgc", "--cache-dir", str(tmp_path / "cache")],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Success: no issues found" in done.stdout


def _public_modules():
    """tfgc's modules outside its private ones (`_compat`, `_server`, `_version`)."""
    root = os.path.join(REPO, "tfgc")
    for folder, _, files in os.walk(root):
        for name in sorted(files):
            path = os.path.join(folder, name)
            parts = os.path.relpath(path, REPO)[:-len(".py")].split(os.sep)
            if name.endswith(".py") and not any(
                    part.startswith("_") and part != "__init__" for part in parts):
                yield path


def _unannotated(path):
    """`path`'s public functions and methods (of public classes; `__init__` too) with a
    parameter (but self or cls) or the return not annotated."""
    import ast

    found = []

    def visit(body, owner):
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                visit(node.body, node.name + ".")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                    not node.name.startswith("_") or node.name == "__init__"):
                arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                if owner and arguments and arguments[0].arg in ("self", "cls"):
                    arguments = arguments[1:]
                arguments += [a for a in (node.args.vararg, node.args.kwarg) if a]
                if node.returns is None or any(a.annotation is None for a in arguments):
                    found.append(f"{os.path.relpath(path, REPO)}:{node.lineno} "
                                 f"{owner}{node.name}")

    with open(path) as f:
        visit(ast.parse(f.read()).body, "")
    return found


def test_every_public_function_is_annotated():
    missing = [entry for path in _public_modules() for entry in _unannotated(path)]
    assert not missing, "\n".join(missing)
