"""A chapter's code listings come from the modules themselves."""

import ast
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


def test_specialize_keeps_the_branch_a_switch_takes_and_drops_the_switch(tmp_path):
    from preshuffle.teaching import steps

    on = source.specialize(steps._chunked_kernel, KEYS_AS_A=True, SCALE_AFTER_SUM=False, SCALES_AHEAD=True)
    assert "tl.dot(k, q_t, out_dtype=tl.float32)" in on and "tl.trans(tl.dot(" not in on
    assert "s_next = _chunk_scales(start" in on and "s = _chunk_scales(first" not in on
    assert "propagate_nan=_KEEP_NAN) * w[None, :]," in on  # the scale before the head sum: its switch is off
    assert "# K @ Q^T: a token per accumulator row" in on  # the taken branch's comment, kept above it
    for name in ("KEYS_AS_A", "SCALE_AFTER_SUM", "SCALES_AHEAD", "the ladder's switches"):
        assert name not in on
    assert "if SHUFFLED:" in on and "SHUFFLED: tl.constexpr" in on  # what was not fixed stays
    ast.parse(on)
    off = source.specialize(steps._chunked_kernel, KEYS_AS_A=False, SCALE_AFTER_SUM=False, SCALES_AHEAD=False)
    assert "tl.trans(tl.dot(tl.trans(q_t), tl.trans(k)" in off and "s_next" not in off


def _counted(x, TWICE):
    y = x
    if TWICE:  # the second pass
        y = y + x
    return y


def test_specialize_of_an_if_without_else_drops_it_when_off_and_keeps_its_body_when_on():
    off, on = source.specialize(_counted, TWICE=False), source.specialize(_counted, TWICE=True)
    assert off.splitlines() == ["def _counted(x):", "    y = x", "    return y"]
    assert on.splitlines() == ["def _counted(x):", "    y = x", "    # the second pass", "    y = y + x",
                               "    return y"]


def test_specialize_names_what_it_cannot_fix():
    from preshuffle.kernels import portable
    from preshuffle.teaching import steps

    with pytest.raises(ValueError, match="_chunked_kernel has no parameter 'NO_SUCH'"):
        source.specialize(steps._chunked_kernel, NO_SUCH=True)
    with pytest.raises(TypeError, match="^KEYS_AS_A must be a bool, got int 1$"):
        source.specialize(steps._chunked_kernel, KEYS_AS_A=1)
    with pytest.raises(ValueError, match="_chunk_tokens uses BLOCK_SIZE at line .* other than as an if's test"):
        source.specialize(portable._chunk_tokens, BLOCK_SIZE=True)
    with pytest.raises(ValueError, match="an elif on MASKED is not taken"):
        source.specialize(portable._block_ids, MASKED=True)
    with pytest.raises(TypeError, match="obj must be a function or class with Python source, got int"):
        source.specialize(3)


def test_changes_prints_the_lines_that_differ_with_context():
    before = "a\nb\nc\nd\ne\nf\ng"
    after = "a\nB\nc\nd\ne\nf\ng\nh"
    assert source.changes(before, after).splitlines() == ["  a", "- b", "+ B", "  c", "...", "  g", "+ h"]
    assert source.changes(before, before) == ""
    with pytest.raises(TypeError, match="before and after must be str, got int and str"):
        source.changes(1, "a")
    with pytest.raises(ValueError, match="context must be a non-negative int, got -1"):
        source.changes("a", "b", context=-1)
