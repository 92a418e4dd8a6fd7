"""``make setup``: the torch build tools/torch_build.py chooses, and what the Makefile installs for each build.

The GPU is simulated: a fake ``nvidia-smi`` on PATH lists an H200, or PATH holds no ``nvidia-smi`` at all.
The Makefile is read with ``make -n``, which prints the commands and runs nothing but the choice itself.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
H200_LISTING = "GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)\n"


@pytest.fixture(scope="module")
def torch_build(load_tool):
    return load_tool("torch_build")


@pytest.fixture
def gpu_path(tmp_path):
    """A PATH on which ``nvidia-smi -L`` lists one H200."""
    smi = tmp_path / "gpu-bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(f"#!/bin/sh\nprintf '{H200_LISTING.strip()}\\n'\n")
    smi.chmod(0o755)
    return str(smi.parent)


@pytest.fixture
def cpu_path(tmp_path):
    """A PATH without ``nvidia-smi``."""
    empty = tmp_path / "cpu-bin"
    empty.mkdir()
    return str(empty)


def fake_run(returncode=0, stdout="", raises=None):
    def run(args, **kwargs):
        assert args == ["nvidia-smi", "-L"] and kwargs["timeout"] > 0
        if raises:
            raise raises
        return subprocess.CompletedProcess(args, returncode, stdout, "")
    return run


def test_choose_auto_picks_cpu_without_a_gpu_and_cuda_with_one(torch_build):
    assert torch_build.choose("auto", gpu_listed=False) == "cpu"
    assert torch_build.choose("auto", gpu_listed=True) == "cuda"


@pytest.mark.parametrize("request_", ["cpu", "cuda", "system"])
@pytest.mark.parametrize("gpu", [False, True])
def test_choose_keeps_an_explicit_build_whatever_the_machine(torch_build, request_, gpu):
    assert torch_build.choose(request_, gpu_listed=gpu) == request_


@pytest.mark.parametrize("request_", ["gpu", "", "CPU", None])
def test_choose_rejects_an_unknown_request(torch_build, request_):
    with pytest.raises(ValueError, match="TORCH must be one of auto, cpu, cuda, system"):
        torch_build.choose(request_, gpu_listed=False)


@pytest.mark.parametrize("run, listed", [
    (fake_run(stdout=H200_LISTING), True),
    (fake_run(stdout=H200_LISTING * 8), True),
    (fake_run(returncode=6, stdout="No devices were found\n"), False),
    (fake_run(returncode=9, stdout="NVIDIA-SMI has failed because it couldn't communicate with the driver\n"), False),
    (fake_run(stdout=""), False),
    (fake_run(raises=FileNotFoundError("nvidia-smi")), False),
    (fake_run(raises=subprocess.TimeoutExpired("nvidia-smi", 30)), False),
])
def test_nvidia_gpu_listed_reads_the_listing(torch_build, run, listed):
    assert torch_build.nvidia_gpu_listed(run) is listed


def choice(path: str, *args: str) -> subprocess.CompletedProcess:
    """tools/torch_build.py run as the Makefile runs it, with ``path`` as PATH."""
    return subprocess.run([sys.executable, str(ROOT / "tools" / "torch_build.py"), *args], capture_output=True,
                          text=True, env={"PATH": path})


def test_torch_build_script_picks_cpu_here_and_cuda_with_a_gpu(cpu_path, gpu_path):
    assert choice(cpu_path).stdout == "cpu\n"
    assert choice(gpu_path).stdout == "cuda\n"
    assert choice(gpu_path, "cpu").stdout == "cpu\n"
    bad = choice(cpu_path, "gpu")
    assert bad.returncode == 2 and bad.stdout == "" and "TORCH must be one of" in bad.stderr


def make_setup(path: str, venv: Path, *args: str) -> str:
    """The commands ``make setup`` would run (``make -n``), for a venv at ``venv``."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    out = subprocess.run([make, "-n", "-C", str(ROOT), "setup", f"VENV={venv}", f"PYTHON={sys.executable}", *args],
                         capture_output=True, text=True, env={"PATH": path})
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_make_setup_installs_the_cpu_pins_without_a_gpu(cpu_path, tmp_path):
    out = make_setup(cpu_path, tmp_path / "v")
    assert "-c constraints-cpu.txt -e '.[test]'" in out and f"touch {tmp_path / 'v' / '.installed-cpu'}" in out
    assert "--clear" not in out and "torch.version.cuda" not in out


def test_make_setup_installs_a_cuda_torch_with_a_gpu(gpu_path, tmp_path):
    out = make_setup(gpu_path, tmp_path / "v")
    assert "-c constraints-cuda.txt -e '.[test]'" in out and "constraints-cpu.txt" not in out
    assert "torch.version.cuda or sys.exit" in out and f"touch {tmp_path / 'v' / '.installed-cuda'}" in out


def test_make_setup_system_makes_a_venv_that_sees_site_packages(gpu_path, tmp_path):
    out = make_setup(gpu_path, tmp_path / "v", "TORCH=system")
    # The notebooks' own pins (NumPy, matplotlib), not a torch: pip keeps the torch and Triton PYTHON has.
    assert "-m venv --system-site-packages" in out and "pip install --quiet -c constraints.txt -e '.[test]'" in out


# ".installed": the stamp of older Makefiles, which installed the CPU pins unless told otherwise.
@pytest.mark.parametrize("stamp, path, cleared", [
    (".installed-cpu", "gpu", True), (".installed-cuda", "cpu", True), (".installed-system", "cpu", True),
    (".installed", "gpu", True), (".installed", "cpu", False),
])
def test_make_setup_remakes_a_venv_made_for_another_build(cpu_path, gpu_path, tmp_path, stamp, path, cleared):
    venv = tmp_path / "v"
    venv.mkdir()
    (venv / stamp).touch()
    out = make_setup(gpu_path if path == "gpu" else cpu_path, venv)
    assert ("--clear" in out) is cleared and f" {venv}\n" in out and "pip install" in out


def test_make_setup_keeps_an_up_to_date_venv_of_the_same_build(cpu_path, tmp_path):
    venv = tmp_path / "v"
    venv.mkdir()
    (venv / ".installed-cpu").touch()
    out = make_setup(cpu_path, venv)
    assert "venv" not in out and "pip" not in out
