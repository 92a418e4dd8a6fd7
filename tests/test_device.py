"""device: which kernel paths each GPU can run (a pure function of its compute capability), this process's
support, and ``python -m preshuffle --version``."""

import json
import os
import subprocess
import sys

import pytest
import torch
import triton

from preshuffle import device
from preshuffle.device import KernelSupport, current_support, kernel_support, require_precision

# The GPUs readers bring, by compute capability: what each runs (from Triton 3.6, see device.py).
GPUS = {
    (7, 5): ("Tesla T4", (), False),
    (8, 0): ("NVIDIA A100-SXM4-80GB", ("exact",), False),
    (8, 6): ("NVIDIA A10", ("exact",), False),
    (8, 9): ("NVIDIA L4", ("fp8", "exact"), False),
    (9, 0): ("NVIDIA H200", ("fp8", "exact"), True),
    (10, 0): ("NVIDIA B200", ("fp8", "exact"), False),
    (12, 0): ("NVIDIA GeForce RTX 5090", ("fp8", "exact"), False),
}


@pytest.mark.parametrize("capability", GPUS)
def test_kernel_support_for_each_gpu(capability):
    name, precisions, hopper = GPUS[capability]
    support = kernel_support(capability, name)
    assert support.device == f"{name} (sm{capability[0]}{capability[1]})" and support.capability == capability
    assert support.precisions == precisions and support.hopper is hopper
    assert (support.missing == "") is (capability == (9, 0))
    assert support.fp8_types is (capability >= (8, 9))  # below, the exact path decodes e4m3 itself
    if precisions:
        assert support.default_precision == precisions[0] == ("fp8" if support.fp8_types else "exact")
    else:
        with pytest.raises(ValueError, match=rf"^{name} \(sm\d+\) can run no kernel path: it lacks compute capa"):
            support.default_precision


def test_kernel_support_names_what_old_gpus_lack():
    assert kernel_support((7, 5)).missing.startswith("compute capability 8.0, the oldest Triton supports")
    assert "compute capability 8.9" in kernel_support((8, 0)).missing
    assert "float8e4nv" in kernel_support((8, 6)).missing
    assert kernel_support((8, 9)).missing == kernel_support((12, 0)).missing == "the sm90 TMA/WGMMA of the Hopper kernel"


def test_kernel_support_for_the_interpreter():
    support = kernel_support(None)
    assert support == KernelSupport("CPU (Triton interpreter)", None, ("exact", "fp8"), False, support.missing)
    assert support.default_precision == "exact" and "TMA/WGMMA" in support.missing


def test_kernel_support_without_a_name():
    assert kernel_support((9, 0)).device == "NVIDIA GPU (sm90)"


@pytest.mark.parametrize("capability", [(9,), (9, 0, 0), "sm90", [9, 0], (9.0, 0), (9, -1), (True, 0), 90])
def test_kernel_support_rejects_a_bad_capability(capability):
    with pytest.raises(TypeError, match=r"capability must be None or a \(major, minor\) tuple of two ints >= 0"):
        kernel_support(capability)


def test_kernel_support_rejects_a_bad_name():
    with pytest.raises(TypeError, match="name must be a str, got int"):
        kernel_support((9, 0), 5)


@pytest.mark.parametrize("capability", [None, *GPUS])
@pytest.mark.parametrize("precision", device.PRECISIONS)
def test_require_precision_for_each_gpu(capability, precision):
    support = kernel_support(capability, GPUS[capability][0] if capability else "")
    if precision in support.precisions:
        require_precision(precision, support)
    else:
        with pytest.raises(ValueError) as error:
            require_precision(precision, support)
        assert str(error.value) == f"{support.device} cannot run the {precision} kernel path: it lacks {support.missing}"


@pytest.mark.parametrize("precision", ["fp16", "FP8", "", None])
def test_require_precision_rejects_an_unknown_precision(precision):
    with pytest.raises(ValueError, match=r"precision must be one of \('exact', 'fp8'\), got"):
        require_precision(precision, kernel_support(None))


def test_current_support_describes_this_process():
    support = current_support()
    if device.INTERPRETED:
        assert support == kernel_support(None)
    else:
        assert support == kernel_support(torch.cuda.get_device_capability(), torch.cuda.get_device_name())
    require_precision(support.default_precision)  # what this process picks, it runs


# Compiles (never runs) one fp8 kernel for a target: bytes viewed as float8e4nv, then an fp16 dot (what the exact
# path runs where the type exists) and an fp8 dot. Prints whether it compiled and whether the fp8 dot became a wgmma.
COMPILE = """
import json, sys
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

@triton.jit
def both_paths(a_ptr, b_ptr, out_ptr):
    i = tl.arange(0, 64)
    tile = i[:, None] * 64 + i[None, :]
    a = tl.load(a_ptr + tile).to(tl.float8e4nv, bitcast=True)
    b = tl.load(b_ptr + tile).to(tl.float8e4nv, bitcast=True)
    exact = tl.dot(a.to(tl.float16), b.to(tl.float16), out_dtype=tl.float32)
    tl.store(out_ptr + tile, exact + tl.dot(a, b, out_dtype=tl.float32))

results = {}
for capability in json.loads(sys.argv[1]):
    source = ASTSource(both_paths, {"a_ptr": "*u8", "b_ptr": "*u8", "out_ptr": "*fp32"})
    try:
        ptx = triton.compile(source, target=GPUTarget("cuda", capability, 32)).asm["ptx"]
        results[capability] = {"compiles": True, "wgmma": "wgmma" in ptx}
    except Exception as exc:
        assert "fp8e4nv not supported in this architecture" in str(exc), exc
        results[capability] = {"compiles": False, "wgmma": False}
print(json.dumps(results))
"""


def test_kernel_support_agrees_with_what_triton_compiles(tmp_path):
    """Triton's own compiler, for each GPU of the table (no GPU needed): a kernel on Triton's e4m3 type compiles
    exactly where kernel_support gives the fp8 path (and says fp8_types; elsewhere the exact path decodes, see
    test_kernels_decode.py), and the fp8 dot is a Hopper wgmma exactly where it says hopper."""
    script = tmp_path / "compile_both_paths.py"  # Triton reads a kernel's source from its file
    script.write_text(COMPILE)
    targets = [10 * major + minor for major, minor in GPUS]
    out = subprocess.run([sys.executable, str(script), json.dumps(targets)], capture_output=True, text=True,
                         env={**os.environ, "TRITON_INTERPRET": "0"}, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    compiled = json.loads(out.stdout)
    for (major, minor), (_, precisions, hopper) in GPUS.items():
        result = compiled[str(10 * major + minor)]
        assert result == {"compiles": "fp8" in precisions, "wgmma": hopper}, (major, minor, result)


def test_version_flag_prints_versions_device_and_paths():
    out = subprocess.run([sys.executable, "-m", "preshuffle", "--version"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    support = current_support()
    lines = out.stdout.splitlines()
    assert lines[0].startswith("preshuffle 0.1.0 (Python ")
    assert lines[1].startswith(f"torch {torch.__version__} (") and lines[1].endswith(f"Triton {triton.__version__}")
    assert lines[2] == f"device: {support.device}" and lines[3] == f"kernels: {device.describe()}"
    assert lines[4] == "kernel paths: " + ", ".join(
        p + " (default)" * (p == support.default_precision) for p in support.precisions)
    if device.INTERPRETED:
        assert lines[3].startswith("kernels: Triton interpreter") and lines[4] == "kernel paths: exact (default), fp8"


def test_require_kernel_devices_in_a_cuda_process_names_the_tensor_off_the_gpu(monkeypatch):
    monkeypatch.setattr(device, "INTERPRETED", False)   # read at each call: this process compiles for CUDA
    with pytest.raises(ValueError, match="^weights is on cpu, but kernels are compiled for CUDA in this process: pass "
                                         "CUDA tensors, or set TRITON_INTERPRET=1"):
        device.require_kernel_devices(weights=torch.empty(1))


@pytest.mark.skipif(not device.INTERPRETED, reason="the CPU-tensor message is for interpreter runs")
def test_require_kernel_devices_names_the_tensor():
    device.require_kernel_devices(q=torch.empty(1))
    with pytest.raises(ValueError, match="^kv_cache is on meta, but kernels run under Triton's interpreter"):
        device.require_kernel_devices(q=torch.empty(1), kv_cache=torch.empty(1, device="meta"))
