"""``torchring k8s``: print the Kubernetes manifests of a training job (or write one file per object)."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from .k8s import (
    DEFAULT_BACKOFF_LIMIT,
    DEFAULT_ELASTIC_BACKOFF_LIMIT,
    DEFAULT_MAX_RESTARTS,
    DEFAULT_PORT,
    DEFAULT_SHM_SIZE,
    K8sJobSpec,
    ManifestError,
    build_manifests,
    manifest_file_name,
    render_yaml,
)

DEFAULT_COMMAND_TEXT = "python examples/mnist.py"


def _count(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def add_k8s_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``torchring k8s``."""
    parser.add_argument("--kind", choices=("job", "pytorchjob"), default="job",
                        help="job: a headless Service and an Indexed batch/v1 Job (no operator needed); "
                             "pytorchjob: a Kubeflow PyTorchJob (needs the training operator) (default: job)")
    parser.add_argument("--name", required=True,
                        help="name of the job (a DNS-1123 label starting with a letter); also names the Service")
    parser.add_argument("--image", required=True, help="container image with Python, torch and torchring")
    parser.add_argument("--namespace", help="namespace of every object (default: kubectl's current one)")
    parser.add_argument("--nodes", type=_count, default=1, metavar="N", help="pods, one per node (default: 1)")
    accelerator = parser.add_mutually_exclusive_group(required=True)
    accelerator.add_argument("--gpus-per-node", type=_count, metavar="G",
                             help="request G nvidia.com/gpu per pod and run one rank per GPU")
    accelerator.add_argument("--cpus-per-node", metavar="C",
                             help="request and limit C CPUs per pod (a quantity: 8, 7500m); ranks per pod: "
                                  "--procs-per-node")
    parser.add_argument("--procs-per-node", type=_count, metavar="P",
                        help="ranks per pod with --cpus-per-node (default: 1)")
    parser.add_argument("--memory", metavar="QUANTITY", help="memory request and limit per pod, e.g. 16Gi")
    parser.add_argument("--command", default=DEFAULT_COMMAND_TEXT,
                        help="the training command, split like a shell would; torchrun starts it once per "
                             f"rank (default: {DEFAULT_COMMAND_TEXT!r})")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="set a variable in the training container (repeatable), e.g. TORCHRING_LOG_LEVEL=DEBUG")
    parser.add_argument("--shm-size", default=DEFAULT_SHM_SIZE, metavar="QUANTITY",
                        help=f"size of the in-memory /dev/shm (counts toward --memory) (default: {DEFAULT_SHM_SIZE})")
    parser.add_argument("--checkpoint-pvc", metavar="CLAIM",
                        help="mount this PersistentVolumeClaim at /checkpoints and set "
                             "TORCHRING_CHECKPOINT_DIR=/checkpoints (ReadWriteMany for several nodes)")
    parser.add_argument("--node-selector", action="append", default=[], metavar="KEY=VALUE",
                        help="schedule only on nodes with this label (repeatable)")
    parser.add_argument("--image-pull-secret", action="append", default=[], metavar="NAME",
                        help="Secret to pull the image with (repeatable)")
    parser.add_argument("--port", type=_count, default=DEFAULT_PORT,
                        help=f"rendezvous port on node 0 (default: {DEFAULT_PORT})")
    parser.add_argument("--min-nodes", type=_count, metavar="N",
                        help="pytorchjob only: make it elastic, running with as few as N nodes (default: --nodes)")
    parser.add_argument("--max-nodes", type=_count, metavar="N",
                        help="pytorchjob only: make it elastic, accepting up to N nodes (default: --nodes)")
    parser.add_argument("--max-restarts", type=_count, metavar="N",
                        help=f"elastic pytorchjob: torchrun restarts of the worker group before it fails "
                             f"(default: {DEFAULT_MAX_RESTARTS})")
    parser.add_argument("--backoff-limit", type=_count, metavar="N",
                        help=f"pod failures tolerated before the job fails (default: {DEFAULT_BACKOFF_LIMIT}, "
                             f"{DEFAULT_ELASTIC_BACKOFF_LIMIT} for an elastic pytorchjob)")
    parser.add_argument("--output-dir", metavar="DIR",
                        help="write one file per object (<kind>-<name>.yaml) into DIR instead of printing them")


def _pairs(values: Sequence[str], option: str) -> tuple[tuple[str, str], ...]:
    pairs = []
    for value in values:
        key, separator, rest = value.partition("=")
        if not separator or not key:
            raise ManifestError(f"{option} {value!r}: expected KEY=VALUE")
        pairs.append((key, rest))
    return tuple(pairs)


def spec_from_args(args: argparse.Namespace) -> K8sJobSpec:
    """The job description the options give; raises ``ManifestError`` on a malformed value."""
    try:
        command = tuple(shlex.split(args.command))
    except ValueError as error:
        raise ManifestError(f"--command {args.command!r}: {error}") from None
    return K8sJobSpec(
        name=args.name,
        image=args.image,
        kind=args.kind,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        cpus_per_node=args.cpus_per_node,
        procs_per_node=args.procs_per_node,
        memory=args.memory,
        command=command,
        env=_pairs(args.env, "--env"),
        shm_size=args.shm_size,
        checkpoint_pvc=args.checkpoint_pvc,
        node_selector=_pairs(args.node_selector, "--node-selector"),
        image_pull_secrets=tuple(args.image_pull_secret),
        namespace=args.namespace,
        port=args.port,
        min_nodes=args.min_nodes,
        max_nodes=args.max_nodes,
        max_restarts=args.max_restarts,
        backoff_limit=args.backoff_limit,
    )


def run_k8s(args: argparse.Namespace) -> int:
    """Print the manifests (or write them to ``--output-dir``); 2 on a bad option, 1 when writing fails."""
    try:
        objects = build_manifests(spec_from_args(args))
    except ManifestError as error:
        print(f"torchring k8s: error: {error}", file=sys.stderr)
        return 2
    if args.output_dir is None:
        sys.stdout.write(render_yaml(objects))
        return 0
    directory = Path(args.output_dir)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for obj in objects:
            path = directory / manifest_file_name(obj)
            if obj["kind"] == "Secret":  # only its owner may read the job's secret
                path.touch(mode=0o600)
                path.chmod(0o600)
            path.write_text(render_yaml([obj]), encoding="utf-8")
            print(path)
    except OSError as error:
        print(f"torchring k8s: error: cannot write to {directory}: {error}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchring k8s",
        description="Print Kubernetes manifests that run a training job: torchrun in every pod, ranks found by "
                    "hvd.init() from torchrun's variables. Apply them with kubectl apply -f.")
    add_k8s_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_k8s(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
