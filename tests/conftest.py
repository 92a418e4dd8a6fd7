import importlib.util
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from preshuffle import device, report
from preshuffle.shapes import Shape
from preshuffle.testing.inputs import benchmark_problem

# Reproducible examples in CI; no deadline, since interpreter timings vary with the machine's load.
settings.register_profile("ci", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture
def on(monkeypatch):
    """Pretend this process runs on a GPU of a given compute capability (for what is decided before a launch; the
    kernels still run here: under the interpreter, or on this GPU)."""
    def use(capability, name):
        monkeypatch.setattr(device, "current_support", lambda: device.kernel_support(capability, name))
    return use


@pytest.fixture
def small_benchmark_problem():
    """A problem built like the benchmark's, small enough for the interpreter (3 sequences, 16 heads)."""
    return benchmark_problem(Shape(3, 2, 120), 16, "shuffle", heads=16)


ROOT = Path(__file__).resolve().parents[1]


def _load_script(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def load_tool():
    """Load a stdlib-only script of tools/ (not a package: the Makefile and Jupyter run them by path)."""
    return lambda name: _load_script(ROOT / "tools" / f"{name}.py")


@pytest.fixture(scope="session")
def load_benchmark():
    """Load a script of benchmarks/ (run by path on the GPU machine, not part of the package)."""
    return lambda name: _load_script(ROOT / "benchmarks" / f"{name}.py")


@pytest.fixture(scope="session")
def record():
    """The committed H200 results."""
    return report.load()
