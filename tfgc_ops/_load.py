"""Loads the op library, refusing one built for another TensorFlow with a clear message.

The op library is compiled at install time against the installed TensorFlow. A library
built for another TensorFlow minor version cannot load (TensorFlow's C++ ABI changes
between minors), so the version it was built for is recorded in build_info.json and
checked here before loading, with a message that says how to rebuild.
"""
import glob
import json
import os

import tensorflow as tf

_HERE = os.path.dirname(os.path.abspath(__file__))
_SOURCE_ROOT = os.path.dirname(_HERE)
_REBUILD_HINT = (
    "Rebuild the ops against the TensorFlow you have: in the tfgc source tree run\n"
    "    python -m pip install --no-build-isolation --force-reinstall --no-deps -e .\n"
    "(or `make install`; {root} looks like {what})."
)


def _rebuild_hint():
    is_source = os.path.exists(os.path.join(_SOURCE_ROOT, "setup.py"))
    return _REBUILD_HINT.format(
        root=_SOURCE_ROOT, what="the source tree" if is_source else "an installed copy"
    )


def _minor(version):
    return ".".join(version.split(".")[:2])


def _find_library():
    candidates = sorted(glob.glob(os.path.join(_HERE, "_tfgc_ops*.so")))
    info_path = os.path.join(_HERE, "build_info.json")
    if not candidates or not os.path.exists(info_path):
        raise ImportError(
            f"tfgc's op library is not built (looked for _tfgc_ops*.so and build_info.json "
            f"in {_HERE}).\n" + _rebuild_hint()
        )
    with open(info_path) as f:
        info = json.load(f)
    built_for = info.get("tensorflow", "unknown")
    if _minor(built_for) != _minor(tf.__version__):
        raise ImportError(
            f"tfgc's op library was built for TensorFlow {built_for} but TensorFlow "
            f"{tf.__version__} is installed; a library built for one minor version does not "
            f"load in another.\n" + _rebuild_hint()
        )
    named = os.path.join(_HERE, info.get("library", ""))
    return named if os.path.exists(named) else candidates[0]


def _load():
    path = _find_library()
    try:
        return path, tf.load_op_library(path)
    except tf.errors.NotFoundError as error:  # e.g. undefined symbols from a stale build
        raise ImportError(
            f"tfgc's op library {path} failed to load: {error}\n" + _rebuild_hint()
        ) from error


_loaded = _load()
library_path = _loaded[0]
"""The path of the loaded op library (a shared object built for the installed TensorFlow)."""
ops = _loaded[1]
"""The module whose attributes are the library's ops (tfgc_<op name>)."""
