"""MQGrad's agent: the MDP (Cui et al., sections 3.2-3.3), its SARSA learner, and a
time model, in numpy; no Keras here (the callback is `tfgc.mqgrad.callback`)."""
import collections.abc
import json
import math
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from tfgc import _compat
from tfgc.codecs.quantize import MAX_BITS, MIN_BITS

KEEP = 0
"""The action that keeps the number of bits."""
ADD = 1
"""The action that adds one bit."""
_STATE_VERSION = 1
REWARD_NORMALIZATIONS = ("none", "rms")


# --- the formulas ------------------------------------------------------------------------


def smooth_losses(losses: Union[np.ndarray, Sequence[float]], previous: float,
                  alpha: float) -> np.ndarray:
    """Eq. (1): exponential moving average over a window, chained across windows.

    L̄_t^1 = alpha * L_t^1 + (1 - alpha) * L̄_{t-1}^T and
    L̄_t^i = alpha * L_t^i + (1 - alpha) * L̄_t^{i-1} for 1 < i <= T.

    Args:
      losses: the window's T global losses, oldest first.
      previous: L̄_{t-1}^T, the last smoothed value of the previous window.
      alpha: the smoothing weight of the newest loss.

    Returns:
      The T smoothed losses as a float64 array.
    """
    smoothed = np.empty(len(losses), np.float64)
    last = float(previous)
    for i, loss in enumerate(losses):
        last = alpha * float(loss) + (1.0 - alpha) * last
        smoothed[i] = last
    return smoothed


def loss_slope(smoothed: Union[np.ndarray, Sequence[float]]) -> float:
    """β of the least-squares line β·i + b through the smoothed losses at i = 1..T."""
    y = np.asarray(smoothed, np.float64)
    if y.size < 2:
        return 0.0
    i = np.arange(1, y.size + 1, dtype=np.float64)
    i -= i.mean()
    return float(np.dot(i, y - y.mean()) / np.dot(i, i))


def reward(smoothed: Union[np.ndarray, Sequence[float]], cost_ms: float,
           reward_scale: float) -> float:
    """Eq. (2): R = -β · reward_scale / c, c the window's time in milliseconds.

    A falling loss (β < 0) earns a positive reward, larger when it fell in less time.
    """
    if not cost_ms > 0:
        raise ValueError(f"the time of a window must be positive, got {cost_ms} ms")
    return -loss_slope(smoothed) * reward_scale / cost_ms


# --- the agent ---------------------------------------------------------------------------


# A plain Trackable (not a tf.Module): no automatic wrapping of the many dict and list
# attributes, which would cost tens of microseconds per iteration.
class MQGradAgent(_compat.Trackable):  # type: ignore[misc,valid-type]  # a class the fence resolves at import
    """The MQGrad MDP (section 3.3, Algorithm 2) and its SARSA learner.

    Call `observe(loss, cost_ms)` once per training iteration m = 0, 1, ... with the
    global loss of that iteration and its time; it returns the bits to quantize with from
    the next iteration on. On iterations with m % T == 0 it runs MDP step t = m // T:

    1. The window's losses L_t (iterations (t-1)T+1 .. tT) are smoothed by Eq. (1) into
       L̄_t, chaining from the last smoothed value of the previous window.
    2. Transition, Eq. (3): s_t = [n_t, L̄_t] with n_t = n_{t-1} + argmax_a Q(s_{t-1}, a):
       the state keeps the *greedy* choice, even when the action taken was exploratory.
    3. Reward, Eq. (2): r_{t-1} = -β · reward_scale / c_t, β the least-squares slope of
       L̄_t against 1..T and c_t the window's time in ms.
    4. a_t is drawn epsilon-greedily from Q(s_t, ·).
    5. SARSA: v += eta · [r_{t-1} + discount · Q(s_t, a_t) - Q(s_{t-1}, a_{t-1})] · ∂Q(s_{t-1}, a_{t-1})/∂v.
    6. The workers get n_t + a_t bits for the next T iterations.

    At t = 0 there is no window yet: L̄_{-1}^T is taken to be the first loss, so
    L̄_0 = [L_0] * T, and there is no reward or update; only a_0 is drawn.

    Q-network: the input is L̄_t (T values: the 5 input nodes of section 4.1 when T = 5);
    one hidden ReLU layer (10 units); one linear output per bits level (7 for 2..8).
    The paper's 7 outputs and its 2 actions are reconciled as Q(s, a) = output[n + a]:
    the value of action a in state s is the output of the level it leads to. Action ADD
    is not offered when n is already `max_bits`. Weights start Glorot-uniform (biases at
    zero) from the agent's own generator.

    Policy: as written in the paper, the greedy action is taken with probability
    1 - epsilon and the other action with probability epsilon (not the textbook
    "uniform with probability epsilon", which would pick the greedy one 1 - epsilon/2 of
    the time).

    Bits: the state's n_t never decreases. The bits sent, n_t + a_t, follow Eq. (3)
    literally, which has two consequences the paper does not spell out: they can drop
    back by one after an exploratory ADD that the greedy policy did not endorse (the
    next state is built from the greedy choice), and they can rise by two in one step
    (a greedy ADD moves n_t and the next action adds one more).

    Discount and reward scale: the paper calls both gamma and sets gamma = 300. As a TD
    discount 300 makes the values diverge (the backup multiplies them by 300 every step),
    so the two are separate here: `reward_scale=300` multiplies the reward as in Eq. (2),
    and `discount=0.9` (a bounded-value choice, as in DQN-era SARSA) discounts the
    bootstrap.

    Two options go beyond the paper, and are on by default: with them MQGrad reached
    each loss target before the paper's fixed widths (2, 4 and 8 bits) in 3 to 5 of 5
    seeds of a study, where the paper's agent drifted to 7-8 bits and took 1.1-1.5x as
    long; a fixed 3 bits was faster than either (docs/results/mqgrad.md).
    `reward_normalization="none", epsilon_decay=1.0` is the paper's agent:

    * `reward_normalization="rms"` divides each reward by the root mean square of all
      rewards so far (this one included). Eq. (2)'s rewards are slopes of smoothed losses
      per millisecond, ~1e-3 at the paper's scale, while the network starts with outputs
      of order 1, so for hundreds of MDP steps its random initialization, not the
      rewards, decides which level looks best. Normalized rewards are of order 1 whatever
      the units of loss and time.
    * `epsilon_decay` multiplies epsilon once per MDP step: exploration early, when the
      values are unknown, and less later, when an exploratory ADD costs bits for good.

    Checkpoints: the agent is a trackable object whose whole state is one string tensor
    (JSON, floats written exactly), saved and restored by `tf.train.Checkpoint`. It holds no
    tf.Variable, so it can live in any process and under any strategy scope.

    Args:
      T: iterations per MDP step.
      initial_bits: n_0.
      min_bits: the lowest bits level (2 in the paper).
      max_bits: the highest bits level (8 in the paper; 7 levels, 7 outputs).
      alpha: smoothing weight of Eq. (1).
      epsilon: exploration probability.
      eta: SARSA step size.
      discount: TD discount of the bootstrap term.
      reward_scale: the reward's scale (the paper's gamma = 300 in Eq. (2)).
      reward_normalization: "rms" (divided by the running root mean square of the
        rewards) or "none" (Eq. (2) as is, the paper).
      epsilon_decay: factor in (0, 1] applied to epsilon after every MDP step (1.0: the
        paper's constant epsilon).
      hidden_units: width of the hidden layer.
      seed: seeds the network's initialization and the exploration draws (None: random).
        Agents with equal arguments and seeds make identical decisions from identical
        inputs.
      name: a name for the agent.
    """

    def __init__(self, T: int = 5, initial_bits: int = MIN_BITS,  # noqa: N803 (the paper's T)
                 min_bits: int = MIN_BITS, max_bits: int = MAX_BITS, alpha: float = 0.01,
                 epsilon: float = 0.1, eta: float = 0.1, discount: float = 0.9,
                 reward_scale: float = 300.0, hidden_units: int = 10,
                 reward_normalization: str = "rms", epsilon_decay: float = 0.99,
                 seed: Optional[int] = None, name: Optional[str] = None) -> None:
        self.name = name or "mqgrad_agent"
        if int(T) < 1:
            raise ValueError(f"T must be at least 1, got {T}")
        if not MIN_BITS <= int(min_bits) <= int(max_bits) <= MAX_BITS:
            raise ValueError(
                f"need {MIN_BITS} <= min_bits <= max_bits <= {MAX_BITS}, got {min_bits}, {max_bits}")
        if not int(min_bits) <= int(initial_bits) <= int(max_bits):
            raise ValueError(f"initial_bits {initial_bits} outside [{min_bits}, {max_bits}]")
        for label, value, low, high in (("alpha", alpha, 0, 1), ("epsilon", epsilon, 0, 1),
                                        ("discount", discount, 0, 1)):
            if not low <= value <= high:
                raise ValueError(f"{label} must be in [{low}, {high}], got {value}")
        if not eta > 0 or not reward_scale > 0 or int(hidden_units) < 1:
            raise ValueError("eta and reward_scale must be positive and hidden_units >= 1")
        if reward_normalization not in REWARD_NORMALIZATIONS:
            raise ValueError(f"reward_normalization must be one of {REWARD_NORMALIZATIONS}, "
                             f"got {reward_normalization!r}")
        if not 0 < epsilon_decay <= 1:
            raise ValueError(f"epsilon_decay must be in (0, 1], got {epsilon_decay}")
        self.config: dict[str, Any] = dict(
            T=int(T), initial_bits=int(initial_bits), min_bits=int(min_bits),
            max_bits=int(max_bits), alpha=float(alpha), epsilon=float(epsilon),
            eta=float(eta), discount=float(discount), reward_scale=float(reward_scale),
            hidden_units=int(hidden_units), reward_normalization=reward_normalization,
            epsilon_decay=float(epsilon_decay))
        self.seeded = seed is not None
        self._rng = np.random.Generator(np.random.PCG64(seed))
        levels = self.config["max_bits"] - self.config["min_bits"] + 1
        self.params = {
            "w1": _glorot(self._rng, self.config["T"], self.config["hidden_units"]),
            "b1": np.zeros(self.config["hidden_units"]),
            "w2": _glorot(self._rng, self.config["hidden_units"], levels),
            "b2": np.zeros(levels),
        }
        self.iteration = 0            # m: iterations observed so far
        self.t = 0                    # MDP steps taken so far
        self.bits = self.config["initial_bits"]   # bits the workers use now
        self.state_bits: Optional[int] = None  # n_{t-1} of the last state
        self.state_losses: Optional[np.ndarray] = None  # L̄_{t-1} of the last state
        self.action: Optional[int] = None  # a_{t-1}
        self.smoothed: Optional[float] = None  # L̄_{t-1}^T, where Eq. (1) chains from
        self.pending_losses: list[float] = []  # the current window's losses
        self.pending_costs: list[float] = []  # ... and times (ms)
        self.last_step: Optional[dict[str, Any]] = None  # diagnostics of the last MDP step
        self.reward_count = 0         # rewards seen, and the sum of their squares (for
        self.reward_square_sum = 0.0  # reward_normalization="rms")

    # Keys of the state that change during training (the config does not).
    _STATE_KEYS = ("iteration", "t", "bits", "state_bits", "state_losses", "action", "smoothed",
                   "pending_losses", "pending_costs", "last_step", "reward_count",
                   "reward_square_sum")

    @property
    def T(self) -> int:  # noqa: N802 (the paper's name)
        return self.config["T"]

    @property
    def epsilon(self) -> float:
        """The exploration probability of the next decision (after `epsilon_decay`)."""
        return self.config["epsilon"] * self.config["epsilon_decay"] ** self.t

    # --- the Q-network ---

    def q_values(self, losses: np.ndarray) -> np.ndarray:
        """The network's outputs for smoothed losses L̄ (one per bits level)."""
        hidden = np.maximum(self.params["w1"].T @ losses + self.params["b1"], 0.0)
        return self.params["w2"].T @ hidden + self.params["b2"]

    def q(self, state_bits: int, losses: np.ndarray, action: int) -> float:
        """Q(s, a) for s = [state_bits, losses]: the output of level state_bits + action."""
        return float(self.q_values(losses)[self._level(state_bits + action)])

    def q_gradient(self, state_bits: int, losses: np.ndarray,
                   action: int) -> dict[str, np.ndarray]:
        """∂Q(s, a)/∂v for every parameter v, as a dict like `params`."""
        k = self._level(state_bits + action)
        pre = self.params["w1"].T @ losses + self.params["b1"]
        hidden = np.maximum(pre, 0.0)
        back = self.params["w2"][:, k] * (pre > 0)
        grads = {
            "w1": np.outer(losses, back),
            "b1": back,
            "w2": np.zeros_like(self.params["w2"]),
            "b2": np.zeros_like(self.params["b2"]),
        }
        grads["w2"][:, k] = hidden
        grads["b2"][k] = 1.0
        return grads

    def actions(self, state_bits: int) -> tuple[int, ...]:
        """The actions available in a state with `state_bits` bits."""
        return (KEEP, ADD) if state_bits < self.config["max_bits"] else (KEEP,)

    def greedy(self, state_bits: int, losses: np.ndarray) -> int:
        """argmax_a Q(s, a) over the available actions (ties: KEEP)."""
        actions = self.actions(state_bits)
        values = [self.q(state_bits, losses, a) for a in actions]
        return actions[int(np.argmax(values))]

    def policy(self, state_bits: int, losses: np.ndarray) -> int:
        """Epsilon-greedy: the greedy action with probability 1 - epsilon, else the other."""
        greedy = self.greedy(state_bits, losses)
        actions = self.actions(state_bits)
        # One draw per decision, even without a choice, keeps the generator in step.
        explore = self._rng.random() < self.epsilon
        if explore and len(actions) > 1:
            return ADD if greedy == KEEP else KEEP
        return greedy

    def _level(self, bits):
        if not self.config["min_bits"] <= bits <= self.config["max_bits"]:
            raise ValueError(f"bits {bits} outside [{self.config['min_bits']}, {self.config['max_bits']}]")
        return bits - self.config["min_bits"]

    # --- the MDP ---

    def observe(
        self, loss: float, cost_ms: float,
        reduce: Optional[Callable[[np.ndarray, np.ndarray, int],
                                  tuple[np.ndarray, np.ndarray]]] = None,
    ) -> int:
        """Records iteration m's loss and time; runs MDP step m // T when m % T == 0.

        Args:
          loss: the global loss of this iteration (a non-finite loss is replaced by the
            last smoothed loss, i.e. it carries no information).
          cost_ms: the iteration's time in milliseconds (wall time or a `TimeModel`'s).
          reduce: optional `fn(losses, costs, bits) -> (losses, costs)` applied to the
            window before an MDP step, e.g. a mean over workers whose agents must agree.

        Returns:
          The bits to quantize with from the next iteration on.
        """
        loss = float(loss)
        if not math.isfinite(loss):
            loss = self.smoothed if self.smoothed is not None else 0.0
        self.pending_losses.append(loss)
        self.pending_costs.append(float(cost_ms))
        self.iteration += 1
        if (self.iteration - 1) % self.T == 0:
            losses: Union[list[float], np.ndarray]
            costs: Union[list[float], np.ndarray]
            losses, costs = self.pending_losses, self.pending_costs
            if reduce is not None:
                losses, costs = reduce(np.asarray(losses, np.float64),
                                       np.asarray(costs, np.float64), self.bits)
            self.pending_losses, self.pending_costs = [], []
            self.step(np.asarray(losses, np.float64), float(np.sum(costs)))
        return self.bits

    def step(self, losses: np.ndarray, cost_ms: float) -> int:
        """One MDP step (Algorithm 2) on a full window; returns the bits to send.

        Args:
          losses: the window's global losses (T of them; one at t = 0).
          cost_ms: the window's time c_t in milliseconds.
        """
        cfg = self.config
        if self.state_bits is None:  # t = 0
            self.smoothed = float(losses[0])
            smoothed = np.full(self.T, self.smoothed)
            state_bits = self.bits
            r, delta, greedy_previous = None, None, None
        else:
            # The first step set the smoothed loss, the state and the action together; mypy
            # cannot tell that from `state_bits` alone (the ignores below).
            if len(losses) != self.T:
                raise ValueError(f"an MDP step needs T={self.T} losses, got {len(losses)}")
            smoothed = smooth_losses(losses, self.smoothed, cfg["alpha"])  # type: ignore[arg-type]
            self.smoothed = float(smoothed[-1])
            # Eq. (3): the new state keeps the greedy choice made in the previous state.
            greedy_previous = self.greedy(self.state_bits,
                                          self.state_losses)  # type: ignore[arg-type]
            state_bits = self.state_bits + greedy_previous
            r = self._normalized(reward(smoothed, cost_ms, cfg["reward_scale"]))
        action = self.policy(state_bits, smoothed)
        if r is not None:
            target = r + cfg["discount"] * self.q(state_bits, smoothed, action)
            delta = target - self.q(self.state_bits, self.state_losses,  # type: ignore[arg-type]
                                    self.action)  # type: ignore[arg-type]
            grads = self.q_gradient(self.state_bits, self.state_losses,  # type: ignore[arg-type]
                                    self.action)  # type: ignore[arg-type]
            for key, grad in grads.items():
                self.params[key] = self.params[key] + cfg["eta"] * delta * grad
        self.state_bits, self.state_losses, self.action = state_bits, smoothed, action
        self.bits = state_bits + action
        self.t += 1
        self.last_step = {
            "t": self.t - 1, "state_bits": state_bits, "action": action,
            "greedy_previous": greedy_previous, "reward": r, "td_error": delta,
            "cost_ms": cost_ms, "bits": self.bits, "slope": loss_slope(smoothed),
        }
        return self.bits

    def _normalized(self, r):
        if self.config["reward_normalization"] == "none":
            return r
        self.reward_count += 1
        self.reward_square_sum += r * r
        rms = math.sqrt(self.reward_square_sum / self.reward_count)
        return r / rms if rms > 0 else 0.0

    # --- checkpointing ---

    def get_state(self) -> dict[str, Any]:
        """The agent's whole state as a JSON-serializable dict (floats kept exactly)."""
        state = {key: _to_json(getattr(self, key)) for key in self._STATE_KEYS}
        state.update(
            version=_STATE_VERSION, config=_to_json(self.config),
            params=_to_json(self.params),
            rng=self._rng.bit_generator.state, seeded=self.seeded)
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores a state from `get_state` (the config must match this agent's)."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unknown MQGrad agent state version {state.get('version')}")
        if state["config"] != _to_json(self.config):
            raise ValueError(
                f"checkpointed MQGrad agent has config {state['config']}, this one {self.config}")
        for key in self._STATE_KEYS:
            setattr(self, key, state[key])
        if self.state_losses is not None:
            self.state_losses = np.asarray(self.state_losses, np.float64)
        self.params = {k: np.asarray(v, np.float64) for k, v in state["params"].items()}
        self._rng.bit_generator.state = state["rng"]
        self.seeded = state["seeded"]

    def _serialize_to_tensors(self):
        return {"state": tf.constant(json.dumps(self.get_state()))}

    def _restore_from_tensors(self, restored_tensors):
        self.set_state(json.loads(restored_tensors["state"].numpy().decode()))
        return tf.no_op()


def _glorot(rng, fan_in, fan_out):
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, size=(fan_in, fan_out))


def _to_json(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, collections.abc.Mapping):
        return {k: _to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    return value


# --- time ----------------------------------------------------------------------------------


class TimeModel:
    """Charges an iteration compute time plus the time its payload takes on a link.

    cost_ms = compute_ms (or the measured wall time when None)
              + 1000 * bytes_per_step * (2 if round_trip else 1) / bandwidth

    `round_trip` counts the server's reply as well: in Algorithm 1 (line 54) the server
    quantizes the averaged gradient with the same bits and sends it back.

    Args:
      bandwidth: link bandwidth in bytes per second (the paper's cluster: 10 MB/s).
      compute_ms: fixed compute time per iteration in ms, for runs that must not
        depend on the machine's load; None charges the measured wall time.
      round_trip: also charge the reply.
    """

    def __init__(self, bandwidth: float, compute_ms: Optional[float] = None,
                 round_trip: bool = True) -> None:
        if not bandwidth > 0:
            raise ValueError(f"bandwidth must be positive bytes/s, got {bandwidth}")
        if compute_ms is not None and compute_ms < 0:
            raise ValueError(f"compute_ms must be >= 0, got {compute_ms}")
        self.bandwidth = float(bandwidth)
        self.compute_ms = compute_ms
        self.round_trip = bool(round_trip)

    def cost_ms(self, wall_ms: float, step_bytes: float) -> float:
        """The modelled time of one iteration that sent `step_bytes` bytes upstream."""
        compute = wall_ms if self.compute_ms is None else self.compute_ms
        wire = step_bytes * (2 if self.round_trip else 1)
        return float(compute) + 1000.0 * float(wire) / self.bandwidth
