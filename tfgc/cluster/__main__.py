"""`python -m tfgc.cluster`: see `tfgc.cluster.cli.main`."""
import sys

from tfgc.cluster.cli import main
from tfgc.cluster.isolation import isolate

# Before anything listens: the cluster must not be reachable from other hosts.
isolate()
sys.exit(main())
