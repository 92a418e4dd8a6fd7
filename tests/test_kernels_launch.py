import pytest

from preshuffle import device
from preshuffle.kernels import LaunchConfig
from preshuffle.kernels import launch


def test_launch_config_validation():
    with pytest.raises(ValueError, match="chunk must be a power of two"):
        LaunchConfig(chunk=48)
    with pytest.raises(ValueError, match="tokens_per_program must be a positive multiple"):
        LaunchConfig(chunk=64, tokens_per_program=100)
    with pytest.raises(ValueError, match="dot must be one of"):
        LaunchConfig(dot="tf32")


def test_default_programs_per_sm_is_the_measured_rule():
    assert [launch.default_programs_per_sm(b) for b in (1, 64, 127, 128, 256, 4096)] == [4, 4, 4, 16, 16, 16]


@pytest.mark.parametrize("batch, max_model_len, splits", [(64, 8192, 9), (4096, 8192, 1), (1, 100, 2), (8, 65536, 66)])
def test_config_for_puts_a_few_programs_on_each_sm(monkeypatch, batch, max_model_len, splits):
    monkeypatch.setattr(launch, "multiprocessor_count", lambda: 132)
    config = launch.config_for(batch, max_model_len)
    chunks = -(-max_model_len // launch.CHUNK)
    assert config.tokens_per_program == -(-chunks // splits) * launch.CHUNK  # never below one chunk a program
    assert (config.chunk, config.num_warps, config.num_stages) == (launch.CHUNK, launch.NUM_WARPS, launch.NUM_STAGES)
    assert launch.config_for(batch, max_model_len, dot="fp8").dot == "fp8"


@pytest.mark.skipif(not device.INTERPRETED, reason="the interpreter's rule")
def test_default_config_gives_each_sequence_one_program_under_the_interpreter():
    assert launch.default_config(4, 130) == LaunchConfig(64, 192)
