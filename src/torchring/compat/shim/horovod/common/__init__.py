"""``horovod.common``: the parts Horovod scripts import directly."""
