"""teaching/steps_sm90.py: chapter 3's chunked rungs compiled for sm90a without a GPU, and what their code says about
the chapter's claims."""

import pytest

from preshuffle import device
from preshuffle.teaching import steps, steps_sm90


@pytest.fixture(scope="module")
def found():
    return steps_sm90.rung_evidence()


def test_rung_evidence_covers_every_rung_without_spills(found):
    assert list(found) == list(steps.RUNGS)
    assert all(e["spills"] == 0 and e["ops"]["HGMMA"] > 0 for e in found.values())


def test_every_rung_pipelines_its_keys_into_two_buffers_but_not_its_scales(found):
    for e in found.values():
        assert e["key_buffers"] == 2 and "k" in e["pipelined"], e
        assert {"s", "s_next"} & set(e["plain_loads"]), e


def test_keys_as_a_keeps_the_fp16_keys_out_of_shared_memory_and_the_head_sum_in_a_warp(found):
    first, keys_as_a = found["a program walks its row in chunks"], found["keys as the MMA's A operand"]
    assert first["stored_to_shared"] == ["k: tensor<64x128xf16>"] and keys_as_a["stored_to_shared"] == []
    assert all(e["dot_a"] == "registers" and e["dot_b"] == "shared memory" for e in found.values())
    assert first["ops"]["SHFL"] >= 10 * keys_as_a["ops"]["SHFL"] and first["shared"] > keys_as_a["shared"]


def test_the_scale_after_the_sum_cuts_the_multiplies_and_scales_ahead_carries_the_load(found):
    before, after = found["keys as the MMA's A operand"], found["the scale after the head sum"]
    assert after["ops"]["FMUL"] < before["ops"]["FMUL"] / 4
    assert [e["carried"] for e in found.values()] == [[], [], [], ["s_next"]]


def test_evidence_refuses_text_that_is_no_ttgir():
    with pytest.raises(ValueError, match="ttgir must be the text of a TTGIR module"):
        steps_sm90.evidence("ptx")
    with pytest.raises(ValueError, match="the TTGIR has no loop around a warp_group_dot"):
        steps_sm90.evidence("module { tt.func @k() { tt.return } }")


def test_compile_rung_refuses_a_switch_that_is_no_bool_and_an_interpreting_process():
    with pytest.raises(TypeError, match="^scales_ahead must be a bool, got int 1$"):
        steps_sm90.compile_rung(scales_ahead=1)
    if device.INTERPRETED:
        with pytest.raises(RuntimeError, match="compile_rung needs TRITON_INTERPRET=0"):
            steps_sm90.compile_rung()


def test_format_evidence_prints_every_answer(found):
    text = steps_sm90.format_evidence(found["scales a chunk ahead"])
    lines = text.splitlines()
    assert len(lines) == 5 and lines[0].startswith("key tile: 2 shared-memory buffers")
    assert "handed to the next chunk: s_next" in lines[1] and lines[2].endswith(": none")
    assert lines[3] == "MMA operands: A from registers, B from shared memory"
    assert f"{found['scales a chunk ahead']['ops']['FMUL']} FMUL" in lines[4]


def test_hopper_evidence_shows_ldmatrix_only_on_preshuffled_pages_and_the_ring_in_shared_memory():
    found = steps_sm90.hopper_evidence()
    four, two, shuffled = (found[label] for label in steps_sm90.HOPPER_LAUNCHES)
    assert all(e["stack"] == 0 and e["QGMMA"] > 0 and e["UTMALDG"] > 0 and e["LDGSTS"] == 0 for e in found.values())
    assert four["LDSM"] == two["LDSM"] == 0 and shuffled["LDSM"] > 0
    # Two more stages, each 64 keys x 128 bytes, 64 fp32 scales and its two 8-byte mbarriers.
    assert four["shared"] - two["shared"] == 2 * (64 * 128 + 64 * 4 + 2 * 8)
    assert all(e["warps"] == 8 for e in found.values())  # a math warpgroup and the loader warp, padded to four
