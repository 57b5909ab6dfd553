"""docs/results/index.md shows what `python -m benchmarks.headlines` derives from the
committed data, headline for headline, every page's data files exist, and results/README.md
indexes every folder of raw output."""
import glob
import os
import re
import subprocess
import sys

from benchmarks import headlines

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "docs", "results")
# A row of the index's headline table: | `id` | what | value | raw or recorded |
ROW = re.compile(r"^\| `([\w.-]+)` \| .* \| ([^|]+) \| (raw|recorded) \|$")


def index_rows():
    with open(os.path.join(RESULTS, "index.md")) as f:
        return {m.group(1): (m.group(2).strip(), m.group(3))
                for m in map(ROW.match, f.read().splitlines()) if m}


def test_index_shows_the_derived_headlines():
    rows = index_rows()
    derived = headlines.compute()
    assert sorted(rows) == sorted(h.id for h in derived), "headlines and index rows differ"
    for head in derived:
        value, kind = rows[head.id]
        assert value == head.value, f"{head.id}: index shows {value!r}, data gives {head.value!r}"
        assert kind == ("raw" if head.raw else "recorded"), head.id
        for source in head.sources:
            assert os.path.exists(os.path.join(ROOT, source)), source


def test_the_command_prints_every_headline():
    result = subprocess.run([sys.executable, "-m", "benchmarks.headlines"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60, check=True)
    for head in headlines.compute():
        assert f"{head.id}: {head.value}\n" in result.stdout, head.id


def test_pages_name_data_and_plots_that_exist():
    missing = []
    for name in sorted(os.listdir(RESULTS)):
        if not name.endswith(".md"):
            continue
        with open(os.path.join(RESULTS, name)) as f:
            text = f.read()
        for path in re.findall(r"`(results/[\w./-]+)`", text):
            if not os.path.exists(os.path.join(ROOT, path)):
                missing.append(f"{name}: {path}")
        for path in re.findall(r"\]\((plots/[\w.-]+\.png)\)", text):
            if not os.path.exists(os.path.join(RESULTS, path)):
                missing.append(f"{name}: {path}")
    assert not missing, missing


# A ratio ("32.8x") or a signed accuracy gap ("+4.20", "-0.40") in the README's text.
README_NUMBER = re.compile(r"(?<![\w.])([+-]\d+\.\d+|\d[\d,]*(?:\.\d+)?x)(?![\w.])")


def _readme_headline_section():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    start = text.index("## Headline numbers")
    return text[start:text.index("\n## ", start + 1)]


def _matches(shown, value):
    """`shown` ("141x", "-0.40") is `value` at the README's precision."""
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    return round(value, decimals) == float(shown)


def test_readme_headlines_come_from_raw_output():
    numbers = [float(n.rstrip("x").replace(",", "")) for head in headlines.compute()
               if head.raw for n in README_NUMBER.findall(head.value)]
    shown = [n.rstrip("x").replace(",", "")
             for n in README_NUMBER.findall(_readme_headline_section())]
    assert len(shown) >= 10, shown
    unknown = [n for n in shown if not any(_matches(n, value) for value in numbers)]
    assert not unknown, f"README headline numbers no raw headline derives: {unknown}"


def test_the_results_index_covers_every_folder_and_names_what_exists():
    folder = os.path.join(ROOT, "results")
    with open(os.path.join(folder, "README.md")) as f:
        text = f.read()
    # One section per topic folder, each a table whose first column names its entries
    # (`seedS` stands for every seed).
    parts = re.split(r"^## `([\w.-]+)/`$", text, flags=re.M)
    sections = dict(zip(parts[1::2], parts[2::2]))
    assert sorted(sections) == sorted(
        name for name in os.listdir(folder) if os.path.isdir(os.path.join(folder, name)))
    missing = []
    for section, body in sections.items():
        for first in re.findall(r"^\| (`[^|]+) \|", body, flags=re.M):
            for name in re.findall(r"`([\w./-]+)`", first):
                pattern = os.path.join(folder, section, name.replace("seedS", "seed[0-9]"))
                if not glob.glob(pattern):
                    missing.append(f"{section}/{name}")
    assert not missing, missing
