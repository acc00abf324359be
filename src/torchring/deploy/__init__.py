"""Deployment helpers: ``torchring k8s`` prints Kubernetes manifests that start a job's ranks with torchrun.

``k8s`` builds the manifests as plain dicts (no Kubernetes client needed); ``k8s_cli`` is the command line
around it; ``schemas/`` holds the JSON Schema of the Kubeflow PyTorchJob we generate.
"""
