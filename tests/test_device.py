import pytest
import torch

from preshuffle import device


@pytest.mark.skipif(not device.INTERPRETED, reason="the CPU-tensor message is for interpreter runs")
def test_kernel_device_error_names_the_tensor():
    assert device.kernel_device_error(torch.empty(1, device="meta"), "q").startswith("q is on meta")
