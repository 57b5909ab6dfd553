"""No development-log vocabulary in the project's files.

Results, docs and code describe what tfgc is and what was measured, not how the work went:
no ticket numbers, numbered work items, work sessions, reviews, records of suite runs,
or references to the tracker's issues. The test greps every file git tracks (text files
only) and names each hit as path:line.
"""
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (pattern, what it catches, words of which a file must hold one for the pattern to be
# tried there, lowercase). Lines are matched one at a time.
PATTERNS = [
    # "#16", "#16's"; not "#include", "keras-team/keras#18624" (an external project's
    # reference), HTML entities ("&#39;") or quoted hex colours ("#333").
    (r"(?<![\w&/:\"'#])#\d{1,5}\b(?![\w-])", "a ticket number", ["#"]),
    (r"\b[Tt]ickets?\b", "a ticket", ["ticket"]),
    (r"\b[Ii]tems? \d+\b", "a numbered work item", ["item"]),
    # ("a session" stays: TensorFlow 1's tf.compat.v1.Session is one.)
    (r"(?i)\b(?:this|that|the same|same|previous|earlier|later|next|last|whole|work) "
     r"session\b", "a work session", ["session"]),
    (r"(?i)\bsessions? (?:log|notes?)\b", "a work session", ["session"]),
    (r"\bstops? \d+\b(?![-\w])|\b[Tt]he stop that\b", "a numbered stop", ["stop"]),
    (r"(?i)\breview(?:s|ed|er|ers|ing)?\b", "a review", ["review"]),
    (r"(?i)\b(?:green|red) runs?\b|\bruns? \d+(?:-\d+)? (?:green|red)\b|"
     r"\bsuite runs?\b|\bfresh-clone\b", "a record of suite runs",
     ["green", "red", "suite", "fresh-clone"]),
    (r"\bRESULTS: ", "a record of suite runs", ["results: "]),
    (r"\|\s*issues?\s*\|", "an issue column", ["issue"]),
    (r"(?i)\b(?:the|this|that|an?|its|our) [\w-]+ issue(?:'s)?\b(?! tracking)|\bissue's\b|"
     r"\bissue [\"#\d]|\(issue\b", "a reference to a tracker issue", ["issue"]),
    (r"(?i)\bwork ?log\b|\bin this session\b|\bprevious commit\b|"
     r"\b(?:before|after|since) (?:this|that|the last) (?:change|commit)\b",
     "a work-log phrase", ["work", "session", "commit", "change"]),
]

# Third-party text, kept verbatim.
THIRD_PARTY = {"LICENSE"}
# Raw output the benchmarks wrote (numbers and the arguments they ran with).
RAW_OUTPUT = re.compile(r"^results/.*\.jsonl?$")
# This file names the patterns it looks for.
SELF = os.path.relpath(os.path.abspath(__file__), ROOT)


def tracked_text_files():
    """(path, text) of every file git tracks that decodes as UTF-8 and has no NUL byte."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                                check=True, timeout=60).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    for path in filter(None, listed.decode().split("\0")):
        if path in THIRD_PARTY or path == SELF or RAW_OUTPUT.match(path):
            continue
        full = os.path.join(ROOT, path)
        if not os.path.isfile(full):
            continue  # deleted in the working tree
        with open(full, "rb") as f:
            data = f.read()
        if b"\0" in data:
            continue
        try:
            yield path, data.decode("utf-8")
        except UnicodeDecodeError:
            continue


COMPILED = [(re.compile(p), what, words) for p, what, words in PATTERNS]


def hits(text, path):
    lowered = text.lower()
    # A pattern is tried only on files that hold one of its words (a cheap test), and
    # on the lines of those that match it anywhere.
    wanted = [(pattern, what, words) for pattern, what, words in COMPILED
              if any(word in lowered for word in words) and pattern.search(text)]
    if not wanted:
        return
    for number, line in enumerate(text.splitlines(), 1):
        for pattern, what, _ in wanted:
            match = pattern.search(line)
            if match:
                yield f"{path}:{number}: {what}: {match.group(0)!r} in {line.strip()[:120]!r}"


def test_patterns_catch_and_spare():
    caught = ["as #16 asks", "#16's target", "item 4, where it stands", "in this session",
              "| topic | issue | file |", "the fused-wire issue's 25x", "run 19 green",
              "RESULTS: fresh-clone run 5 green", "after review", "the stop that ended"]
    spared = ["#include <vector>", "keras-team/keras#18624", "color='#333'",
              "for item in items:", "a tf.compat.v1.Session", "serving a session that runs",
              "its metrics' results: twice", "`all_reduce` issues two",
              "the SIMD loops stop 16-24 bytes before the end", "x = d.items()",
              "run 1: uncompressed", "# noqa: E731", "issue tracking systems"]
    for line in caught:
        assert list(hits(line, "x")), line
    for line in spared:
        assert not list(hits(line, "x")), line


def test_no_development_log_words():
    found = [hit for path, text in tracked_text_files() for hit in hits(text, path)]
    assert not found, "development-log words:\n" + "\n".join(found[:200])
