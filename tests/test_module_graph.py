"""How tfgc's modules import each other (module-level imports; an import inside a
function, or under TYPE_CHECKING, runs later or never and is not part of the graph):
without a circle, with a small top level, and with the parameter-server package
(tfgc.ps) reached from the rest of tfgc at its seams only. Moved modules stay
importable under their old names, with a warning."""
import ast
import importlib
import pathlib
import sys
import tomllib
import warnings

import pytest

from tfgc._moved import MOVED

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules():
    return {_module_name(p): p for p in (ROOT / "tfgc").rglob("*.py")}


def _imports(path, known):
    """The tfgc modules `path` imports at module level."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from package import submodule` imports the submodule; any other name
            # comes from the package's __init__.
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in known
                     else node.module for alias in node.names]
        else:
            continue
        found |= {name for name in names if name in known}
    return found


def _circle(graph):
    """One import circle of `graph` as a list of modules, or None."""
    state = {}  # module -> "open" while on the path, "done" after

    def visit(module, path):
        state[module] = "open"
        for imported in sorted(graph[module]):
            if state.get(imported) == "open":
                return path[path.index(imported):] + [imported]
            if imported not in state:
                found = visit(imported, path + [imported])
                if found:
                    return found
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state:
            found = visit(module, [module])
            if found:
                return found
    return None


def test_no_import_circle():
    graph = _graph()
    assert _circle(graph) is None, " -> ".join(_circle(graph))


def _graph():
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def test_the_top_level_holds_at_most_eight_modules():
    public = sorted(p.stem for p in (ROOT / "tfgc").glob("*.py")
                    if not p.stem.startswith("_"))
    assert len(public) <= 8, public


def test_every_package_is_installed():
    with open(ROOT / "pyproject.toml", "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
    packages = {_module_name(p) for p in ROOT.glob("tfgc*/**/__init__.py")
                if "__pycache__" not in p.parts}
    assert packages <= listed, sorted(packages - listed)


def _in_ps(module):
    return module == "tfgc.ps" or module.startswith("tfgc.ps.")


# Every import of a tfgc.ps module from the rest of tfgc, with what it is for (the
# seams drawn in docs/architecture.md). A new one is a design decision: add it here.
PS_SEAMS = {
    ("tfgc", "tfgc.ps.pulls"): "compressed_pulls and get_variable",
    ("tfgc", "tfgc.ps.servers"): "ParameterServers, the owner users make",
    ("tfgc", "tfgc.ps.moving_statistics"): "batch_norm_on_server",
    ("tfgc.codecs.base", "tfgc.ps.server_variables"): "a codec's state on a server, by name",
    ("tfgc.distribute", "tfgc.ps.server_variables"): "per-worker variables, by name",
    ("tfgc.optimizer.base", "tfgc.ps.pulls"): "the optimizer counts a model's pulls",
    ("tfgc.optimizer.base", "tfgc.ps.servers"): "the optimizer is handed the owner",
    ("tfgc.optimizer.base", "tfgc.ps.variables"): "gradients of a PulledVariable go to its master",
    ("tfgc.optimizer.tfkeras", "tfgc.ps.local_steps"): "local steps' meetings with the servers",
    ("tfgc.optimizer.tfkeras", "tfgc.ps.server_variables"): "the slots, by name",
    ("tfgc.wire.wires", "tfgc.ps.riders"): "other updates ride in the push message",
    ("tfgc.wire.wires", "tfgc.ps.copies"): "tensors the server holds are not sent",
}


def test_the_rest_of_tfgc_reaches_the_parameter_server_package_at_its_seams():
    edges = {(module, imported) for module, imports in _graph().items()
             if not _in_ps(module) for imported in imports if _in_ps(imported)}
    assert not edges - set(PS_SEAMS), sorted(edges - set(PS_SEAMS))


def test_the_parameter_server_package_imports_nothing_that_drives_training():
    # Any import, in a function or for type checking too: what the package needs of an
    # optimizer is a protocol of its own (tfgc.ps.pulls.PullingOptimizer).
    above = ("tfgc.optimizer", "tfgc.callbacks", "tfgc.trainer", "tfgc.prebuild",
             "tfgc.mqgrad", "tfgc.cluster", "tfgc.server")
    found = set()
    for path in (ROOT / "tfgc" / "ps").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module
                     else [])
            found |= {(path.name, name) for name in names if name.startswith(above)}
    assert not found, sorted(found)


@pytest.mark.parametrize("old", sorted(MOVED))
def test_a_moved_module_imports_under_its_old_name_with_a_warning(old):
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    new = importlib.import_module(MOVED[old])
    assert [str(w.message) for w in caught if w.category is DeprecationWarning] == [
        f"{old} moved to {MOVED[old]}; the old name goes in the next release"]
    name = next(n for n in vars(new) if not n.startswith("_") and callable(getattr(new, n)))
    assert getattr(module, name) is getattr(new, name)
    with pytest.raises(AttributeError):
        module.no_such_name  # noqa: B018


def test_the_circle_finder_finds_one():
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b"}, "b": set()}) is None
