"""tfgc.ps.copies: a traced tensor's copy on another task, found only for that task."""
import tensorflow as tf

from tfgc.ps import copies

SERVER = "/job:ps/replica:0/task:0/device:CPU:0"


def test_a_copy_is_found_for_its_own_task_only():
    found = {}

    @tf.function
    def step(ids):
        with tf.device(SERVER):
            copy = tf.identity(ids)
        copies.note_copy(ids, copy)
        found["server"] = copies.copy_on(ids, SERVER) is copy
        found["same task, short name"] = copies.copy_on(ids, "/job:ps/task:0") is copy
        found["other task"] = copies.copy_on(ids, "/job:ps/replica:0/task:1/device:CPU:0")
        found["other tensor"] = copies.copy_on(ids + 1, SERVER)
        return ids

    step.get_concrete_function(tf.TensorSpec([None], tf.int32))  # traced, not run
    assert found == {"server": True, "same task, short name": True, "other task": None,
                     "other tensor": None}


def test_eager_tensors_and_copies_without_a_device_are_not_recorded():
    ids = tf.constant([1, 2])
    copies.note_copy(ids, tf.identity(ids))  # eager: no wire to spare
    assert copies.copy_on(ids, SERVER) is None
    found = []

    @tf.function
    def step(ids):
        copies.note_copy(ids, tf.identity(ids))  # placed nowhere in particular
        found.append(copies.copy_on(ids, SERVER))
        return ids

    step.get_concrete_function(tf.TensorSpec([None], tf.int32))
    assert found == [None]
