import sys
import threading

import numpy as np
import pytest
from hypothesis import given, strategies as st

from preshuffle import negotiation as neg
from preshuffle.paging import slot_mapping
from preshuffle.negotiation import (
    DeepseekV32IndexerBackend, MultipleOf, ROCMAiterMLASparseBackend, map_to_kernel_blocks,
    select_common_block_size,
)


def backend(sizes):
    return type("B", (neg.AttentionBackend,), {"get_supported_kernel_block_sizes": staticmethod(lambda: sizes)})


# vLLM's own unit cases.
def test_select_common_block_size_prefers_manager_block_size():
    assert select_common_block_size(128, [backend([MultipleOf(32)]), backend([64, MultipleOf(16)])]) == 128


def test_select_common_block_size_largest_common_int_divisor():
    assert select_common_block_size(256, [backend([128, 64]), backend([64, 32])]) == 64


def test_select_common_block_size_no_common_size_raises():
    with pytest.raises(ValueError, match="No common block size for 48"):
        select_common_block_size(48, [backend([64]), backend([MultipleOf(16)])])


# The PR's regression test, written the way vLLM writes it: real backends, platform monkeypatched.
def test_select_common_block_size_rocm_sparse_mla_block_size_16_keeps_16(monkeypatch):
    monkeypatch.setattr(neg.current_platform, "is_rocm", lambda: True)
    assert select_common_block_size(16, [DeepseekV32IndexerBackend, ROCMAiterMLASparseBackend]) == 16


def test_select_common_block_size_rocm_sparse_mla_block_size_32(monkeypatch):
    monkeypatch.setattr(neg.current_platform, "is_rocm", lambda: True)
    assert select_common_block_size(32, [DeepseekV32IndexerBackend, ROCMAiterMLASparseBackend]) == 32


def test_select_common_block_size_before_pr_block_size_16_fell_back_to_1(monkeypatch):
    monkeypatch.setattr(neg.current_platform, "is_rocm", lambda: True)
    group = [neg.DeepseekV32IndexerBackendBeforePR, neg.ROCMAiterMLASparseBackendBeforePR]
    assert select_common_block_size(16, group) == 1
    assert select_common_block_size(128, group) == 64


def test_get_supported_kernel_block_sizes_read_at_call_time(monkeypatch):
    assert DeepseekV32IndexerBackend.get_supported_kernel_block_sizes() == [64]
    monkeypatch.setattr(neg.current_platform, "is_rocm", lambda: True)
    assert DeepseekV32IndexerBackend.get_supported_kernel_block_sizes() == [1, MultipleOf(16)]


@pytest.mark.parametrize("manager, before, after", [
    (1, 1, 1), (8, 1, 1), (16, 1, 16), (24, 1, 1), (32, 1, 32), (48, 1, 48), (64, 64, 64), (96, 1, 96),
    (128, 64, 128),
])
def test_negotiate_spec_table_rocm(manager, before, after):
    assert neg.negotiate(manager, "rocm", before_pr=True).kernel_block_size == before
    assert neg.negotiate(manager, "rocm").kernel_block_size == after


def test_negotiate_cuda_group_needs_multiples_of_64():
    assert neg.negotiate(64, "cuda").kernel_block_size == 64
    assert neg.negotiate(128, "cuda").kernel_block_size == 64
    assert neg.negotiate(16, "cuda").error.startswith("No common block size for 16")


def test_select_common_block_size_unknown_entry_type_raises_like_vllm():
    with pytest.raises(ValueError, match="Unknown supported size: 16.0"):
        select_common_block_size(16, [backend([16.0])])
    # Like vLLM, an entry after the first match is never looked at.
    assert select_common_block_size(16, [backend([16, "junk"])]) == 16


@pytest.mark.parametrize("bad, exc", [(0, ValueError), (-16, ValueError), (16.0, TypeError), ("16", TypeError),
                                      (True, TypeError), (None, TypeError)])
def test_select_common_block_size_bad_manager_size(bad, exc):
    with pytest.raises(exc, match="kv_manager_block_size"):
        select_common_block_size(bad, [backend([MultipleOf(1)])])


def test_multiple_of_validates_and_compares():
    assert MultipleOf(16) == MultipleOf(16) and MultipleOf(16) != MultipleOf(32) and repr(MultipleOf(16)) == "MultipleOf(16)"
    with pytest.raises(ValueError, match="base"):
        MultipleOf(0)
    with pytest.raises(TypeError, match="base"):
        MultipleOf(1.5)


def test_select_common_block_size_no_backends_accepts_manager_size():
    assert select_common_block_size(48, []) == 48


# A brute-force oracle: the largest divisor of the manager size that every backend accepts.
def oracle(manager, lists):
    def accepts(sizes, b):
        return any((isinstance(s, int) and s == b) or (isinstance(s, MultipleOf) and b % s.base == 0) for s in sizes)
    for d in range(manager, 0, -1):
        if manager % d == 0 and all(accepts(sizes, d) for sizes in lists):
            return d
    return None


entries = st.one_of(st.sampled_from([1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 256]),
                    st.builds(MultipleOf, st.sampled_from([1, 2, 4, 8, 16, 32, 64])))


@given(st.integers(1, 1024), st.lists(st.lists(entries, min_size=1, max_size=4), max_size=4))
def test_select_common_block_size_matches_brute_force_oracle(manager, lists):
    expected = oracle(manager, lists)
    backends = [backend(sizes) for sizes in lists]
    if expected is None:
        with pytest.raises(ValueError, match="No common block size"):
            select_common_block_size(manager, backends)
    else:
        assert select_common_block_size(manager, backends) == expected


def test_map_to_kernel_blocks_spec_examples():
    assert map_to_kernel_blocks([0, 1, 2], 2).tolist() == [0, 1, 2, 3, 4, 5]
    assert map_to_kernel_blocks([5, 9], 4).tolist() == [20, 21, 22, 23, 36, 37, 38, 39]
    assert map_to_kernel_blocks([7, 3], 1).tolist() == [7, 3]


def test_map_to_kernel_blocks_bad_input():
    with pytest.raises(ValueError, match="blocks_per_kv_block"):
        map_to_kernel_blocks([1], 0)
    with pytest.raises(ValueError, match="non-negative"):
        map_to_kernel_blocks([1, -2], 2)
    with pytest.raises(TypeError, match="ids must be integers"):
        map_to_kernel_blocks([1.5], 2)


def test_kernel_blocks_per_manager_block_must_divide_manager_size():
    with pytest.raises(ValueError, match="kernel_block_size 64 must divide kv_manager_block_size size 16 evenly"):
        neg.kernel_blocks_per_manager_block(16, 64)
    assert neg.kernel_blocks_per_manager_block(64, 16) == 4


@given(st.sampled_from([16, 32, 64, 128]), st.sampled_from([1, 2, 4, 8, 16]),
       st.lists(st.integers(0, 50), min_size=1, max_size=6, unique=True), st.data())
def test_slot_mapping_does_not_depend_on_the_split(manager, r_wanted, table, data):
    kernel = manager // r_wanted if manager % r_wanted == 0 else manager
    r = manager // kernel
    kernel_table = map_to_kernel_blocks(table, r)
    positions = np.array(data.draw(st.lists(st.integers(0, manager * len(table) - 1), min_size=1, max_size=20)))
    assert (slot_mapping(kernel_table, positions, kernel) == slot_mapping(table, positions, manager)).all()


@pytest.mark.parametrize("size, runs, preshuffled", [
    (1, True, False), (16, True, True), (32, True, True), (64, True, True), (256, True, True), (512, True, True),
    (768, True, True), (48, False, True), (80, False, True), (96, False, True), (112, False, True), (8, False, True),
    (320, False, True),
])
def test_indexer_kernel_aiter_acceptance(size, runs, preshuffled):
    k = neg.indexer_kernel(size, "rocm")
    assert (k.accepted, k.preshuffled, k.kv_block_size) == (runs, preshuffled, size)


def test_sweep_exposes_the_gap_the_pr_left():
    rejected = neg.rejected_after_pr()
    assert rejected[:4] == [48, 80, 96, 112]
    assert 16 not in rejected and 32 not in rejected and 64 not in rejected and 512 not in rejected
    rows = {r["manager_block_size"]: r for r in neg.sweep([16, 48])}
    assert rows[16]["before_kernel_block_size"] == 1 and not rows[16]["before_preshuffled"]
    assert rows[16]["after_kernel_block_size"] == 16 and rows[16]["after_preshuffled"]
    assert rows[48]["after_kernel_block_size"] == 48 and not rows[48]["after_accepted"]


def test_use_platform_restores_and_validates():
    with neg.use_platform("rocm"):
        assert neg.current_platform.is_rocm()
    assert not neg.current_platform.is_rocm()
    with pytest.raises(ValueError, match="platform"):
        with neg.use_platform("tpu"):
            pass


def test_indexer_kernel_reads_the_current_platform_only_for_none():
    with neg.use_platform("rocm"):
        assert neg.indexer_kernel(16).name == neg.indexer_kernel(16, "rocm").name
    assert neg.indexer_kernel(16).name == "DeepGEMM fp8_paged_mqa_logits"


def test_use_platform_in_one_thread_is_not_seen_by_another():
    entered, leave = threading.Event(), threading.Event()
    seen = []

    def rocm_thread():
        with neg.use_platform("rocm"):
            seen.append(neg.current_platform.is_rocm())
            entered.set()
            leave.wait(10)

    thread = threading.Thread(target=rocm_thread)
    thread.start()
    try:
        assert entered.wait(10)
        assert seen == [True]
        assert not neg.current_platform.is_rocm()
        assert [b.__name__ for b in neg.sparse_mla_group()] == ["DeepseekV32IndexerBackend", "FlashMLASparseBackend"]
    finally:
        leave.set()
        thread.join()


def test_negotiate_in_two_threads_never_sees_the_other_threads_platform():
    expected = {platform: neg.negotiate(16, platform) for platform in neg.PLATFORMS}
    start, wrong = threading.Barrier(2), []

    def negotiate_many(platform):
        start.wait()
        for _ in range(1000):
            got = neg.negotiate(16, platform)
            if (got.declarations, got.kernel_block_size) != (expected[platform].declarations,
                                                               expected[platform].kernel_block_size):
                wrong.append(platform)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can, so that a race shows
    try:
        threads = [threading.Thread(target=negotiate_many, args=(p,)) for p in neg.PLATFORMS]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert wrong == []
    assert neg.current_platform.name == "cuda"


def test_current_platform_name_cannot_be_swapped():
    with pytest.raises(AttributeError):
        neg.current_platform.name = "rocm"


def declaring(*sizes):
    class Declaring(neg.AttentionBackend):
        @staticmethod
        def get_supported_kernel_block_sizes():
            return list(sizes)
    return Declaring


def mutated_multiple_of(base):
    entry = MultipleOf(16)
    entry.base = base
    return entry


@pytest.mark.parametrize("entry", [-16, 0, True, False, mutated_multiple_of(0), mutated_multiple_of(-4),
                                   mutated_multiple_of(2.0), mutated_multiple_of(True)])
def test_select_common_block_size_refuses_bad_declarations_naming_the_backend(entry):
    with pytest.raises(ValueError, match=r"Declaring declares .*: entries must be positive ints or MultipleOf"):
        select_common_block_size(16, [declaring(entry)])
    with pytest.raises(ValueError, match="Declaring declares"):
        neg.block_size_is_supported(declaring(64, entry), 64)


def test_matching_entry_is_the_first_entry_that_accepts():
    entries = [1, neg.MultipleOf(16), 64]
    assert [neg.matching_entry(entries, size) for size in (1, 16, 64, 8)] == [0, 1, 1, None]
    with pytest.raises(ValueError, match=r"Unknown supported size: 2\.0 \(declared by Mine; entries must be int or "
                                         r"MultipleOf, not builtins\.float\)"):
        neg.matching_entry([1, 2.0, 64], 64, "Mine")


def test_select_common_block_size_names_the_backend_of_an_unknown_entry():
    with pytest.raises(ValueError, match=r"Unknown supported size: 16\.0 \(declared by Declaring; "):
        select_common_block_size(16, [declaring(16.0)])
    # vLLM's isinstance(entry, int) refuses it too; the message says why a 16 is not one.
    with pytest.raises(ValueError, match=r"Unknown supported size: np\.int64\(16\) \(declared by Declaring; entries "
                                         r"must be int or MultipleOf, not numpy\.int64\)"):
        select_common_block_size(16, [declaring(np.int64(16))])


@pytest.mark.parametrize("backends, message", [
    ([DeepseekV32IndexerBackend()], "a backend must be a class with get_supported_kernel_block_sizes"),
    (["FlashInferBackend"], "a backend must be a class with get_supported_kernel_block_sizes"),
    ([int], "a backend must be a class with get_supported_kernel_block_sizes"),
    (DeepseekV32IndexerBackend, "backends must be a list of backend classes"),
    ("FlashInferBackend", "backends must be a list of backend classes"),
    ([type("Lazy", (), {"get_supported_kernel_block_sizes": staticmethod(lambda: None)})],
     r"Lazy.get_supported_kernel_block_sizes\(\) must return a list"),
])
def test_select_common_block_size_refuses_what_is_not_a_backend(backends, message):
    with pytest.raises(TypeError, match=message):
        select_common_block_size(16, backends)


@pytest.mark.parametrize("size, exc", [(0, ValueError), (-16, ValueError), (16.0, TypeError), (True, TypeError)])
def test_block_size_is_supported_bad_size(size, exc):
    with pytest.raises(exc, match="block_size must be a positive int"):
        neg.block_size_is_supported(declaring(MultipleOf(16)), size)


def test_block_size_is_supported_takes_numpy_ints():
    assert neg.block_size_is_supported(declaring(MultipleOf(16)), np.int64(32))
    assert select_common_block_size(np.int32(48), [declaring(16, MultipleOf(16))]) == 48


def test_negotiate_bad_before_pr():
    with pytest.raises(TypeError, match="before_pr must be a bool, got str 'no'"):
        neg.negotiate(16, "rocm", before_pr="no")


def test_sweep_bad_sizes():
    with pytest.raises(TypeError, match="manager_block_sizes must be a sequence of ints, got int 16"):
        neg.sweep(16)
    with pytest.raises(ValueError, match="manager_block_size must be a positive int, got 0"):
        neg.sweep([16, 0])


def test_map_to_kernel_blocks_refuses_ids_that_overflow():
    with pytest.raises(ValueError, match="overflow int64"):
        map_to_kernel_blocks([2**62], 4)
    assert map_to_kernel_blocks([2**60], 4).tolist() == [2**62, 2**62 + 1, 2**62 + 2, 2**62 + 3]


@pytest.mark.parametrize("platform", ["tpu", "CUDA", ""])
def test_indexer_kernel_refuses_an_unknown_platform(platform):
    with pytest.raises(ValueError, match=rf"^platform must be one of \('cuda', 'rocm'\), got '{platform}'$"):
        neg.indexer_kernel(64, platform)
