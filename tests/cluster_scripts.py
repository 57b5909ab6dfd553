"""What the cluster tests' scripts share: their preamble and the REPORT protocol.

A cluster test writes a script for a process of its own (ParameterServerStrategy rewires
the eager context of the process that connects to a cluster, and one process cannot
connect to a second cluster safely), runs it, and reads back one JSON object, the last
line of its stdout that starts with `REPORT `.
"""
import json
import textwrap

REPORT_PREFIX = "REPORT "

# Imports every coordinator and worker script uses, TF's logging quietened before
# TensorFlow loads, and `send_report`, the script's side of the protocol.
PREAMBLE = f'''\
import contextlib, json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import tensorflow as tf
import tf_keras
import tfgc
import tfgc_ops
from tfgc import cluster


def send_report(result):
    print({REPORT_PREFIX!r} + json.dumps(result), flush=True)


'''


# With "--pass-handles" among a script's arguments, the servers' variables are not named
# (tfgc.ps.server_variables) and every step passes their handles, as TensorFlow does it:
# the baseline that named variables are compared with.
PASS_HANDLES = """\
if "--pass-handles" in sys.argv:
    from tfgc.ps import server_variables
    server_variables.by_name = lambda variable: variable
    sys.argv.remove("--pass-handles")
"""


def script(body, pass_handles=False):
    """The preamble followed by `body` (dedented): the text of a runnable script.

    Args:
      body: the script's own code.
      pass_handles: whether the script takes "--pass-handles" (see PASS_HANDLES).
    """
    return PREAMBLE + (PASS_HANDLES if pass_handles else "") + textwrap.dedent(body)


def read_report(stdout, stderr=""):
    """The JSON object of the last REPORT line of a script's stdout.

    Raises:
      AssertionError: no such line (the message shows the end of stdout and stderr).
    """
    lines = [line for line in stdout.splitlines() if line.startswith(REPORT_PREFIX)]
    assert lines, (f"the script printed no {REPORT_PREFIX!r} line:\n"
                   f"{stdout[-3000:]}\n{stderr[-5000:]}")
    return json.loads(lines[-1][len(REPORT_PREFIX):])
