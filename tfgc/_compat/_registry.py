"""The hook registry of tfgc._compat: what each hook relies on, its probe, the error."""
import dataclasses
import importlib
from typing import Callable


# The versions every hook below was verified with (pyproject.toml allows these): CI runs
# the suite with the newest and scripts/test_older_tensorflow.sh with the older.
VERIFIED = {"tensorflow": "2.20 and 2.21", "tf_keras": "2.20 and 2.21", "keras": "3.15"}


class UnsupportedInternalsError(RuntimeError):
    """A TensorFlow or Keras internal that a tfgc hook relies on is missing."""


@dataclasses.dataclass(frozen=True)
class Hook:
    """One registered hook.

    Attributes:
      name: the hook's name (as `tfgc._compat.HOOKS` holds it).
      library: "tensorflow", "tf_keras" or "keras": the package that owns the internal.
      internal: what the hook relies on, as a dotted name.
      probe: returns the internal; raises ImportError, AttributeError or LookupError
        when it is missing.
      at_import: probed when this module is imported (TensorFlow hooks whose probe is
        cheap); otherwise at the hook's first use.
    """

    name: str
    library: str
    internal: str
    probe: Callable[[], object]
    at_import: bool = True


HOOKS: dict[str, "Hook"] = {}  # hook name -> Hook
_resolved: dict[str, object] = {}  # hook name -> what its probe returned


def _installed_version(library):
    try:
        return importlib.import_module(library).__version__
    except (ImportError, AttributeError):
        return "(not installed)"


def missing(name, detail=None):
    """The `UnsupportedInternalsError` of hook `name` (for hooks that find an internal
    missing at use, such as an attribute set on instances)."""
    hook = HOOKS[name]
    verified = ", ".join(f"{lib} {version}" for lib, version in VERIFIED.items())
    return UnsupportedInternalsError(
        f"tfgc hook `{name}` relies on {hook.internal}, which {hook.library} "
        f"{_installed_version(hook.library)} (installed) does not have"
        f"{f' ({detail})' if detail else ''}; tfgc's hooks were verified with {verified}. "
        "Install the versions pinned in tfgc's pyproject.toml.")


def _hook(name, library, internal, at_import=None):
    """Registers the decorated probe as hook `name`'s (see `Hook`); TensorFlow's are
    probed at import unless `at_import` is False."""
    at_import = library == "tensorflow" if at_import is None else at_import

    def register(probe):
        HOOKS[name] = Hook(name, library, internal, probe, at_import)
        return probe

    return register


def check(name):
    """Probes hook `name` now (uncached) and returns its internal.

    Raises:
      UnsupportedInternalsError: the internal is missing.
    """
    try:
        return HOOKS[name].probe()
    except (ImportError, AttributeError, LookupError) as error:
        raise missing(name, f"{type(error).__name__}: {error}") from error


def _internal(name):
    """Hook `name`'s internal, probed once (at import, or here at first use)."""
    if name not in _resolved:
        _resolved[name] = check(name)
    return _resolved[name]


def _module(path):
    return importlib.import_module(path)


def _method(owner, method):
    """`owner.method`, which must be callable (a probe's check that a hook still is)."""
    value = getattr(owner, method)
    if not callable(value):
        raise AttributeError(f"{owner.__name__}.{method} is not callable")
    return value


def check_at_import(library):
    """Probes every hook of `library` marked `at_import` (a module of this package calls
    it when it is imported)."""
    for name, hook in HOOKS.items():
        if hook.library == library and hook.at_import:
            _resolved[name] = check(name)
