"""A stand-in for the ``docker`` client in tests (no Docker daemon needed): ``run`` starts the command
after the image with exactly the ``-e`` variables (as a container would, plus a minimal PATH) in the
``-w`` directory, and records the argv; ``stop NAME`` records the name. Records go to ``docker.log``
beside the directory holding this client (the launcher passes the client a minimal environment)."""

import json
import os
import subprocess
import sys

VALUE_FLAGS = {"--name", "--shm-size", "--ulimit", "--network", "-e", "-v", "-w", "--gpus"}


def main(argv):
    log = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[0]))), "docker.log")
    with open(log, "a") as handle:
        handle.write(json.dumps(argv) + "\n")
    if argv[0] == "stop":
        return 0
    assert argv[0] == "run", argv
    env, workdir, index = {"PATH": os.defpath}, "/", 1
    while argv[index].startswith("-"):
        flag = argv[index]
        if flag in VALUE_FLAGS:
            value = argv[index + 1]
            if flag == "-e":
                key, given, val = value.partition("=")
                if given:
                    env[key] = val
                elif key in os.environ:  # `-e NAME`: docker takes the value from its own environment
                    env[key] = os.environ[key]
            elif flag == "-w":
                workdir = value
            index += 2
        else:
            index += 1
    command = argv[index + 1:]  # after the image
    return subprocess.call(command, env=env, cwd=workdir)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
