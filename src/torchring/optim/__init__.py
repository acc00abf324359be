"""The optimizer's gradient machinery beside ``torchring.optimizer`` (the Horovod API): which parameters
are reduced under which names and groups (``parameters``), what is remembered about sparse gradients
(``sparse_gradients``), how a bucket of gradients is reduced (``bucket_reducers``: the engine, the lane,
gradient by gradient) and when the buckets move to a gradient lane (``lane_vote``). It sits above the
public collectives it uses and below nothing but ``optimizer`` and the tools. The buckets themselves and
the lane live in the data plane (``runtime.dataplane``), where ``join()`` and ``shutdown()`` reach them."""
