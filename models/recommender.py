"""Sparse models whose gradients are embeddings' rows: a bag-of-tokens regressor and a
recommendation model (two embeddings and a dense tower), with Zipf-distributed ids.

Ids drawn from a Zipf law repeat within a batch, as tokens and popular items do: a
batch of 64 x 20 ids over a vocabulary of 50,000 (exponent 1.3) touches about 300
distinct rows. Each model takes the embedding layer's class, so that the same model
runs with tf_keras's `Embedding` (the plain twin) and `tfgc.CompressedEmbedding`.

Labels are a fixed function of the ids (a hidden embedding of each id, averaged, then a
fixed projection), so that training reduces the loss and held-out examples measure it.
"""
import numpy as np
import tensorflow as tf
import tf_keras


def zipf_ids(rng, shape, vocabulary, exponent=1.3):
    """int32 ids in [0, vocabulary), Zipf-distributed (id 0 the most frequent)."""
    return (np.minimum(rng.zipf(exponent, shape), vocabulary) - 1).astype(np.int32)


def token_dataset(vocabulary=50_000, length=20, batch=64, examples=4096, seed=0):
    """(ids [batch, length], targets [batch, 1]) batches, repeated; and a held-out
    (ids, targets) pair of `examples` // 4 examples."""
    rng = np.random.default_rng(seed)
    hidden = np.random.default_rng(1234).normal(size=(vocabulary, 4)).astype(np.float32)
    projection = np.array([[1.0], [-0.5], [0.25], [0.75]], np.float32)

    def targets(ids):
        return hidden[ids].mean(axis=1) @ projection

    ids = zipf_ids(rng, (examples, length), vocabulary)
    held_out = zipf_ids(rng, (examples // 4, length), vocabulary)
    data = tf.data.Dataset.from_tensor_slices((ids, targets(ids)))
    data = data.shuffle(examples, seed=seed).repeat().batch(batch, drop_remainder=True)
    return data, (held_out, targets(held_out))


def token_model(vocabulary=50_000, dim=64, length=20, embedding=tf_keras.layers.Embedding,
                seed=0):
    """Embedding(vocabulary, dim) -> mean over the tokens -> Dense(1)."""
    tf_keras.utils.set_random_seed(seed)
    inputs = tf_keras.Input((length,), dtype="int32", name="tokens")
    pooled = tf_keras.layers.GlobalAveragePooling1D()(
        embedding(vocabulary, dim, name="embedding")(inputs))
    return tf_keras.Model(inputs, tf_keras.layers.Dense(1, name="head")(pooled),
                          name="token_regressor")


def recommender(users=50_000, items=20_000, dim=32, embedding=tf_keras.layers.Embedding,
                seed=0):
    """A two-tower-style recommender: user and item embeddings, concatenated, through a
    dense tower (64, 32) to one score. Inputs: {"user": [batch], "item": [batch]} int32."""
    tf_keras.utils.set_random_seed(seed)
    user = tf_keras.Input((), dtype="int32", name="user")
    item = tf_keras.Input((), dtype="int32", name="item")
    features = tf_keras.layers.Concatenate()([
        embedding(users, dim, name="user_embedding")(user),
        embedding(items, dim, name="item_embedding")(item)])
    hidden = tf_keras.layers.Dense(64, activation="relu", name="tower_1")(features)
    hidden = tf_keras.layers.Dense(32, activation="relu", name="tower_2")(hidden)
    score = tf_keras.layers.Dense(1, name="score")(hidden)
    return tf_keras.Model({"user": user, "item": item}, score, name="recommender")


def interactions(users=50_000, items=20_000, batch=256, examples=16384, seed=0):
    """({"user", "item"}, rating [batch, 1]) batches, repeated: Zipf-popular users and
    items, ratings from hidden user and item factors; and a held-out set."""
    rng = np.random.default_rng(seed)
    factors = np.random.default_rng(4321)
    user_factors = factors.normal(size=(users, 4)).astype(np.float32)
    item_factors = factors.normal(size=(items, 4)).astype(np.float32)

    def draw(count):
        u, i = zipf_ids(rng, (count,), users), zipf_ids(rng, (count,), items)
        rating = np.sum(user_factors[u] * item_factors[i], axis=1, keepdims=True)
        return {"user": u, "item": i}, rating.astype(np.float32)

    features, ratings = draw(examples)
    data = tf.data.Dataset.from_tensor_slices((features, ratings))
    data = data.shuffle(examples, seed=seed).repeat().batch(batch, drop_remainder=True)
    return data, draw(examples // 4)
