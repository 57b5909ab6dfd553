"""The documentation site builds without a warning, documents every public name, and
links only to pages and anchors that exist; the README stays a short landing page."""
import html.parser
import importlib
import inspect
import os
import pathlib
import re
import subprocess
import sys
import urllib.parse

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Modules whose public names the API reference documents: `__all__` where the module
# has one, else its own classes, functions and constants (tfgc.server).
DOCUMENTED_MODULES = (
    "tfgc", "tfgc.codecs", "tfgc.callbacks", "tfgc.cluster", "tfgc.mqgrad", "tfgc.server",
    "tfgc_ops",
)
README_MAX_LINES = 200

pytestmark = pytest.mark.slow


class _Page(html.parser.HTMLParser):
    """The ids a page defines and the links it holds (href and src)."""

    def __init__(self):
        super().__init__()
        self.ids = set()
        self.links = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("name"):
            self.ids.add(attrs["name"])
        for key in ("href", "src"):
            if attrs.get(key):
                self.links.append(attrs[key])


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """Builds the site with warnings as errors; returns {path: _Page} of its HTML."""
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(ROOT / "mkdocs.yml"), "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr}"
    # Strict mode aborts on warnings; nothing should even be logged at that level.
    assert "WARNING -" not in result.stderr, result.stderr
    pages = {}
    for path in out.rglob("*.html"):
        page = _Page()
        page.feed(path.read_text(encoding="utf-8"))
        pages[path] = page
    return out, pages


def _public_names(module):
    if hasattr(module, "__all__"):
        return list(module.__all__)
    names = []
    for name, value in vars(module).items():
        if name.startswith("_") or inspect.ismodule(value):
            continue
        if (inspect.isclass(value) or inspect.isfunction(value)) \
                and value.__module__ != module.__name__:
            continue  # imported from elsewhere
        names.append(name)
    return names


def _anchors_for(module_name, name, value):
    """Where the reference may document `module_name.name`: under that path, or under
    the path of the object it names (lazily imported names are documented there)."""
    anchors = {f"{module_name}.{name}"}
    if inspect.ismodule(value):
        anchors.add(value.__name__)
    elif inspect.isclass(value) or inspect.isfunction(value):
        anchors.add(f"{value.__module__}.{value.__qualname__}")
    return anchors


def test_every_public_name_is_in_the_api_reference(site):
    out, pages = site
    api_ids = set()
    for path, page in pages.items():
        if path.parent == out / "api":
            api_ids |= page.ids
    missing = []
    for module_name in DOCUMENTED_MODULES:
        module = importlib.import_module(module_name)
        names = _public_names(module)
        assert names, module_name
        for name in names:
            if not _anchors_for(module_name, name, getattr(module, name)) & api_ids:
                missing.append(f"{module_name}.{name}")
    assert not missing, f"public names without an API reference entry: {missing}"


def test_no_broken_internal_link(site):
    out, pages = site
    broken = []
    for path, page in pages.items():
        if path == out / "404.html":
            continue  # served at any path, so its links are absolute by design
        for link in page.links:
            parts = urllib.parse.urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith("data:"):
                continue  # outside the site
            target = path if not parts.path else (path.parent / parts.path).resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{path.relative_to(out)}: {link}")
                continue
            fragment = urllib.parse.unquote(parts.fragment)
            if fragment and target.suffix == ".html":
                if fragment not in pages[target].ids:
                    broken.append(f"{path.relative_to(out)}: {link} (no such anchor)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_every_page_is_in_the_navigation(site):
    out, _ = site
    # Strict mode already refuses pages left out of `nav` (validation.omitted_files);
    # the home page and the guides must exist as pages of their own.
    for page in ("index.html", "getting-started.html", "architecture.html",
                 "api/index.html", "results/index.html", "deployment.html"):
        assert (out / page).exists(), page


def test_readme_is_a_short_landing_page():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
    # The commands CI and a newcomer run.
    assert "make test" in text and "make demo" in text
    # Its relative links point at files of the repository.
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if urllib.parse.urlsplit(target).scheme:
            continue
        assert (ROOT / target).exists(), f"README links to a missing file: {target}"
