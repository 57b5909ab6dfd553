"""The op library loader refuses a library built for another TensorFlow, clearly."""
import json
import os
import shutil
import subprocess
import sys

import tfgc_ops


def import_copy(tmp_path, edit):
    package = tmp_path / "tfgc_ops"
    shutil.copytree(os.path.dirname(tfgc_ops.__file__), package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    edit(package)
    env = dict(os.environ, PYTHONPATH=str(tmp_path), TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, "-c", "import tfgc_ops"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_version_mismatch_says_what_to_run(tmp_path):
    def pretend_other_version(package):
        info = json.loads((package / "build_info.json").read_text())
        info["tensorflow"] = "2.0.0"
        (package / "build_info.json").write_text(json.dumps(info))

    result = import_copy(tmp_path, pretend_other_version)
    assert result.returncode != 0
    assert "built for TensorFlow 2.0.0" in result.stderr
    assert "pip install --no-build-isolation --force-reinstall --no-deps -e ." in result.stderr


def test_missing_library_says_what_to_run(tmp_path):
    def remove_library(package):
        for name in os.listdir(package):
            if name.endswith(".so"):
                os.remove(package / name)

    result = import_copy(tmp_path, remove_library)
    assert result.returncode != 0
    assert "not built" in result.stderr and "pip install" in result.stderr


def test_loaded_library_is_the_recorded_one():
    info_path = os.path.join(os.path.dirname(tfgc_ops.__file__), "build_info.json")
    with open(info_path) as f:
        info = json.load(f)
    assert os.path.basename(tfgc_ops.library_path) == info["library"]
