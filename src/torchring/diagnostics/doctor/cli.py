"""``torchring doctor``: the flags, the optional allreduce bandwidth test, and printing the report.

Also runnable on its own: ``python -m torchring.diagnostics.doctor.cli [FLAGS]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...launch.hosts import HostSpecError, parse_hostfile, parse_hosts
from ...launch.spawn.ssh import SshOptions
from .checks import ALL_HOSTS, Check, DoctorReport, collect
from .render import render_json, render_markdown, render_text

BENCH_SIZES = "1M,16M"
BENCH_TIMEOUT_S = 300.0


def add_doctor_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``torchring doctor``."""
    hosts = parser.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", dest="hosts",
                       help="hosts to check, e.g. node1,node2 (slots are accepted and ignored; default: this host)")
    hosts.add_argument("--hostfile", dest="hostfile", help="file with one 'host slots=N' per line (slots ignored)")
    parser.add_argument("-p", "--ssh-port", dest="ssh_port", type=int, help="SSH port of the remote hosts "
                        "(also the port the hosts' reachability of each other is tested on; default 22)")
    parser.add_argument("-i", "--ssh-identity-file", dest="ssh_identity_file", help="SSH private key")
    parser.add_argument("--start-timeout", dest="start_timeout", type=float, default=15.0,
                        help="seconds each SSH probe may take (default 15)")
    parser.add_argument("--python", default=sys.executable,
                        help=f"Python interpreter on the remote hosts (default {sys.executable})")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", dest="json", action="store_true",
                        help='print machine-readable JSON: {"ok", "hosts", "checks"}')
    output.add_argument("--markdown", action="store_true",
                        help="print a Markdown report to paste into an issue")
    parser.add_argument("--quick", action="store_true",
                        help="this host only, no peer or bandwidth tests; fast enough for a container HEALTHCHECK")
    parser.add_argument("--bench", action="store_true",
                        help="after the checks, measure allreduce bus bandwidth across the hosts (1M and 16M)")


def _host_names(args: argparse.Namespace) -> list[str]:
    if args.hostfile:
        return [host.hostname for host in parse_hostfile(args.hostfile)]
    if args.hosts:
        return [host.hostname for host in parse_hosts(args.hosts)]
    return []


def _bench_command(hosts: Sequence[str], json_path: str) -> tuple[int, str, list[str]]:
    if len(hosts) > 1:
        num_proc, hosts_text = len(hosts), ",".join(f"{host}:1" for host in hosts)
    else:
        num_proc, hosts_text = 2, f"{hosts[0] if hosts else 'localhost'}:2"
    command = [sys.executable, "-m", "torchring.cli", "bench", "collectives", "-np", str(num_proc), "-H", hosts_text,
               "--ops", "allreduce", "--sizes", BENCH_SIZES, "--json", json_path]
    return num_proc, hosts_text, command


def _last_lines(text: str, count: int = 3) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-count:]) if lines else "no message"


def run_bench(hosts: Sequence[str], timeout_s: float = BENCH_TIMEOUT_S) -> dict[str, Any]:
    """Run ``torchring bench collectives`` (allreduce at 1M and 16M) across ``hosts`` (one rank each; two
    ranks on a single host) and return ``{"ranks", "hosts", "busbw": [...]}`` or ``{"error": ...}``."""
    from ...bench.sizes import format_size

    with tempfile.TemporaryDirectory(prefix="torchring-doctor-") as directory:
        json_path = str(Path(directory) / "bench.json")
        num_proc, hosts_text, command = _bench_command(hosts, json_path)
        bench: dict[str, Any] = {"ranks": num_proc, "hosts": hosts_text, "command": command}
        try:
            result = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                    timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {**bench, "error": f"the benchmark took longer than {timeout_s:g} s"}
        if result.returncode != 0:
            return {**bench, "error": f"torchring bench exited with {result.returncode}: {_last_lines(result.stderr)}"}
        try:
            data = json.loads(Path(json_path).read_text())
        except (OSError, ValueError) as error:
            return {**bench, "error": f"torchring bench left no readable results: {error}"}
    bench["busbw"] = [{"bytes": entry["bytes"], "size": format_size(entry["bytes"]),
                       "torchring_gbps": entry["torchring"]["busbw_gbps"], "raw_gbps": entry["raw"]["busbw_gbps"]}
                      for entry in data.get("results", []) if entry.get("op") == "allreduce"]
    return bench


def bench_check(bench: dict[str, Any]) -> Check:
    """The bench figures as an informational check (a failed bench is a warning, not a blocker)."""
    if bench.get("error"):
        return Check(ALL_HOSTS, "allreduce bandwidth", False, False, f"not measured: {bench['error']}",
                     "run the `torchring bench collectives` command in the JSON report by hand to see why")
    figures = "; ".join(f"{row['size']}: torchring {row['torchring_gbps']:.3f} GB/s, raw gloo "
                        f"{row['raw_gbps']:.3f} GB/s" for row in bench.get("busbw", []))
    return Check(ALL_HOSTS, "allreduce bandwidth", True, False,
                 f"bus bandwidth over {bench['ranks']} rank(s) ({bench['hosts']}): {figures}")


def _with_bench(report: DoctorReport, hosts: Sequence[str]) -> DoctorReport:
    if not report.ok:
        skipped = Check(ALL_HOSTS, "allreduce bandwidth", False, False, "not measured: training cannot start yet",
                        "fix the blocking problems above, then run with --bench again")
        return DoctorReport(report.hosts, [*report.checks, skipped], {"error": "skipped: blocking problems"})
    bench = run_bench(hosts)
    return DoctorReport(report.hosts, [*report.checks, bench_check(bench)], bench)


def run_doctor(args: argparse.Namespace) -> int:
    """Check the hosts ``args`` name, print the report; 0 when nothing blocks training, 1 when something does,
    2 for unusable flags."""
    try:
        hosts = _host_names(args)
        if args.quick and (hosts or args.bench):
            raise HostSpecError("--quick checks this host only, without peers or bench; drop --quick, or drop "
                                "-H/--hostfile/--bench")
        if args.start_timeout <= 0:
            raise HostSpecError(f"--start-timeout must be positive, got {args.start_timeout:g}")
    except HostSpecError as error:
        print(f"torchring doctor: error: {error}", file=sys.stderr)
        return 2
    options = SshOptions(port=args.ssh_port, identity_file=args.ssh_identity_file,
                         connect_timeout_s=args.start_timeout, python=args.python)
    report = collect(hosts or None, options, quick=args.quick)
    if args.bench:
        report = _with_bench(report, hosts)
    if args.json:
        print(render_json(report))
    elif args.markdown:
        print(render_markdown(report))
    else:
        print(render_text(report))
    return report.exit_code


def build_parser() -> argparse.ArgumentParser:
    """A parser with the doctor's flags, for ``python -m torchring.diagnostics.doctor.cli``."""
    parser = argparse.ArgumentParser(prog="torchring doctor",
                                     description="Check that this host (or every host of -H/--hostfile) can run "
                                                 "torchring training, and say how to fix what cannot.")
    add_doctor_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: the command line) and run the doctor."""
    return run_doctor(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
