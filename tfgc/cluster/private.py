"""`python -m tfgc.cluster.private COMMAND [ARGS...]`: COMMAND in a private network.

Moves into a network namespace whose only interface is loopback (see `isolation`),
then runs COMMAND there, e.g. a test suite that starts clusters of its own:
`python -m tfgc.cluster.private python -m pytest -q`. COMMAND keeps this pid.
"""
import os
import sys
from typing import Optional, Sequence

from tfgc.cluster import isolation


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    isolation.isolate()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    sys.exit(main())
