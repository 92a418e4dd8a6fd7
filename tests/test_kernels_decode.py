"""The exact path on GPUs without Triton's e4m3 type (sm80-sm86): e4m3 bytes decoded to fp16 with integer
instructions, held to the exact contract, bit for bit the same logits as Triton's own conversion where both run,
and compiled for sm80 without a GPU."""

import os
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import HealthCheck, given, settings, strategies as st

from preshuffle import device
from preshuffle.kernels import LaunchConfig, fp8_paged_mqa_logits, portable
from preshuffle.testing.inputs import random_problem
from preshuffle.testing.numeric import RTOL, assert_bitwise_equal, check_logits

DEV = device.KERNEL_DEVICE


@triton.jit
def _decode_kernel(x_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, portable._e4m3_over_256(tl.load(x_ptr + i)))


def test_decode_matches_torch_on_every_byte():
    every = torch.arange(256, dtype=torch.uint8, device=DEV)
    out = torch.empty(256, dtype=torch.float16, device=DEV)
    _decode_kernel[(1,)](every, out, N=256)
    value = every.view(torch.float8_e4m3fn)
    expected = value.to(torch.float16) / 256
    finite = ~expected.isnan()
    assert torch.equal(expected[finite].double() * 256, value.double()[finite])  # nothing lost in the division
    assert torch.equal(out.isnan(), expected.isnan()) and int(out.isnan().sum()) == 2  # 0x7F and 0xFF
    assert torch.equal(out[finite].view(torch.int16), expected[finite].view(torch.int16))  # -0.0 included


A100 = ((8, 0), "NVIDIA A100-SXM4-80GB")


# The same A100 support for every example: the fixture's one patch serves them all.
@settings(max_examples=10, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(block_size=st.sampled_from([1, 16, 64]), layout=st.sampled_from(["normal", "shuffle"]),
       next_n=st.integers(1, 3), ctx_2d=st.booleans(), seed=st.integers(0, 2**16))
def test_an_sm80_call_decodes_and_holds_the_exact_contract(on, block_size, layout, next_n, ctx_2d, seed):
    on(*A100)
    if layout == "shuffle" and block_size % 16:
        layout = "normal"
    problem = random_problem([0, 45, 130], next_n=next_n, block_size=block_size, layout=layout, ctx_2d=ctx_2d,
                             seed=seed, device=DEV)
    out = torch.full((problem.batch * next_n, problem.max_model_len), float("nan"), device=DEV)
    problem.call(fp8_paged_mqa_logits, out=out)  # the default precision there: exact
    verdict = check_logits(out, problem)
    assert verdict["same_inf_pattern"] and verdict["max_rel_error"] <= RTOL, verdict


def test_decoding_gives_the_same_bits_as_the_conversion():
    problem = random_problem([33, 150], next_n=2, block_size=16, layout="shuffle", seed=5, device=DEV)
    run = lambda dot: problem.call(fp8_paged_mqa_logits, precision="exact", config=LaunchConfig(dot=dot))
    assert_bitwise_equal(run("fp16-decode"), run("fp16"))


def test_the_teaching_kernels_name_what_an_sm80_lacks(on):
    from preshuffle.teaching import steps

    on(*A100)
    problem = random_problem([20], block_size=16, device=DEV)
    with pytest.raises(ValueError, match=r"the teaching kernel views the cache as Triton's e4m3 type, which NVIDIA "
                                         r"A100-SXM4-80GB \(sm80\) lacks"):
        problem.call(steps.chunked_logits)


SM80_BUILD = """
import os
os.environ["TRITON_INTERPRET"] = "0"
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from preshuffle.kernels import portable

signature = {name: "i32" for name in ("bt_stride", "table_tokens", "num_blocks", "out_stride", "max_model_len",
                                      "run")}
signature = {"q_ptr": "*u8", "kv_ptr": "*u8", "scale_ptr": "*fp32", "w_ptr": "*fp32", "ctx_ptr": "*i32",
             "bt_ptr": "*i32", "out_ptr": "*fp32", **signature}
constexprs = dict(NEXT_N=1, NEXT_N_PAD=1, H=64, D=128, BLOCK_SIZE=64, SHUFFLED=False, CTX_2D=False, CHUNK=64,
                  DOT="DOT_MODE")
source = ASTSource(portable._paged_mqa_logits_kernel, {**signature, **dict.fromkeys(constexprs, "constexpr")},
                   constexprs)
compiled = triton.compile(source, target=GPUTarget("cuda", 80, 32), options=dict(num_warps=4, num_stages=3))
print("mma.sync" in compiled.asm["ptx"] and "e4m3" not in compiled.asm["ptx"])
"""


@pytest.mark.parametrize("dot, builds", [("fp16-decode", True), ("fp16", False)])
def test_the_portable_kernel_builds_for_sm80_only_when_it_decodes(dot, builds):
    """Compiled for sm80 without a GPU (Triton's bundled ptxas): decoding builds, with the Ampere MMA and no e4m3
    instruction; Triton's own e4m3 conversion does not build there."""
    done = subprocess.run([sys.executable, "-c", SM80_BUILD.replace("DOT_MODE", dot)], capture_output=True, text=True,
                          env={**os.environ, "TRITON_INTERPRET": "0"})
    if builds:
        assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr[-2000:]
    else:
        assert done.returncode != 0 and "fp8e4nv" in done.stderr, done.stderr[-2000:]
