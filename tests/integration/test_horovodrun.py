"""The ``horovodrun`` console script runs an unchanged Horovod script as the seed guide writes it."""

import os
import subprocess
import sys
from pathlib import Path

from .jobs import ROOT, SCRIPTS


def test_horovodrun_runs_an_unchanged_horovod_script_as_the_guide_writes_it():
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run([str(bin_dir / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", "python",
                             str(SCRIPTS / "horovod_style.py")], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    for rank in range(2):
        lines = [line for line in result.stdout.splitlines() if line.startswith(f"[{rank}]<stdout>:")]
        assert len(lines) == 1 and "+torchring" in lines[0] and lines[0].endswith(f"rank {rank} of 2 ok"), lines
