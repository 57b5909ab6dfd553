"""`models.train` with a meeting at every step: each worker runs its own Adam (its own
moments, on its cache of the model) and every worker's step is applied to the masters
in full (`tfgc.OuterSGD(learning_rate=W, momentum=0)`, `local_steps=1`).

That is the parameter servers' Adam without local steps, but with moments per worker,
which `models.train` cannot express (with `--local-steps 1` it has no meetings). It
trains in this process, without the supervisor that would start a fresh one
(`--_attempt`); raw output: results/local_steps/ps_adam_isolated/every_step_seedS.json.

    python -m tfgc.cluster.private python -m benchmarks.adam_every_step_probe \
        <models.train arguments> --_attempt
"""
import sys

import tfgc
from models import train
from tfgc.ps import local_steps as local_steps_ps


def every_step_in_full(args):
    """Each worker's step applied in full: the outer learning rate is the workers."""
    return tfgc.OuterSGD(learning_rate=float(args.workers), momentum=0.0)


class SaidMeetings(local_steps_ps.ServerMeetings):
    """ServerMeetings that say, once made, that the steps run through them."""

    def __init__(self, optimizer, variables):
        super().__init__(optimizer, variables)
        print(f"[every_step_probe] meetings every {optimizer.local_steps} step(s), inner "
              f"{type(self.inner).__name__}, outer learning rate "
              f"{optimizer.outer_optimizer.learning_rate:g}", flush=True)


if __name__ == "__main__":
    train.outer_optimizer = every_step_in_full
    local_steps_ps.ServerMeetings = SaidMeetings
    sys.exit(train.main(sys.argv[1:]))
