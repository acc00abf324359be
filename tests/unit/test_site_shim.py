"""``torchring horovod-shim``: one ``.pth`` file makes ``import horovod.torch`` torchring for a whole Python
environment (here a site directory of the test's own, processed by Python's ``site`` as site-packages is)."""

import subprocess
import sys

from torchring.compat import SHIM_PATH, site_shim


def _python(code: str, *, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)


def test_install_makes_horovod_torchring_for_the_environment_and_remove_undoes_it(tmp_path):
    target = site_shim.install(tmp_path)
    assert target == tmp_path / site_shim.PTH_NAME
    assert target.read_text() == f"{SHIM_PATH}\n"
    assert [p.name for p in tmp_path.iterdir()] == [site_shim.PTH_NAME], "nothing else (no temporary) is left"
    loaded = _python(f"import site; site.addsitedir({str(tmp_path)!r}); import horovod.torch as hvd; "
                     "print(hvd.init.__module__)")
    assert loaded.returncode == 0 and loaded.stdout.strip().startswith("torchring"), loaded.stderr
    assert "installed" in site_shim.status(tmp_path) and "not installed" not in site_shim.status(tmp_path)
    assert site_shim.remove(tmp_path) == target and not target.exists()
    assert site_shim.remove(tmp_path) is None
    assert "not installed" in site_shim.status(tmp_path)


def test_install_refuses_where_horovod_itself_is_installed(tmp_path):
    installed = tmp_path / "installed"
    (installed / "horovod").mkdir(parents=True)
    (installed / "horovod" / "__init__.py").write_text("__version__ = '0.28.1'\n")
    target = tmp_path / "site"
    target.mkdir()
    code = ("import sys; from pathlib import Path; from torchring.compat import site_shim\n"
            f"sys.path.insert(0, {str(installed)!r})\n"
            f"try:\n    site_shim.install(Path({str(target)!r}))\n"
            "except site_shim.ShimError as error:\n    print(error)\n")
    result = _python(code)
    assert "Horovod itself is installed" in result.stdout and "--horovod-compat" in result.stdout, result.stderr
    assert list(target.iterdir()) == []


def test_the_command_reports_the_environments_state():
    result = subprocess.run([sys.executable, "-m", "torchring.cli", "horovod-shim", "status"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("torchring's horovod shim: "), result.stderr
    assert str(site_shim.site_packages()) in result.stdout
