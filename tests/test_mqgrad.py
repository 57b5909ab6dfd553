"""MQGrad's formulas, agent and callback (single process)."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tfgc
from tfgc import mqgrad
from tfgc.mqgrad import ADD, KEEP, MQGradAgent


def frozen_agent(prefer, **kwargs):
    """An agent whose Q prefers ADD ("add") or KEEP ("keep") in every state, and barely
    learns (tiny eta), so that its greedy choices are known."""
    kwargs.setdefault("eta", 1e-12)
    agent = MQGradAgent(seed=0, **kwargs)
    agent.params["w2"][:] = 0.0
    levels = np.arange(agent.params["b2"].size, dtype=np.float64)
    agent.params["b2"] = levels if prefer == "add" else -levels
    return agent


# --- formulas -------------------------------------------------------------------------------


def test_smoothing_follows_eq1_and_chains_across_windows():
    smoothed = mqgrad.smooth_losses([4.0, 2.0], previous=10.0, alpha=0.5)
    np.testing.assert_array_equal(smoothed, [7.0, 4.5])  # .5*4+.5*10, .5*2+.5*7
    # The agent chains windows: its smoothed losses are one EMA over every loss.
    losses = np.random.default_rng(0).uniform(1, 3, size=1 + 3 * 4)
    agent = MQGradAgent(T=4, alpha=0.2, seed=0)
    for loss in losses:
        agent.observe(loss, 1.0)
    ema, expected = losses[0], []  # L̄_{-1}^T is the first loss
    for loss in losses[1:]:
        ema = 0.2 * loss + 0.8 * ema
        expected.append(ema)
    np.testing.assert_allclose(agent.state_losses, expected[-4:], rtol=1e-14)
    assert agent.smoothed == pytest.approx(expected[-1], rel=1e-14)


def test_slope_is_the_least_squares_beta():
    assert mqgrad.loss_slope([5.0, 4.5, 4.0, 3.5, 3.0]) == pytest.approx(-0.5)
    values = np.random.default_rng(1).normal(size=7)
    beta = np.polyfit(np.arange(1, 8), values, 1)[0]
    assert mqgrad.loss_slope(values) == pytest.approx(beta, rel=1e-12)
    assert mqgrad.loss_slope([3.0]) == 0.0


def test_reward_sign_and_scale():
    falling, rising = [3.0, 2.9, 2.8, 2.7, 2.6], [2.6, 2.7, 2.8, 2.9, 3.0]
    assert mqgrad.reward(falling, 50.0, 300.0) == pytest.approx(0.1 * 300 / 50)
    assert mqgrad.reward(rising, 50.0, 300.0) < 0
    # Faster windows earn more for the same fall.
    assert mqgrad.reward(falling, 25.0, 300.0) == pytest.approx(2 * mqgrad.reward(falling, 50.0, 300.0))
    with pytest.raises(ValueError, match="positive"):
        mqgrad.reward(falling, 0.0, 300.0)


def test_time_model_charges_compute_plus_bytes_over_bandwidth():
    model = mqgrad.TimeModel(bandwidth=1e6, compute_ms=20.0)
    assert model.cost_ms(wall_ms=999.0, step_bytes=5000) == pytest.approx(20.0 + 2 * 5.0)
    one_way = mqgrad.TimeModel(bandwidth=1e6, round_trip=False)
    assert one_way.cost_ms(wall_ms=7.0, step_bytes=5000) == pytest.approx(7.0 + 5.0)
    with pytest.raises(ValueError):
        mqgrad.TimeModel(bandwidth=0)


# --- the MDP --------------------------------------------------------------------------------


def test_mdp_steps_every_T_iterations():
    agent = MQGradAgent(T=5, seed=0)
    steps = []
    for m in range(16):
        before = agent.t
        agent.observe(2.0, 1.0)
        if agent.t != before:
            steps.append(m)
    assert steps == [0, 5, 10, 15]  # m % T == 0, t = m // T
    assert agent.last_step["t"] == 3
    assert agent.last_step["cost_ms"] == 5.0  # the window's T iterations


def test_transition_keeps_the_greedy_choice_and_workers_get_n_plus_a():
    # Greedy KEEP everywhere, but epsilon=1 always explores (ADD): the state stays at
    # n_0 (Eq. 3 uses the greedy choice) while the workers get n_t + 1.
    agent = frozen_agent("keep", epsilon=1.0, initial_bits=2)
    bits = [agent.observe(2.0 - 0.01 * m, 1.0) for m in range(21)]
    assert agent.state_bits == 2
    assert set(bits) == {3}
    # Greedy ADD, no exploration: n_t grows by one per step and the workers get
    # n_t + 1, up to max_bits, where only KEEP is left.
    agent = frozen_agent("add", epsilon=0.0, initial_bits=2)
    sent = []
    for m in range(41):
        before = agent.t
        bit = agent.observe(2.0, 1.0)
        if agent.t != before:
            sent.append((agent.state_bits, bit))
    assert sent[:4] == [(2, 3), (3, 4), (4, 5), (5, 6)]
    assert sent[-1] == (8, 8)


def test_sarsa_update_matches_a_hand_computed_step():
    agent = MQGradAgent(T=3, epsilon=0.0, eta=0.1, discount=0.9, reward_scale=300.0,
                        alpha=0.5, seed=5, reward_normalization="none")  # Eq. (2) as is
    agent.observe(2.0, 10.0)  # t = 0: s_0 = [2, (2, 2, 2)], a_0 chosen greedily
    n0, s0, a0 = agent.state_bits, agent.state_losses.copy(), agent.action
    before = {k: v.copy() for k, v in agent.params.items()}

    def q(params, x, level):
        hidden = np.maximum(params["w1"].T @ x + params["b1"], 0.0)
        return (params["w2"].T @ hidden + params["b2"])[level]

    losses, costs = [1.8, 1.7, 1.5], [10.0, 20.0, 30.0]
    for loss, cost in zip(losses, costs):
        agent.observe(loss, cost)
    # By hand: smoothing, transition, reward, greedy a_1, TD error, gradient.
    s1 = np.array([0.5 * 1.8 + 0.5 * 2.0, 0.0, 0.0])
    s1[1] = 0.5 * 1.7 + 0.5 * s1[0]
    s1[2] = 0.5 * 1.5 + 0.5 * s1[1]
    lo = agent.config["min_bits"]
    greedy0 = int(q(before, s0, n0 + 1 - lo) > q(before, s0, n0 - lo))
    n1 = n0 + greedy0
    beta = np.polyfit([1, 2, 3], s1, 1)[0]
    r = -beta * 300.0 / 60.0
    a1 = int(q(before, s1, n1 + 1 - lo) > q(before, s1, n1 - lo))
    delta = r + 0.9 * q(before, s1, n1 + a1 - lo) - q(before, s0, n0 + a0 - lo)
    # ∂Q/∂v by central differences.
    expected = {}
    for key, value in before.items():
        grad = np.zeros_like(value)
        for index in np.ndindex(value.shape):
            plus = {k: v.copy() for k, v in before.items()}
            minus = {k: v.copy() for k, v in before.items()}
            plus[key][index] += 1e-6
            minus[key][index] -= 1e-6
            level = n0 + a0 - lo
            grad[index] = (q(plus, s0, level) - q(minus, s0, level)) / 2e-6
        expected[key] = value + 0.1 * delta * grad
    np.testing.assert_allclose(agent.state_losses, s1, rtol=1e-14)
    assert agent.state_bits == n1 and agent.action == a1 and agent.bits == n1 + a1
    assert agent.last_step["reward"] == pytest.approx(r, rel=1e-9)
    assert agent.last_step["td_error"] == pytest.approx(delta, rel=1e-9)
    for key in expected:
        np.testing.assert_allclose(agent.params[key], expected[key], rtol=1e-6, atol=1e-9)


def test_epsilon_greedy_frequencies():
    agent = frozen_agent("keep", epsilon=0.1)
    losses = np.full(agent.T, 2.0)
    draws = [agent.policy(3, losses) for _ in range(20000)]
    assert np.mean(np.array(draws) == ADD) == pytest.approx(0.1, abs=0.01)
    greedy_add = frozen_agent("add", epsilon=0.25)
    draws = [greedy_add.policy(3, losses) for _ in range(20000)]
    assert np.mean(np.array(draws) == KEEP) == pytest.approx(0.25, abs=0.01)
    # At max_bits there is nothing to add.
    assert {agent.policy(8, losses) for _ in range(200)} == {KEEP}


def test_bits_stay_in_range_and_the_state_never_decreases():
    agent = MQGradAgent(T=2, epsilon=0.5, min_bits=3, max_bits=6, initial_bits=3, seed=11)
    rng = np.random.default_rng(2)
    states, sent = [], []
    for m in range(400):
        sent.append(agent.observe(3.0 - 0.005 * m + rng.normal(0, 0.1), rng.uniform(5, 15)))
        states.append(agent.state_bits)
    assert all(3 <= b <= 6 for b in sent)
    assert all(a <= b for a, b in zip(states, states[1:]))
    assert all(s <= b <= s + 1 for s, b in zip(states, sent))
    assert sent[-1] == 6
    with pytest.raises(ValueError):
        MQGradAgent(initial_bits=9)
    with pytest.raises(ValueError):
        MQGradAgent(min_bits=1)


def test_non_finite_loss_carries_no_information():
    agent = MQGradAgent(T=2, seed=0)
    for loss in [2.0, 1.9, float("nan"), 1.8, float("inf")]:
        agent.observe(loss, 1.0)
    assert np.all(np.isfinite(agent.state_losses))
    assert all(np.all(np.isfinite(v)) for v in agent.params.values())


def test_checkpoint_restores_the_whole_state_exactly(tmp_path):
    def feed(agent, ms):
        return [agent.observe(2.0 - 0.01 * m + 0.05 * np.sin(m), 10.0 + m % 3) for m in ms]

    reference = MQGradAgent(T=5, epsilon=0.3, seed=1)
    feed(reference, range(23))  # stop mid-window: pending losses are state too
    path = tf.train.Checkpoint(agent=reference).save(str(tmp_path / "ckpt"))
    restored = MQGradAgent(T=5, epsilon=0.3, seed=99)
    tf.train.Checkpoint(agent=restored).restore(path).assert_consumed()
    assert restored.get_state() == reference.get_state()
    assert feed(restored, range(23, 200)) == feed(reference, range(23, 200))
    for key in reference.params:
        np.testing.assert_array_equal(restored.params[key], reference.params[key])
    assert restored.get_state() == reference.get_state()
    other = MQGradAgent(T=4, seed=0)
    with pytest.raises(ValueError, match="config"):
        tf.train.Checkpoint(agent=other).restore(path).expect_partial()


def test_rms_normalized_rewards_are_eq2_over_their_running_rms():
    def feed(agent):
        rng = np.random.default_rng(4)
        for m in range(60):
            agent.observe(3.0 - 0.01 * m + rng.normal(0, 0.02), rng.uniform(50, 150))
            yield agent.last_step["reward"]

    paper = MQGradAgent(T=3, seed=0, eta=1e-12, reward_normalization="none")
    normalized = MQGradAgent(T=3, seed=0, eta=1e-12, reward_normalization="rms")
    raw = [r for r in dict.fromkeys(feed(paper)) if r is not None]  # one per MDP step
    scaled = [r for r in dict.fromkeys(feed(normalized)) if r is not None]
    assert len(raw) == len(scaled) == 19
    assert max(abs(r) for r in raw) < 0.2  # Eq. (2)'s scale here
    expected = [r / np.sqrt(np.mean(np.square(raw[:k + 1]))) for k, r in enumerate(raw)]
    np.testing.assert_allclose(scaled, expected, rtol=1e-12)
    assert 0.5 < np.sqrt(np.mean(np.square(scaled))) < 2.0
    with pytest.raises(ValueError, match="reward_normalization"):
        MQGradAgent(reward_normalization="zscore")


def test_epsilon_decays_per_mdp_step():
    agent = frozen_agent("keep", epsilon=0.5, epsilon_decay=0.5, T=1)
    losses = np.full(agent.T, 2.0)
    assert agent.epsilon == 0.5
    for _ in range(3):
        agent.observe(2.0, 1.0)
    assert agent.t == 3 and agent.epsilon == pytest.approx(0.0625)
    draws = [agent.policy(3, losses) for _ in range(20000)]
    assert np.mean(np.array(draws) == ADD) == pytest.approx(0.0625, abs=0.008)
    with pytest.raises(ValueError, match="epsilon_decay"):
        MQGradAgent(epsilon_decay=0.0)


# --- the callback ---------------------------------------------------------------------------


def small_model(codec, **optimizer_kwargs):
    tf_keras.utils.set_random_seed(0)
    model = tf_keras.Sequential([tf_keras.layers.Dense(64, activation="relu", input_shape=(16,)),
                                 tf_keras.layers.Dense(3)])
    optimizer = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=codec,
                                          error_feedback=False, **optimizer_kwargs)
    model.compile(optimizer, tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, optimizer


def test_callback_recovers_batch_losses_from_running_means():
    codec = tfgc.codecs.Quantize(bits=tf.Variable(2))
    model, _ = small_model(codec)
    callback = tfgc.callbacks.MQGrad(T=2, seed=0)
    callback.set_model(model)
    callback.on_train_begin()
    losses = [2.0, 1.0, 3.0, 0.5, 1.5]
    for epoch in range(2):
        callback.on_epoch_begin(epoch)
        for batch, _ in enumerate(losses):
            callback.on_train_batch_begin(batch)
            callback.on_train_batch_end(batch, {"loss": np.mean(losses[: batch + 1])})
    np.testing.assert_allclose([s["loss"] for s in callback.trace], losses * 2, rtol=1e-12)


def test_callback_sets_codec_bits_and_charges_modelled_time():
    codec = tfgc.codecs.Quantize(bits=tf.Variable(2))
    model, optimizer = small_model(codec)
    time_model = mqgrad.TimeModel(bandwidth=1e5, compute_ms=3.0)
    callback = tfgc.callbacks.MQGrad(optimizer, T=2, seed=1, epsilon=0.5, time_model=time_model)
    seen = []

    class Check(tf_keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append((int(optimizer.traffic["push_bytes"].numpy()), logs["bits"],
                         int(codec.bits.numpy())))

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(640, 16)).astype("float32"), rng.integers(0, 3, 640)
    history = model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[callback, Check()])
    assert history.history["bits"][-1] == callback.agent.bits
    used = [bits for _, bits, _ in seen]
    assert used == [s["bits"] for s in callback.trace] and len(used) == 40
    assert len(set(used)) > 1
    # The codec's variable always holds what the next step uses.
    assert [after for _, _, after in seen[:-1]] == used[1:]
    # Each step pushed exactly step_bytes(bits), and was charged compute + 2 * bytes / bw.
    pushed = [seen[0][0]] + [b[0] - a[0] for a, b in zip(seen, seen[1:])]
    assert pushed == [callback.step_bytes(b) for b in used]
    assert callback.trace[5]["ms"] == pytest.approx(3.0 + 2e3 * pushed[5] / 1e5)
    assert callback.step_bytes(2) < callback.step_bytes(8)
    assert len(callback.steps) == 20 and all(s["seconds"] < 0.1 for s in callback.steps)


def test_callback_rejects_codecs_without_settable_bits():
    model, _ = small_model(tfgc.codecs.Int8())
    callback = tfgc.callbacks.MQGrad(seed=0)
    callback.set_model(model)
    with pytest.raises(TypeError, match="Quantize"):
        callback.on_train_begin()
    with pytest.raises(ValueError, match="either"):
        tfgc.callbacks.MQGrad(agent=MQGradAgent(), seed=0)


def test_step_bytes_before_training_says_training_has_not_begun():
    # The codec whose payload it counts is resolved when training begins.
    model, optimizer = small_model(tfgc.codecs.Quantize(bits=tf.Variable(2)))
    callback = tfgc.callbacks.MQGrad(optimizer, seed=0)
    with pytest.raises(RuntimeError, match="on_train_begin"):
        callback.step_bytes(2)
    callback.set_model(model)
    with pytest.raises(RuntimeError, match="on_train_begin"):
        callback.step_bytes(2)
    callback.on_train_begin()
    assert 0 < callback.step_bytes(2) < callback.step_bytes(8)


# --- the Adaptive baseline ------------------------------------------------------------------


def test_adaptive_bits_rule():
    rng = np.random.default_rng(3)
    for x in (rng.normal(size=1000), rng.standard_t(2, size=1000), rng.uniform(-1, 1, 50)):
        x = x.astype(np.float32)
        for rho in (0.1, 0.01, 0.001):
            bits = int(mqgrad.adaptive_bits(x, rho))
            step = lambda k: (x.max() - x.min()) / (2 ** k - 1)  # noqa: E731
            power = np.mean(x.astype(np.float64) ** 2)
            if bits < 8:
                assert step(bits) ** 2 / 12 <= rho * power * (1 + 1e-5)
            if bits > 2:
                assert step(bits - 1) ** 2 / 12 > rho * power * (1 - 1e-5)
    assert int(mqgrad.adaptive_bits(np.zeros(10, np.float32))) == 2
    assert int(mqgrad.adaptive_bits(np.array([np.nan, 1.0], np.float32))) == 2


def test_adaptive_quantize_round_trip_keeps_noise_below_rho():
    x = tf.constant(np.random.default_rng(4).normal(size=(64, 64)).astype(np.float32))
    codec = mqgrad.AdaptiveQuantize(rho=0.001)
    payload = codec.encode(x)
    bits = int(payload["bits"])
    assert bits == int(mqgrad.adaptive_bits(x, 0.001)) and 2 <= bits <= 8
    decoded = codec.decode(payload)
    assert decoded.shape == x.shape
    noise = np.mean((decoded.numpy() - x.numpy()) ** 2)
    assert noise <= 0.001 * np.mean(x.numpy() ** 2) * 1.5  # uniform-noise model, sampled
    coarse = mqgrad.AdaptiveQuantize(rho=0.1).encode(x)
    assert int(coarse["bits"]) < bits
    assert tfgc.codecs.payload_nbytes(coarse) < tfgc.codecs.payload_nbytes(payload)
