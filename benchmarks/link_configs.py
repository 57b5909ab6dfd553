"""The training configurations that the link benchmarks compare, as `models.train` arguments.

`benchmarks.round_trips` and `benchmarks.time_to_accuracy` run them by name; the
headlines read their local steps. Standard library only.
"""

_THREELC = ["--compression", "threelc", "--pull-compression", "threelc"]
_AVERAGE = ["--outer-optimizer", "average"]

CONFIGS = {
    "fp32": ["--compression", "none", "--pull-compression", "none"],
    # Cast on the pushes, the baseline a user picks first; pulls stay fp32.
    "bf16": ["--compression", "bf16", "--pull-compression", "none"],
    "threelc": _THREELC,
    "threelc-h4": _THREELC + ["--local-steps", "4"] + _AVERAGE,
    "threelc-h16": _THREELC + ["--local-steps", "16"] + _AVERAGE,
    # The coordinator's call crosses once per 4 (16) steps: what its dispatch costs.
    "threelc-spe4": _THREELC + ["--steps-per-execution", "4"],
    "threelc-h16-spe16": _THREELC + ["--local-steps", "16"] + _AVERAGE
    + ["--steps-per-execution", "16"],
    "threelc-1.75-entropy": ["--compression", "threelc:sparsity=1.75,coder=entropy",
                             "--pull-compression", "threelc:sparsity=1.75,coder=entropy"],
    "powersgd": ["--compression", "powersgd", "--pull-compression", "none"],
}


def train_args(config, strategy):
    """`models.train` arguments of `config` under `strategy` ("ps" or "mwms").

    Raises:
      ValueError: steps per execution asked of MultiWorkerMirrored (they are the
        parameter-server coordinator's).
    """
    args = list(CONFIGS[config])
    if strategy == "mwms":
        if "--steps-per-execution" in args:
            raise ValueError(f"{config}: steps per execution are the coordinator's (ps only)")
        # All-reduce has no pulls; the push codec is what crosses.
        i = args.index("--pull-compression")
        del args[i:i + 2]
    return args


def local_steps(config):
    """H of `config`: the steps between meetings (1: synchronous)."""
    args = CONFIGS[config]
    return int(args[args.index("--local-steps") + 1]) if "--local-steps" in args else 1
