"""The command line of `python -m models.train`: its options and codec specs."""
import argparse
import ast

from models.divergence import EXIT_DIVERGED
from models.supervise import EXIT_TASK_LOST

STRATEGIES = ("local", "ps", "mwms")
_CODEC_ALIASES = {
    "none": ("NoCompression", {}),
    "fp32": ("NoCompression", {}),
    "fp16": ("Cast", {"dtype": "float16"}),
    "float16": ("Cast", {"dtype": "float16"}),
    "bf16": ("Cast", {"dtype": "bfloat16"}),
    "bfloat16": ("Cast", {"dtype": "bfloat16"}),
    "ternary": ("StochasticTernary", {}),
    "3lc": ("ThreeLC", {}),
}


# --- compression specs --------------------------------------------------------------------


def parse_compression(spec):
    """Parses a compression spec such as "threelc:sparsity=1.75" into a tfgc codec.

    The name is a `tfgc.codecs` class name (case and underscores ignored) or an alias
    (none, fp16, bf16, ternary, 3lc); arguments are `key=value` pairs separated by
    commas, values parsed as Python literals (else kept as strings).

    Raises:
      ValueError: unknown codec, malformed argument, or arguments the codec rejects.
    """
    cls, kwargs = _codec_class_and_arguments(spec)
    try:
        return cls(**kwargs)
    except TypeError as error:
        raise ValueError(f"bad arguments for {cls.__name__} in {spec!r}: {error}") from None


def default_momentum(spec):
    """SGD's momentum for a run compressed by `spec`: 0.9, or 0 where the codec applies
    momentum itself before compressing (Signum)."""
    return 0.0 if _codec_class_and_arguments(spec)[0].momentum_on_sender else 0.9


def fill_optimizer_defaults(args):
    """Fills --optimizer, --lr and --lr-final where they were left out: SGD at the
    model's rate (`workloads.default_lr`) down to 0.001, or Adam from 0.001 to 1e-5."""
    from models import workloads

    args.optimizer = args.optimizer or "sgd"
    adam = args.optimizer == "adam"
    if args.lr is None:
        args.lr = 0.001 if adam else workloads.default_lr(args.model)
    if args.lr_final is None:
        args.lr_final = 1e-5 if adam else 0.001


def default_outer_optimizer(strategy):
    """--outer-optimizer's default under `strategy`: average under parameter servers
    (where each worker's meeting is an outer step of its own, and Nesterov meetings did
    not train ResNet-20), else nesterov (DiLoCo's)."""
    return "average" if strategy == "ps" else "nesterov"


def _codec_class_and_arguments(spec):
    """(the codec class, its keyword arguments) of a compression spec (see
    `parse_compression`), without making the codec."""
    from tfgc import codecs

    name, _, arg_text = spec.strip().partition(":")
    key = name.strip().lower().replace("_", "").replace("-", "")
    classes = {cls.lower(): cls for cls in codecs.names()}
    if name.strip().lower() in _CODEC_ALIASES:
        class_name, kwargs = _CODEC_ALIASES[name.strip().lower()]
        kwargs = dict(kwargs)
    elif key in classes:
        class_name, kwargs = classes[key], {}
    else:
        known = sorted(set(_CODEC_ALIASES) | set(classes))
        raise ValueError(f"unknown compression {name!r} in {spec!r}; known: {', '.join(known)}")
    kwargs.update(_key_values(arg_text, "compression", spec))
    return codecs.lookup(class_name), kwargs


def _key_values(text, option, spec):
    """{key: value} from "key=value,key=value"; values are Python literals, else strings."""
    kwargs = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{option} argument {item!r} in {spec!r} is not key=value")
        try:
            kwargs[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            kwargs[key.strip()] = value.strip()
    return kwargs


def parse_agent_arguments(text):
    """MQGradAgent keyword arguments from "T=10,initial_bits=3" (values as Python
    literals, else strings), checked by building an agent.

    Raises:
      ValueError: a malformed item, or arguments the agent rejects.
    """
    from tfgc import mqgrad

    kwargs = _key_values(text, "--mqgrad", text)
    if "seed" in kwargs:
        raise ValueError("--mqgrad takes the agent's seed from --seed")
    try:
        mqgrad.MQGradAgent(**kwargs)
    except (TypeError, ValueError) as error:
        raise ValueError(f"bad --mqgrad arguments {text!r}: {error}") from None
    return kwargs


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m models.train",
        description="Train a reference model with compressed gradients, locally or on a "
                    "local TF cluster.",
        epilog=f"Exit status: 0 when the run completed; 1 for other errors; 2 for bad "
               f"options; "
               f"{EXIT_DIVERGED} when the training loss became NaN or infinite (the run "
               f"stops at once, is not restarted, and says which model, step and learning "
               f"rate: retry with a lower --lr); {EXIT_TASK_LOST} when a task of the local "
               f"parameter-server cluster died more than --max-restarts times.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--model", default="resnet20",
        help="resnet20/32/44/56/110 or mqgrad_cnn (images), or a sparse linear model of "
             "FastSGD: logistic, svm or linear")
    add("--dataset", default=None,
        help="images: cifar10 (default), cifar100, fashion_mnist or digits; sparse models: "
             "reuters_corn (default), reuters_grain or libsvm:PATH")
    add("--hash-dim", type=int, default=2**20,
        help="sparse models on Reuters: hashed feature count")
    add("--plain-reads", dest="packed_reads", action="store_false",
        help="sparse models under --strategy ps: send the ids of the weights each step "
             "reads as int32, as tf.gather does (default: packed by FastSGD's key "
             "encoder, ~9 bits per id on Reuters)")
    add("--allow-substitute", action="store_true",
        help="use real Fashion-MNIST (recorded as a substitute) if CIFAR is not available")
    add("--data-dir", default=None, help="tensorflow-datasets data_dir for CIFAR")
    add("--manual-dir", default=None, help="directory holding cifar-10-binary.tar.gz")
    add("--download", action="store_true", help="let tensorflow-datasets download CIFAR")
    add("--train-limit", type=int, default=None, help="use the first N training images")
    add("--test-limit", type=int, default=None, help="evaluate on the first N test images")
    add("--compression", default="none", help="codec spec, e.g. threelc:sparsity=1.75")
    add("--pull-compression", default="none",
        help="codec spec for model pulls from parameter servers (3LC; --strategy ps or "
             "local), e.g. threelc; none: fp32 pulls")
    add("--mqgrad", nargs="?", const="", default=None, metavar="KEY=VALUE,...",
        help="let MQGrad's agent pick the bits of --compression quantize during training "
             "(tfgc.callbacks.MQGrad on wall time, seeded by --seed; the bits start at the "
             "agent's initial_bits); optional agent arguments, e.g. T=10,initial_bits=3")
    add("--no-error-feedback", dest="error_feedback", action="store_false",
        help="disable error feedback (residual accumulation)")
    add("--local-steps", type=int, default=1,
        help="H > 1: each replica trains its own copy H steps, then the replicas meet: "
             "their pseudo-gradients cross with --compression and the outer optimizer "
             "applies the mean (DiLoCo; --strategy mwms or local; the learning rate is "
             "then not scaled by the replicas). Under --strategy ps each worker trains its "
             "caches of compressed pulls (--pull-compression) and meets the server alone")
    add("--outer-optimizer", choices=("nesterov", "average"), default=None,
        help="with --local-steps: nesterov (DiLoCo's: --outer-lr, --outer-momentum) or "
             "average (every copy becomes the replicas' mean, 3LC's local-steps baseline). "
             "Default: average under --strategy ps (where Nesterov meetings, applied one "
             "worker at a time, did not train ResNet-20: docs/results/local-steps.md), "
             "else nesterov")
    add("--recompute-statistics", type=int, default=None, metavar="BATCHES",
        help="before the test, set the batch norms' moving statistics to the mean of "
             "their batch statistics over this many training batches with the trained "
             "weights (tfgc.recompute_statistics; under --strategy mwms each worker "
             "tests a copy of its weights, recomputed from the same batches). Default: 10 "
             "with --local-steps, else 0 (the statistics training kept)")
    add("--steps-per-execution", type=int, default=1, metavar="N",
        help="steps per call the coordinator sends a worker (Keras steps_per_execution; "
             "--strategy ps). The call crosses once per N steps, but the loop's control "
             "crosses to the servers every step: with --local-steps 8, N=8 sent more bytes "
             "per step than N=1, not fewer (docs/results/local-steps.md)")
    add("--outer-lr", type=float, default=0.7, help="the nesterov outer learning rate")
    add("--outer-momentum", type=float, default=0.9, help="the nesterov outer momentum")
    add("--min-elements", type=int, default=1024,
        help="variables with fewer elements are sent uncompressed")
    add("--strategy", choices=STRATEGIES, default="local")
    add("--workers", type=int, default=2)
    add("--ps", type=int, default=1, help="parameter servers (--strategy ps)")
    add("--link", default=None, metavar="RATE[/DELAY[/LOSS]]",
        help="emulated links: a rate, a one-way delay and a loss rate, e.g. 10mbit/25ms "
             "(a 50 ms round trip) or 1mbit/50ms/0.1%% (ps, mwms; root and iproute2)")
    add("--bandwidth", default=None,
        help="emulated link bandwidth, e.g. 10mbit: the same as --link 10mbit")
    add("--steps", type=int, default=100, help="training steps (see the strategies)")
    add("--log-every", type=int, default=50,
        help="steps per Keras epoch (progress bar line, TensorBoard point, socket read)")
    add("--eval-every", type=int, default=0, metavar="N",
        help="also test on the held-out set every N Keras epochs (--log-every steps each), "
             "as the final test does; the summary's held_out rows give the training time "
             "of each (the tests' own time is not counted); 0: only at the end")
    add("--batch-size", type=int, default=32, help="per-worker batch")
    add("--lr", type=float, default=None,
        help="initial learning rate per replica, scaled by the synchronous replicas "
             "(default: SGD with --momentum at 0.1 for the ResNets, 0.01 for mqgrad_cnn; "
             "--optimizer adam at 0.001; Adam at 0.01 for sparse models). ResNets deeper "
             "than 20 layers warm up linearly from a tenth of it over their first 400 steps")
    add("--lr-final", type=float, default=None,
        help="learning rate at the last step (default: 0.001; --optimizer adam: 1e-5)")
    add("--optimizer", choices=("sgd", "adam"), default=None,
        help="the image models' optimizer (default sgd): sgd (with --momentum) or adam "
             "(tf_keras Adam; with --weight-decay-mode optimizer it is AdamW, DiLoCo's "
             "inner optimizer), both on the cosine schedule. The sparse models use Adam "
             "and take no --optimizer")
    add("--momentum", type=float, default=None,
        help="SGD's momentum (default: 0.9; 0 with a codec that applies momentum before "
             "it compresses, signum)")
    add("--weight-decay", type=float, default=1e-4,
        help="L2 lambda (sparse models: on the batch's features)")
    add("--weight-decay-mode", choices=("loss", "optimizer"), default="loss",
        help="loss: an L2 term on the kernels, in the compressed gradients (He et al., "
             "3LC); optimizer: decoupled decay applied by the optimizer on the variable's "
             "device. Under PSS the L2 term reads every kernel a second time, which "
             "doubles the bytes pulled from the parameter servers")
    add("--no-augment", dest="augment", action="store_false", help="no random crop / flip")
    add("--no-tensorboard", dest="tensorboard", action="store_false")
    add("--seed", type=int, default=0)
    add("--name", default=None, help="run name (default: model-dataset-compression-strategy)")
    add("--out", default=None, help="output directory (default: runs/<name>)")
    add("--timeout", type=float, default=1800,
        help="cluster processes exit after this many seconds")
    add("--verbose", default="auto", choices=("auto", "0", "1", "2"),
        help="Keras fit verbosity (auto: a progress bar, one line per epoch under "
             "parameter servers, which refuse the bar)")
    add("--tf-config", action="store_true",
        help="use the cluster in $TF_CONFIG instead of starting local processes (ps: run "
             "this as the chief task; mwms: run this in every worker task)")
    add("--max-restarts", type=int, default=3,
        help="--strategy ps on a local cluster: after a parameter server (or any task) "
             "dies, restart the cluster and resume from the last backup this many times "
             "(0: no backups are saved)")
    add("--backup-every-s", type=float, default=60.0,
        help="with --max-restarts > 0: save the backup after each Keras epoch that ends "
             "this many seconds after the last save or the start of training (0: every "
             "epoch; each save costs ~1 s of the coordinator's time)")
    add("--_worker", action="store_true", help=argparse.SUPPRESS)
    add("--_attempt", action="store_true", help=argparse.SUPPRESS)
    return parser
