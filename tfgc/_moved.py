"""Module paths that moved, kept importable for one release with a DeprecationWarning.

`import tfgc.pulls` (or `from tfgc.pulls import CompressedPulls`) gives a module that
forwards every attribute to the module's new home and warns once on import.
"""
import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any, Optional, Sequence

# old path -> new path
MOVED = {
    "tfgc.pulls": "tfgc.ps.pulls",
    "tfgc.variables": "tfgc.ps.variables",
    "tfgc.server_variables": "tfgc.ps.server_variables",
    "tfgc.moving_statistics": "tfgc.ps.moving_statistics",
    "tfgc.lookups": "tfgc.ps.lookups",
    "tfgc.wire.pull": "tfgc.ps.pull",
    "tfgc.wire.riders": "tfgc.ps.riders",
    "tfgc.wire.copies": "tfgc.ps.copies",
    "tfgc.optimizer.local_steps_ps": "tfgc.ps.local_steps",
    "tfgc.telemetry": "tfgc.callbacks",
    "tfgc.recomputed_statistics": "tfgc.local_steps",
}


class _Forwarding(types.ModuleType):
    """A moved module's old name: its attributes are the new module's."""

    def __getattr__(self, name: str) -> Any:
        return getattr(importlib.import_module(MOVED[self.__name__]), name)

    def __dir__(self) -> list[str]:
        return dir(importlib.import_module(MOVED[self.__name__]))


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old names (after the real finders, so a real module always wins)."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]],
                  target: Optional[types.ModuleType] = None
                  ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        warnings.warn(f"{spec.name} moved to {MOVED[spec.name]}; the old name goes in the "
                      "next release", DeprecationWarning, stacklevel=2)
        # Loaded first, so that a missing dependency (tf_keras) fails the import itself.
        importlib.import_module(MOVED[spec.name])
        return _Forwarding(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install() -> None:
    """Makes the old names importable (once per process)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
