"""The optimizer's gradient machinery beside ``torchring.optimizer`` (the Horovod API): how a bucket of
gradients is reduced (``BucketReducer`` and its implementations). It sits above the public collectives it
uses and below nothing but ``optimizer`` and the tools."""
