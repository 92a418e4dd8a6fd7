"""The Hopper (sm90) kernel: its dimensions, descriptors, launch rule and sm90a build (compiled without a GPU)
everywhere; against the float64 reference, in both precisions, where an sm90 GPU runs it."""

import json
import subprocess
import sys
import threading
from pathlib import Path
from unittest import mock

import pytest
import torch
from hypothesis import given, settings, strategies as st

from preshuffle import device, report
from preshuffle.contract import kv_lengths
from preshuffle.kernels import HopperConfig, fp8_paged_mqa_logits, launch
from preshuffle.kernels.hopper import descriptors, gathers, sources
from preshuffle.testing.inputs import misaligned_copy, random_problem
from preshuffle.testing.numeric import (
    assert_bitwise_equal, check_logits, check_repeatable, check_unchecked_logits, meets_contract,
)

HOPPER = device.current_support().hopper
on_hopper = pytest.mark.skipif(not HOPPER, reason="needs an sm90 GPU (the Hopper kernel has no interpreter)")


@pytest.mark.parametrize("block_size, layout, swizzle", [(16, "normal", 128), (64, "normal", 128),
                                                         (64, "shuffle", 0), (128, "shuffle", 0)])
def test_descriptors_cut_pages_into_copies_of_at_most_64_rows(block_size, layout, swizzle):
    cache = torch.zeros(5, block_size, 1, 132, dtype=torch.uint8)
    values, scales = descriptors(cache, layout)
    page = block_size * 132
    assert (values.shape, values.strides, values.block_shape) == ([5, block_size, 128], [page, 128, 1],
                                                                  [1, min(block_size, 64), 128])
    assert values.layout.swizzle_byte_width == swizzle
    # Scales: the page as fp32 words, its scales from word block_size*32, copied into slots of >= 32 words.
    assert (scales.shape, scales.strides, scales.block_shape) == ([5, page // 4], [page // 4, 1],
                                                                  [1, max(min(block_size, 64), 32)])


@pytest.mark.parametrize("block_size", [1, 4, 8, 24, 48, 80, 96, 100, 112])
def test_pages_tma_cannot_copy_are_read_through_pointers(block_size):
    """TMA needs 16-byte strides (B*132 bytes: B a multiple of 4), and a 64-position chunk must be whole copies of
    min(B, 64) rows; the kernel takes it for 16, 32 and multiples of 64 tokens (48, 80 and 96 failed on the H200:
    a descriptor's box of 48 rows is refused, 80- and 96-token pages gave wrong logits). The gather path reads the
    cache itself, as fp8 values and fp32 scales over the same bytes."""
    cache = torch.zeros(5, block_size, 1, 132, dtype=torch.uint8)
    assert gathers(block_size) and not any(map(gathers, (16, 32, 64, 128, 192, 256)))
    values, scales = sources(cache, "normal")
    assert (values.dtype, scales.dtype) == (torch.float8_e4m3fn, torch.float32)
    assert values.data_ptr() == scales.data_ptr() == cache.data_ptr()
    assert (values.shape[-1], scales.shape[-1]) == (132, 33)


@pytest.mark.parametrize("batch, next_n, exact, pps, splits, maxnreg, rows", [
    # fp8 where a wave of programs holds two a sequence or more: one full wave (3 programs an SM at one query row,
    # 2 at two or three rows), whatever the programs an SM of the rule for larger batches.
    (64, 1, False, 2, 6, 80, False), (1, 1, False, 2, 396, 80, False), (128, 1, False, 2, 3, 80, False),
    (64, 2, False, 4, 4, 128, False),
    # Larger batches, warpgroups a row, and the exact path at every batch: the programs an SM of the rule.
    (4096, 1, False, 8, 1, 80, False), (256, 1, False, 8, 5, 80, False), (64, 3, False, 4, 9, 64, True),
    (256, 3, False, 8, 5, 64, True),
    (64, 1, True, 3, 7, 80, False), (128, 1, True, 6, 7, 80, False), (4096, 1, True, 8, 1, 80, False),
    (256, 1, True, 8, 5, 80, False), (128, 2, True, 4, 5, 128, False), (64, 2, True, 2, 5, 128, False),
    (256, 3, True, 4, 3, 128, True), (64, 4, True, 2, 5, 128, False)])
def test_hopper_config_follows_the_measured_rule(monkeypatch, batch, next_n, exact, pps, splits, maxnreg, rows):
    monkeypatch.setattr(launch, "multiprocessor_count", lambda: 132)
    config = launch.hopper_config(batch, next_n, exact=exact)
    assert launch.hopper_programs_per_sm(batch, next_n, exact) == pps
    assert config.splits == splits
    assert (config.stages, config.maxnreg, config.row_warpgroups, config.row_groups) == (4, maxnreg, rows, 1)
    assert launch.hopper_registers(config, next_n, exact) == maxnreg  # the rule's programs fit an SM
    # Asked for programs an SM, the rule splits for them instead.
    assert launch.hopper_config(batch, next_n, exact=exact, programs_per_sm=pps).splits == max(1, -(-pps * 132 //
                                                                                                    batch))


@pytest.mark.parametrize("batch, splits", [(64, 2), (256, 3), (1, 132)])
def test_four_rows_on_natural_pages_launch_as_two_rows_of_twice_the_batch(monkeypatch, batch, splits):
    """next_n 4, fp8, TMA: two groups of programs, each the launch of next_n 2 for 2 * batch sequences."""
    monkeypatch.setattr(launch, "multiprocessor_count", lambda: 132)
    config = launch.hopper_config(batch, 4)
    two_rows = launch.hopper_config(2 * batch, 2)
    assert (config.row_groups, config.splits) == (2, splits) and config.splits == two_rows.splits
    assert (config.maxnreg, config.row_warpgroups) == (two_rows.maxnreg, False) == (128, False)
    assert launch.hopper_config(batch, 4, programs_per_sm=4).splits == launch.splits_for(2 * batch, 4)
    # Where the groups were slower or not measured, one program takes the four rows.
    for other in (dict(layout="shuffle"), dict(exact=True), dict(block_size=1), dict(block_size=48)):
        assert launch.hopper_config(batch, 4, **other).row_groups == 1, other
    assert [launch.row_groups_for(n) for n in (1, 2, 3, 4)] == [1, 1, 1, 2]


def test_row_groups_are_launched_where_the_committed_sweep_found_them_faster():
    """results/h200-row-groups-sweep.json timed two groups of programs a sequence beside one program for all rows
    (the launch then, and other launches on the same cache) at vLLM's call: the rule cuts the rows into groups
    exactly where the fastest grouped launch beat every ungrouped one."""
    rows = [r for r in report.load(report.RESULTS / "h200-row-groups-sweep.json")["rows"] if r.get("us_median")]
    own = {"ours": (64, "normal"), "ours-block16": (16, "normal"), "ours-block16-shuffle": (16, "shuffle")}
    grouped, ungrouped = {}, {}
    for r in rows:
        if r["who"] == "ours-config":
            cache, groups = (r["block_size"], r["layout"]), r["asked"].get("row_groups", 1)
        elif r["who"] in own:
            cache, groups = own[r["who"]], 1
        else:
            continue
        key = (r["shape"]["batch"], r["shape"]["next_n"], *cache)
        side = grouped if groups > 1 else ungrouped
        side[key] = min(side.get(key, float("inf")), r["us_median"])
    assert len(grouped) == 9  # next_n 2, 3 and 4 at B=64 and 256 on 64-token pages; 16-token preshuffled ones
    for (batch, next_n, block_size, layout), best in grouped.items():
        faster = best < ungrouped[batch, next_n, block_size, layout]
        assert faster == (launch.row_groups_for(next_n, block_size=block_size, layout=layout) == 2), \
            (batch, next_n, block_size, layout, best, ungrouped[batch, next_n, block_size, layout])


@pytest.mark.parametrize("block_size", [16, 64])
def test_preshuffled_pages_at_three_rows_take_one_warpgroup(monkeypatch, block_size):
    """A warpgroup a row spills the preshuffled keys at 64 registers: one warpgroup at 128 takes the three rows, on
    the split of three rows' rule."""
    monkeypatch.setattr(launch, "multiprocessor_count", lambda: 132)
    for batch in (64, 256):
        natural = launch.hopper_config(batch, 3, block_size=block_size)
        shuffled = launch.hopper_config(batch, 3, block_size=block_size, layout="shuffle")
        assert (natural.row_warpgroups, natural.maxnreg) == (True, 64)
        assert (shuffled.row_warpgroups, shuffled.maxnreg, shuffled.row_groups) == (False, 128, 1)
        assert shuffled.splits == natural.splits == launch.splits_for(batch, launch.hopper_programs_per_sm(batch, 3,
                                                                                                         False))


def test_the_one_wave_split_is_within_2_percent_of_the_committed_sweeps_fastest():
    """results/h200-vllm-call-sweep.json timed the Hopper kernel at vLLM's call over several splits for each shape
    (in the same rounds as DeepGEMM nv_dev); on every shape where the rule fills one wave (one math warpgroup), its
    split is among them and within 2% of the fastest; at three query rows of 64 sequences, where it does not, the
    rule's split is the fastest there."""
    def swept(name):
        times = {}
        for r in report.load(report.RESULTS / name)["rows"]:
            if r["who"] == "ours-config" and set(r["asked"]) == {"splits"} and r.get("us_median"):
                times.setdefault((r["shape"]["batch"], r["shape"]["next_n"]), {})[r["asked"]["splits"]] = \
                    r["us_median"]
        return times

    checked = 0
    with mock.patch.object(launch, "multiprocessor_count", return_value=132):
        for (batch, next_n), times in swept("h200-vllm-call-sweep.json").items():
            rule = launch.hopper_config(batch, next_n)
            if rule.row_warpgroups or rule.row_groups > 1 or \
                    launch.one_wave(batch, launch.programs_held(rule.maxnreg, 1)) is None:
                continue
            assert rule.splits in times, (batch, next_n, rule, times)
            assert times[rule.splits] <= 1.02 * min(times.values()), (batch, next_n, rule.splits, times)
            checked += 1
        assert checked == 5  # B=64 at next_n 1 and 2, B=128, B=8 and B=1 at one query row
        times = swept("h200-vllm-call-sweep.json")[(64, 3)]
        assert min(times, key=times.get) == launch.hopper_config(64, 3).splits, times


@pytest.mark.parametrize("batch, next_n, pps", [(64, 1, 3), (8, 1, 3), (128, 1, 6), (256, 1, 8), (64, 2, 4)])
def test_the_gather_launch_has_a_3_stage_ring(monkeypatch, batch, next_n, pps):
    monkeypatch.setattr(launch, "multiprocessor_count", lambda: 132)
    for block_size in (1, 8, 24):
        config = launch.hopper_config(batch, next_n, block_size=block_size)
        assert config.stages == 3 and launch.hopper_programs_per_sm(batch, next_n, False, gather=True) == pps
        assert config.splits == launch.splits_for(batch, pps)


def test_hopper_registers_refuse_a_program_larger_than_an_sm():
    config = HopperConfig(1, row_warpgroups=True)
    assert launch.hopper_registers(config, 4, exact=False) == 64    # 20 warps x 64
    with pytest.raises(ValueError, match="cannot launch at next_n 4: 20 warps x 32 threads x 128 registers is more "
                                         "than an SM's 65536; lower maxnreg or turn row_warpgroups off"):
        launch.hopper_registers(config, 4, exact=True)
    assert launch.hopper_registers(HopperConfig(1, maxnreg=248), 1, exact=False) == 248  # 8 warps fit


def test_hopper_config_refuses_what_the_kernel_cannot_launch():
    with pytest.raises(ValueError, match="splits must be a positive int, got 0"):
        HopperConfig(0)
    with pytest.raises(ValueError, match=r"stages must be in \[2, 12\], got 1"):
        HopperConfig(1, stages=1)
    with pytest.raises(ValueError, match=r"maxnreg must be a multiple of 8 in \[24, 256\]"):
        HopperConfig(1, maxnreg=100)
    with pytest.raises(ValueError,
                       match=r"loader_regs must be a multiple of 8 in \[24, 256\] \(setmaxnreg's range\), got 16"):
        HopperConfig(1, loader_regs=16)
    with pytest.raises(ValueError, match="row_groups must be a power of two, got 3"):
        HopperConfig(1, row_groups=3)
    with pytest.raises(ValueError, match="row_groups must be a positive int, got 0"):
        HopperConfig(1, row_groups=0)
    with pytest.raises(ValueError, match="give row_warpgroups or row_groups > 1, not both"):
        HopperConfig(1, row_warpgroups=True, row_groups=2)
    with pytest.raises(ValueError, match="row_groups must be at most next_n 1, got 2"):
        launch.hopper_registers(HopperConfig(1, row_groups=2), 1, exact=False)
    with pytest.raises(ValueError, match="row_groups must be at most next_n 3, got 4"):
        launch.hopper_registers(HopperConfig(1, row_groups=4), 3, exact=False)


@pytest.mark.parametrize("next_n, row_groups, rows, maxnreg", [(2, 2, 1, 80), (4, 2, 2, 128), (4, 4, 1, 80),
                                                                (3, 2, 2, 128), (2, 1, 2, 128)])
def test_row_groups_give_each_program_a_power_of_two_of_rows(next_n, row_groups, rows, maxnreg):
    """A program takes next_n / row_groups rows, three rows padded to four: its registers are those of that many."""
    config = HopperConfig(1, row_groups=row_groups)
    assert launch.program_rows(config, next_n) == rows
    assert launch.hopper_registers(config, next_n, exact=False) == maxnreg


# How a program's query rows are cut: one math warpgroup for all, a warpgroup a row, or rows cut into two groups
# of programs side by side (one group where next_n is 1).
ROW_CUTS = ("one warpgroup", "a warpgroup a row", "row groups")


def cut_rows(splits: int, how: str, next_n: int, **fields) -> HopperConfig:
    return HopperConfig(splits, row_warpgroups=how == "a warpgroup a row",
                        row_groups=2 if how == "row groups" and next_n >= 2 else 1, **fields)


@st.composite
def problems(draw):
    block_size = draw(st.sampled_from([1, 8, 24, 48, 80, 16, 32, 64, 128]))  # TMA for 16, 32 and 64k, else gathered
    batch = draw(st.integers(1, 4))
    max_blocks = draw(st.integers(1, 3000 // block_size))
    lens = draw(st.lists(st.integers(0, max_blocks * block_size), min_size=batch, max_size=batch))
    return random_problem(lens, next_n=draw(st.integers(1, 4)), heads=draw(st.sampled_from([32, 64])),
                          block_size=block_size,
                          layout=draw(st.sampled_from(["normal"] if gathers(block_size) else ["normal", "shuffle"])),
                          ctx_2d=draw(st.booleans()), seed=draw(st.integers(0, 2**16)),
                          spare_columns=max_blocks - max(-(-n // block_size) for n in lens), device="cuda")


@on_hopper
@settings(max_examples=40, deadline=None)
@given(problems(), st.sampled_from(["exact", "fp8"]), st.sampled_from([None, 1, 3, 7, 64]),
       st.sampled_from(ROW_CUTS), st.sampled_from([2, 4]))
def test_hopper_kernel_holds_the_contract_of_its_precision(problem, precision, splits, rows, stages):
    """Every kind of cache, split and ring, one math warpgroup, one a query row or the rows in two groups of
    programs; shares of an odd number of chunks start mid-page for 128-token pages, a sequence's whole row wraps a
    2-stage ring many times, and 64 programs a sequence leave most of them nothing to read."""
    config = None if splits is None else cut_rows(splits, rows, problem.next_n, stages=stages)
    if config is not None and config.row_warpgroups and precision == "exact" and problem.next_n == 4:
        with pytest.raises(ValueError, match="cannot launch at next_n 4"):  # 20 warps x 128 registers
            problem.call(fp8_paged_mqa_logits, precision=precision, config=config)
        return
    out = torch.full((problem.batch * problem.next_n, problem.max_model_len), float("nan"), device="cuda")
    problem.call(fp8_paged_mqa_logits, precision=precision, config=config, out=out)  # NaN poison: all written
    verdict = check_logits(out, problem)
    assert meets_contract(verdict, precision), verdict


@on_hopper
@pytest.mark.parametrize("precision", ["exact", "fp8"])
def test_hopper_kernel_is_bitwise_repeatable_and_split_independent(precision):
    problem = random_problem([700, 1290, 5], next_n=2, block_size=64, layout="shuffle", seed=3, device="cuda")
    first = check_repeatable(lambda: problem.call(fp8_paged_mqa_logits, precision=precision))
    # Unchecked calls after the first go through the cached launch, with addresses passed as ints.
    assert_bitwise_equal(first, check_repeatable(lambda: problem.call(fp8_paged_mqa_logits, precision=precision,
                                                                      check_values=False)))
    for splits in (1, 3, 64):
        for rows in ROW_CUTS:
            assert_bitwise_equal(first, problem.call(fp8_paged_mqa_logits, precision=precision,
                                                     config=cut_rows(splits, rows, 2)))


@on_hopper
@pytest.mark.parametrize("block_size", [64, 1])
def test_unchecked_calls_the_kept_launch_cannot_serve_are_right(block_size):
    """After an unchecked call keeps its launch, calls of the same cache and query shape with a wider block table,
    2-D context lengths or a query 4 bytes off the 16-byte grid each get the checked call's logits."""
    problem = random_problem([300, 129, 64], next_n=2, block_size=block_size, seed=5, device="cuda")
    q, _, _, context_lens, block_tables, _ = problem.args
    lens_2d = context_lens.view(-1, 1) - 1 + torch.arange(2, device="cuda", dtype=torch.int32)
    for changed in ({}, {"block_tables": torch.cat([block_tables, block_tables], dim=1)},
                    {"context_lens": lens_2d}, {"q": misaligned_copy(q)}, {}):
        call = problem.replace(**changed)
        for _ in range(2):  # the first of each kind keeps its launch (an aligned one), the second repeats it
            assert_bitwise_equal(call.call(fp8_paged_mqa_logits, check_values=False),
                                 call.call(fp8_paged_mqa_logits))


@on_hopper
@pytest.mark.parametrize("block_size, layout", [(64, "normal"), (16, "shuffle"), (1, "normal")])
@pytest.mark.parametrize("rows", ROW_CUTS)
def test_hopper_output_options_on_every_split(block_size, layout, rows):
    """Four programs a sequence (shares of 192 positions of the longest row, starting mid-page for 128-token pages),
    one math warpgroup, one a row or two groups of rows: bf16 logits are the fp32 ones rounded to nearest even, and without the -inf fill every position a
    row may see holds the same bits while nothing past a sequence's last 64-position chunk is written."""
    problem = random_problem([700, 129, 5, 0], next_n=3, block_size=block_size, layout=layout, ctx_2d=True, seed=9,
                             max_model_len=1000, device="cuda")
    config = cut_rows(4, rows, 3)
    fp32 = problem.call(fp8_paged_mqa_logits, precision="fp8", config=config)
    bf16 = problem.call(fp8_paged_mqa_logits, precision="fp8", config=config, logits_dtype=torch.bfloat16)
    assert_bitwise_equal(bf16, fp32.to(torch.bfloat16))
    lens = kv_lengths(problem.context_lens, 3)
    visible = (torch.arange(1000, device="cuda") < lens.reshape(-1, 1))
    untouched = torch.arange(1000, device="cuda") >= ((lens.amax(dim=1) + 63) // 64 * 64).repeat_interleave(3)[:, None]
    for logits_dtype, clean in ((torch.float32, fp32), (torch.bfloat16, bf16)):
        out = torch.full(clean.shape, 7.0, dtype=logits_dtype, device="cuda")
        problem.call(fp8_paged_mqa_logits, precision="fp8", config=config, logits_dtype=logits_dtype,
                     clean_logits=False, out=out)
        assert_bitwise_equal(out[visible], clean[visible])
        assert (out[untouched] == 7.0).all()


@on_hopper
def test_a_kept_launch_runs_from_a_thread_that_has_not_used_cuda():
    """An unchecked repeat from another thread, which may have no CUDA context current yet: the preset launch then
    makes the device's primary context current."""
    problem = random_problem([300, 129], block_size=64, seed=6, device="cuda")
    expected = problem.call(fp8_paged_mqa_logits)
    problem.call(fp8_paged_mqa_logits, check_values=False)  # keeps the launch
    results = []
    thread = threading.Thread(target=lambda: results.append(problem.call(fp8_paged_mqa_logits, check_values=False)))
    thread.start()
    thread.join()
    torch.cuda.synchronize()
    assert_bitwise_equal(results[0], expected)


@on_hopper
@pytest.mark.parametrize("block_size", [64, 16, 1])
def test_hopper_kernel_gives_nan_for_bad_block_ids_without_reading_them(block_size):
    lens = [100, 70, 300]
    problem = random_problem(lens, block_size=block_size, seed=7, device="cuda")
    tables = problem.block_tables.clone()
    tables[0, 1] = problem.num_blocks + 5   # past the cache
    tables[1, 0] = -3
    tables[2, 3] = 2**31 - 1
    out = problem.replace(block_tables=tables).call(fp8_paged_mqa_logits, check_values=False)
    expected = torch.zeros_like(out, dtype=torch.bool)
    for row, entry in ((0, 1), (1, 0), (2, 3)):  # NaN up to the context, -inf past it
        expected[row, entry * block_size:min((entry + 1) * block_size, lens[row])] = True
    assert torch.equal(torch.isnan(out), expected)
    good = problem.call(fp8_paged_mqa_logits)
    assert torch.equal(out[~expected], good[~expected])


@on_hopper
@pytest.mark.parametrize("block_size, layout, next_n, precision", [
    (16, "normal", 1, "fp8"), (16, "shuffle", 2, "exact"), (64, "normal", 3, "fp8"), (64, "shuffle", 1, "exact"),
    (1, "normal", 2, "fp8"), (8, "normal", 3, "exact")])
@pytest.mark.parametrize("rows", ROW_CUTS)
def test_hopper_kernel_unchecked_lengths_past_the_table_give_nan(block_size, layout, next_n, precision, rows):
    problem = random_problem([150, 70, 129], next_n=next_n, block_size=block_size, layout=layout, seed=12,
                             max_model_len=512, device="cuda")
    capacity = problem.block_tables.shape[1] * block_size
    lens = problem.context_lens.clone()
    lens[0], lens[1], lens[2] = -5, capacity + 30, capacity + 100  # nothing; past its row; past the table's end
    for tables in (problem.block_tables, problem.block_tables[:, :0]):  # and an empty table
        out = torch.full((problem.batch * next_n, 512), 1.0e30, device="cuda")
        problem.replace(context_lens=lens, block_tables=tables).call(
            fp8_paged_mqa_logits, precision=precision, check_values=False, out=out,
            config=cut_rows(4, rows, next_n))
        verdict = check_unchecked_logits(out, problem, lens, tables)
        assert verdict["nan_exact"] and verdict["nan"] > 0 and meets_contract(verdict, precision), verdict


def test_every_path_compiles_for_sm90a_within_its_register_budget():
    """benchmarks/compile_hopper.py compiles the kernel for sm90a on any machine: every path fits its register
    budget without spilling, and a program holds its math warpgroups and the loader warp padded to a warpgroup (or
    the gather's loader warpgroup), the count launch.hopper_registers checks against an SM's registers; and 16-token
    pages' scales cost no more barriers or shared-memory instructions than 64-token pages'."""
    tool = Path(__file__).resolve().parents[1] / "benchmarks" / "compile_hopper.py"
    done = subprocess.run([sys.executable, str(tool), "--json"], capture_output=True, text=True, check=True)
    variants = json.loads(done.stdout)
    assert len(variants) == 10
    for r in variants:
        next_n, block_size, _, exact, row_warpgroups = r["variant"]
        assert r["stack"] == 0, r
        # Pages of a multiple of 16 tokens come by TMA alone, the others by cp.async alone.
        assert (r["tma"] > 0, r["cp_async"] > 0) == (not launch.gathers(block_size), launch.gathers(block_size)), r
        assert r["registers"] <= launch.hopper_maxnreg(next_n, exact, row_warpgroups), r
        assert r["warps"] == 4 * (next_n if row_warpgroups else 1) + 4, r
        assert r["gmma"] > 0, r  # the MMAs are warpgroup MMAs (HGMMA/QGMMA), not a fallback
    # 16-token pages' scales are read in the accumulator rows' own layout: no more shared-memory traffic or barriers
    # than 64-token pages, whose scales come in one slot.
    built = {tuple(r["variant"]): r for r in variants}
    for sixteen, sixty_four in (((1, 16, "normal", False, False), (1, 64, "normal", False, False)),
                                ((2, 16, "shuffle", False, False), (2, 64, "normal", False, False))):
        assert [built[sixteen][k] for k in ("bar", "lds", "sts")] == \
            [built[sixty_four][k] for k in ("bar", "lds", "sts")], (sixteen, built[sixteen], built[sixty_four])


@pytest.mark.parametrize("next_n, block_size, layout", [(2, 64, "normal"), (4, 64, "normal"), (3, 16, "shuffle")])
def test_programs_of_row_groups_compile_for_sm90a_within_their_register_budget(next_n, block_size, layout):
    """Two groups of rows: each program is the kernel of next_n / 2 rows in one math warpgroup, with no spill."""
    tool = Path(__file__).resolve().parents[1] / "benchmarks" / "compile_hopper.py"
    done = subprocess.run([sys.executable, str(tool), "--next-n", str(next_n), "--block-size", str(block_size),
                           "--layout", layout, "--row-groups", "2", "--json"], capture_output=True, text=True,
                          check=True)
    r = json.loads(done.stdout)
    budget = launch.hopper_registers(HopperConfig(1, row_groups=2), next_n, exact=False)
    assert (r["stack"], r["warps"], r["row_groups"]) == (0, 8, 2), r
    assert r["registers"] <= budget == (80 if next_n == 2 else 128), r
    assert r["gmma"] > 0, r


def test_the_output_options_compile_for_sm90a_at_no_cost_in_resources():
    """bf16 logits and the skipped -inf fill (``clean_logits=False``), alone and together, on natural and preshuffled
    pages of 16 and 64 tokens and the gather, at next_n 1-4 with the launch rule's warpgroups: each compiles with the
    registers, stack, shared memory, warps and instruction mix of its fp32, filled twin."""
    tool = Path(__file__).resolve().parents[1] / "benchmarks" / "compile_hopper.py"
    done = subprocess.run([sys.executable, str(tool), "--outputs", "--json"], capture_output=True, text=True,
                          check=True)
    variants = json.loads(done.stdout)
    assert len(variants) == 80
    twins = {}
    for r in variants:
        twins.setdefault(tuple(r["variant"]), {})[(r["bf16"], r["clean"])] = {
            k: v for k, v in r.items() if k not in ("bf16", "clean")}
    assert len(twins) == 20
    for variant, options in twins.items():
        assert len(options) == 4 and all(r == options[(False, True)] for r in options.values()), variant


def test_the_gather_and_exact_rules_are_within_5_percent_of_the_committed_sweeps_fastest(monkeypatch):
    """results/h200-gather-sweep.json timed block 1 (gathered) and the exact path over splits, rings and register
    budgets; the rule's launch (the best time among rows of that launch: several splits can give the same one) is
    within 5% of the fastest row of its shape, cache and precision. The experimental loader's rows are left out, and
    so are its fp8 rows of 64-token pages, whose rule the sweep at vLLM's call sets (the test above)."""
    monkeypatch.setattr(launch, "multiprocessor_count", lambda: 132)
    rows = [r for r in report.load(report.RESULTS / "h200-gather-sweep.json")["rows"] if "loader" not in r]
    groups = {}
    for r in rows:
        groups.setdefault((r["shape"], r["variant"], r["launch"]["precision"]), []).append(r)
    assert len(groups) == 20  # 7 shapes of block 1, 7 of block 64 in fp8, 6 in exact
    for (label, variant, precision), group in groups.items():
        if variant != "block1" and precision == "fp8":
            continue
        fields = dict(kv.split("=") for kv in label.split())
        batch, next_n = int(fields["B"]), int(fields["next_n"])
        rule = launch.hopper_config(batch, next_n, exact=precision == "exact",
                                    block_size=1 if variant == "block1" else 64)
        # The sweep cut rows into fixed runs from max_model_len (its contexts about the shape's): the rule's split
        # is the run that cuts the row into as many programs.
        run = launch.fixed_run(group[0]["launch"]["max_model_len"], rule.splits)
        mine = [r["us"] for r in group if (r["launch"]["tokens_per_program"], r["launch"]["stages"],
                                           r["launch"]["maxnreg"]) == (run, rule.stages, rule.maxnreg)]
        assert mine, (label, variant, precision, rule)
        assert min(mine) <= 1.05 * min(r["us"] for r in group), (label, variant, precision, rule)
