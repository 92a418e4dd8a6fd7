"""A chapter's code listings come from the modules themselves."""

import inspect

import pytest

from preshuffle import source
from preshuffle.kernels import hopper, launch, portable


def test_source_of_a_gluon_kernel_is_its_python_function():
    text = source.source(hopper._fetch)
    assert text.startswith("@gluon.jit\ndef _fetch(") and "tma.async_copy_global_to_shared" in text
    assert text == inspect.getsource(hopper._fetch.fn).rstrip()


def test_source_of_a_triton_kernel_and_a_plain_function():
    assert source.source(portable._chunk_tokens).startswith("@triton.jit\ndef _chunk_tokens(")
    assert source.source(launch.hopper_config).startswith("def hopper_config(")


def test_source_cuts_a_block_between_two_markers_and_dedents_it():
    text = source.source(hopper._hopper_kernel, "ready = gl.allocate_shared_memory", "# Runtime values")
    lines = text.splitlines()
    assert lines[0].startswith("ready = gl.allocate_shared_memory") and "mbarrier.init" in text
    assert "Runtime values" not in text and not lines[0].startswith(" ")


def test_source_names_a_marker_that_is_not_there():
    with pytest.raises(ValueError, match="start 'no such line' is not in the source of _fetch"):
        source.source(hopper._fetch, "no such line")
    with pytest.raises(ValueError, match="stop 'no such line' is not in the source of _fetch"):
        source.source(hopper._fetch, "def _fetch", "no such line")


def test_source_refuses_what_has_no_python_source():
    with pytest.raises(TypeError, match="obj must be a function or class with Python source, got int"):
        source.source(3)
