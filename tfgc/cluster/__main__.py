"""`python -m tfgc.cluster`: see `tfgc.cluster.cli.main`."""
import os
import sys

# The tasks started below inherit this: TensorFlow's C++ start-up logs stay quiet unless
# the user set a level.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfgc.cluster.cli import main
from tfgc.cluster.isolation import isolate

# Before anything listens: the cluster must not be reachable from other hosts.
isolate()
sys.exit(main())
