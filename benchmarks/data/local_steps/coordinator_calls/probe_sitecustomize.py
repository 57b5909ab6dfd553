import os
if os.environ.get("CHIEF_BYTES"):
    import gc
    import tf_keras

    class _Probe(tf_keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            from tfgc.cluster.local import LocalCluster
            for obj in gc.get_objects():
                if isinstance(obj, LocalCluster) and obj._started and not obj._stopped:
                    rows = obj.settled_socket_bytes()
                    print("CHIEF_BYTES", epoch, obj.traffic_between("chief", "worker", rows=rows),
                          obj.traffic_between("worker", "chief", rows=rows), flush=True)

    _fit = tf_keras.Model.fit

    def fit(self, *args, **kwargs):
        kwargs["callbacks"] = list(kwargs.get("callbacks") or []) + [_Probe()]
        return _fit(self, *args, **kwargs)

    tf_keras.Model.fit = fit
