"""The page-read floor kernel: every value and scale word a call reads, folded, against torch on fresh random
caches of every page size (under Triton's interpreter on the CPU, compiled on a GPU)."""

import json

import pytest
import torch

from preshuffle import benchmark, device
from preshuffle.measure.page_read import page_read, page_read_reference, xor_fold, xor_groups
from preshuffle.shapes import Shape
from preshuffle.testing import timing
from preshuffle.testing.inputs import contiguous_block_tables, random_problem


@pytest.mark.parametrize("block_size, tokens", [(1, 16), (16, 32), (64, 64), (24, 16)])
def test_page_read_folds_every_word_a_call_reads(block_size, tokens):
    problem = random_problem([70, 0, 129, 33], block_size=block_size, seed=block_size)
    q, kv_cache, _, context_lens, block_tables, max_model_len = problem.args
    out = page_read(kv_cache, context_lens, block_tables, max_model_len, tokens=tokens)
    assert torch.equal(out.cpu(), page_read_reference(kv_cache, context_lens, block_tables, max_model_len,
                                                      tokens=tokens).cpu())
    read = -(-70 // tokens)  # programs that read some of sequence 0's 70 positions
    assert (out[0, :read] != 0).all() and (out[0, read:] == 0).all() and (out[1] == 0).all()
    # One flipped byte in a page the call reads changes its program's word, and only that one.
    corrupted = kv_cache.clone()
    page = int(block_tables[2, 100 // block_size])
    corrupted[page, 100 % block_size, 0, 5] ^= 0x10
    changed = page_read(corrupted, context_lens, block_tables, max_model_len, tokens=tokens) != out
    expected = torch.zeros_like(changed)
    expected[2, 100 // tokens] = True
    assert torch.equal(changed, expected)


def test_contiguous_block_tables_deal_consecutive_pages():
    tables = contiguous_block_tables([2, 0, 3], width=4)
    assert tables.tolist() == [[0, 1, 0, 0], [0, 0, 0, 0], [2, 3, 4, 0]]


def test_ids_outside_the_cache_and_lengths_past_the_table_read_nothing():
    problem = random_problem([40, 50], block_size=16, seed=3)
    _, kv_cache, _, context_lens, block_tables, max_model_len = problem.args
    tables = block_tables.clone()
    tables[0, 1] = kv_cache.shape[0] + 5   # past the cache
    tables[1, 0] = -3
    lens = torch.tensor([40, 10**6], dtype=torch.int32, device=context_lens.device)  # past its row of the table
    out = page_read(kv_cache, lens, tables, max_model_len, tokens=16)
    assert torch.equal(out.cpu(), page_read_reference(kv_cache, lens, tables, max_model_len, tokens=16).cpu())
    assert out[0, 1] == 0 and out[1, 0] == 0 and (out[0, [0, 2]] != 0).all()  # programs of the bad ids read nothing


def test_page_read_stops_at_max_model_len():
    """A call's output row ends at max_model_len, so a context past it (which the logits call's value checks refuse)
    is read only that far, not to the end of its last program's positions."""
    problem = random_problem([40, 20], block_size=16, seed=5)
    _, kv_cache, _, context_lens, block_tables, _ = problem.args
    out = page_read(kv_cache, context_lens, block_tables, 23, tokens=16)
    assert torch.equal(out, page_read_reference(kv_cache, context_lens, block_tables, 23, tokens=16))
    cut = torch.tensor([23, 20], dtype=torch.int32, device=context_lens.device)
    assert torch.equal(out, page_read(kv_cache, cut, block_tables, 23, tokens=16))
    assert not torch.equal(out, page_read(kv_cache, context_lens, block_tables, 32, tokens=16)[:, :2])


@pytest.mark.parametrize("case, error, message", [
    ("kv_cache", TypeError, "kv_cache must be a uint8 tensor, got torch.float32"),
    ("head_dim", ValueError, r"kv_cache must hold head_dim 128 \(132-byte tokens\), got 64"),
    ("context_lens", TypeError, "context_lens must be an int32 tensor, got torch.int64"),
    ("context_lens_list", TypeError, "context_lens must be an int32 tensor, got list"),
    ("context_lens_2d", ValueError, r"context_lens must be \[B\], got \[1, 1\]"),
    ("block_tables", ValueError, r"block_tables must be \[B=1, width\], got \[2, \d+\]"),
    ("context_lens_meta", ValueError, r"context_lens and block_tables must be on kv_cache's device (cpu|cuda)"),
    ("block_tables_meta", ValueError, r"context_lens and block_tables must be on kv_cache's device (cpu|cuda)"),
    ("max_model_len", ValueError, "max_model_len must be a positive int, got 0"),
    ("max_model_len_float", TypeError, "max_model_len must be a positive int, got float 23.0"),
    ("max_model_len_str", TypeError, "max_model_len must be a positive int, got str '23'"),
    ("tokens", ValueError, "tokens must be a power of two >= 16, got 48"),
    ("tokens_float", TypeError, "tokens must be a positive int, got float 64.0")])
def test_page_read_refuses_what_it_cannot_read(case, error, message):
    problem = random_problem([20], block_size=16, seed=1)
    _, kv_cache, _, context_lens, block_tables, max_model_len = problem.args
    args = {"kv_cache": kv_cache, "context_lens": context_lens, "block_tables": block_tables,
            "max_model_len": max_model_len, "tokens": 64}
    name, value = {"kv_cache": ("kv_cache", kv_cache.float()),
                   "head_dim": ("kv_cache", kv_cache[..., 64:].contiguous()),
                   "context_lens": ("context_lens", context_lens.long()),
                   "context_lens_list": ("context_lens", [20]),
                   "context_lens_2d": ("context_lens", context_lens[:, None]),
                   "block_tables": ("block_tables", torch.cat([block_tables, block_tables])),
                   "context_lens_meta": ("context_lens", context_lens.to("meta")),
                   "block_tables_meta": ("block_tables", block_tables.to("meta")),
                   "max_model_len": ("max_model_len", 0), "max_model_len_float": ("max_model_len", 23.0),
                   "max_model_len_str": ("max_model_len", "23"),
                   "tokens": ("tokens", 48), "tokens_float": ("tokens", 64.0)}[case]
    args[name] = value
    with pytest.raises(error, match=message):
        page_read(**args)


@pytest.mark.skipif(not device.INTERPRETED, reason="runs the script on the CPU with its GPU timer stubbed")
def test_page_read_script_records_floor_and_kernel_on_every_cache(load_benchmark, tmp_path, monkeypatch):
    script = load_benchmark("page_read")
    monkeypatch.setattr(timing, "time_ms", lambda fn, graph=True, clean_l2=False: 0.5)
    monkeypatch.setattr(timing, "copy_bandwidth", lambda: 4e12)
    monkeypatch.setattr(benchmark, "REPEATS", 2)
    monkeypatch.setattr(script, "SHAPES", (Shape(2, 1, 100),))
    record = script.main(str(tmp_path / "page-read.json"))
    assert [r["cache"] for r in record["rows"]] == list(script.CACHES)
    for r in record["rows"]:
        assert r["floor_us"] == r["kernel_us"] == 500.0 and r["kernel_meets_contract"]
        assert set(r["floor_all_us"]) == {f"{t}x{w}" for t, w in script.LAUNCHES}
        assert r["page_bytes"] % 132 == 0 and r["page_bytes"] > 0
    assert json.loads((tmp_path / "page-read.json").read_text())["rows"] == record["rows"]


def test_xor_fold_xors_the_last_dimension_sign_bit_included():
    words = torch.tensor([[-1, 1, 2, 2**30], [7, 3, 5, 9]], dtype=torch.int32)
    assert xor_fold(words).tolist() == [-1 ^ 1 ^ 2 ^ 2**30, 7 ^ 3 ^ 5 ^ 9]
    assert xor_fold(words[:, :3]).tolist() == [-1 ^ 1 ^ 2, 7 ^ 3 ^ 5]  # an odd length
    assert xor_fold(words[:, :0]).tolist() == [0, 0]


def test_xor_groups_xor_runs_of_words():
    words = torch.tensor([[1, 2, 4, 8, 16]], dtype=torch.int32)
    assert xor_groups(words, 2).tolist() == [[3, 12, 16]] and xor_groups(words, 8).tolist() == [[31]]
    assert xor_groups(words[0, :0], 4).tolist() == []  # nothing read: no group
