"""``python -m preshuffle``, run as a user runs it."""

import subprocess
import sys

import pytest

from preshuffle import device


def test_main_help_lists_every_command():
    out = subprocess.run([sys.executable, "-m", "preshuffle", "--help"], capture_output=True, text=True,
                         check=True).stdout
    assert "negotiate" in out and "bench" in out


def test_main_negotiate_reports_the_pr():
    run = lambda *a: subprocess.run([sys.executable, "-m", "preshuffle", "negotiate", *a], capture_output=True,
                                    text=True)
    before = run("--block-size", "16", "--platform", "rocm", "--before-pr")
    assert before.returncode == 0 and "kernel block size: 1 (16 kernel blocks" in before.stdout
    after = run("--block-size", "16")
    assert "kernel block size: 16 (1 kernel blocks" in after.stdout and "preshuffled=True" in after.stdout
    sweep = run("--sweep", "--block-size", "16", "48")
    assert "Negotiate after PR #51216 but AITER would reject: [48]" in sweep.stdout
    bad = run("--block-size", "0")
    assert bad.returncode == 2 and "manager_block_size must be a positive int" in bad.stderr


@pytest.mark.skipif(not device.INTERPRETED, reason="a GPU process may time kernels")
def test_main_bench_refuses_the_interpreter():
    out = subprocess.run([sys.executable, "-m", "preshuffle", "bench", "--shapes", "6"], capture_output=True,
                         text=True)
    assert out.returncode == 2 and "refusing to time Triton's interpreter" in out.stderr
