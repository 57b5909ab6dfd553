"""Build script: compiles tfgc_ops/cc/*.cc into one op library against the installed TF.

The compiler flags come from the TensorFlow that is importable at build time
(`tf.sysconfig`); the TF version is recorded next to the library so that `import
tfgc_ops` can refuse a library built for another TensorFlow with a clear message.
"""
import glob
import json
import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# Flags that are ours rather than TensorFlow's (docs/ops.md). -fno-wrapv undoes the
# -fwrapv of Python's CFLAGS, which setuptools passes first: wrapping signed arithmetic
# keeps loops with signed indices from being optimized (3x slower stochastic rounding).
# The cores are free of signed overflow (the fuzz targets run under UBSan).
EXTRA_COMPILE_ARGS = ["-O3", "-g0", "-DNDEBUG", "-fvisibility=hidden", "-fno-wrapv",
                      "-Wno-deprecated-declarations", "-Wno-interference-size"]


class BuildTensorFlowOps(build_ext):
    """build_ext that adds TensorFlow's compile/link flags and records its version."""

    def build_extensions(self):
        import tensorflow as tf  # imported here: only building needs it

        for ext in self.extensions:
            ext.extra_compile_args = tf.sysconfig.get_compile_flags() + EXTRA_COMPILE_ARGS
            ext.extra_link_args = tf.sysconfig.get_link_flags()
        # setuptools would compile .cc files with the C compiler's flags; force C++.
        self.compiler.compiler_so = [
            arg for arg in self.compiler.compiler_so if arg != "-Wstrict-prototypes"
        ]
        super().build_extensions()
        for ext in self.extensions:
            library = self.get_ext_fullpath(ext.name)
            info = {"tensorflow": tf.__version__, "library": os.path.basename(library)}
            folders = {os.path.dirname(library)}
            if self.inplace or getattr(self, "editable_mode", False):
                # Editable installs copy only the library out of the build folder.
                folders.add(os.path.join(os.path.dirname(os.path.abspath(__file__)), "tfgc_ops"))
            for folder in folders:
                with open(os.path.join(folder, "build_info.json"), "w") as f:
                    json.dump(info, f)
                    f.write("\n")


setup(
    ext_modules=[
        Extension(
            "tfgc_ops._tfgc_ops",
            sources=sorted(glob.glob("tfgc_ops/cc/*.cc")),
            depends=sorted(glob.glob("tfgc_ops/cc/*.h")),
            language="c++",
        )
    ],
    cmdclass={"build_ext": BuildTensorFlowOps},
)
