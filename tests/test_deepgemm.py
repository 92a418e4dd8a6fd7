"""The DeepGEMM adapter on the CPU: which build a process imported, which problems each build refuses, what it hands
DeepGEMM (through a stand-in module that records its arguments), the flattened next_n = 1 problem, and the masking
of unwritten positions."""

import importlib.metadata
import types
from pathlib import Path

import pytest
import torch

from preshuffle import deepgemm
from preshuffle.contract import kv_lengths
from preshuffle.reference import reference_and_magnitude
from preshuffle.testing.inputs import random_problem
from preshuffle.testing.numeric import check_logits, compare_logits


def problem_of(**kwargs):
    spec = dict(block_size=64, heads=32, seed=5, device="cpu")
    return random_problem([70, 130, 3], **{**spec, **kwargs})


@pytest.mark.parametrize("kwargs, reason", [
    (dict(block_size=16), "block size 16 normal: DeepGEMM takes 64-token natural blocks"),
    (dict(layout="shuffle"), "block size 64 shuffle: DeepGEMM takes 64-token natural blocks"),
    (dict(next_n=3), "next_n 3, 32 heads: its SM90 kernel takes next_n 1-2, 32 or 64 heads"),
    (dict(heads=16), "next_n 1, 16 heads: its SM90 kernel takes next_n 1-2, 32 or 64 heads"),
    (dict(next_n=2, ctx_2d=True), "2-D context lengths (this adapter takes 1-D)"),
])
def test_refusal_names_what_deepgemm_cannot_take(kwargs, reason):
    assert deepgemm.refusal(problem_of(**kwargs)) == reason
    with pytest.raises(ValueError, match=r"DeepGEMM cannot take this problem: " + reason.replace("(", r"\(")
                       .replace(")", r"\)")):
        deepgemm.logits_fn(types.SimpleNamespace(), problem_of(**kwargs))


NV_DEV = deepgemm.Build("2.5.0", "nv_dev", "a6b593d", "build folder")


@pytest.mark.parametrize("kwargs, reason", [
    (dict(block_size=16), "block size 16 normal: DeepGEMM takes 32 or 64-token natural blocks"),
    (dict(next_n=3), "next_n 3, 32 heads: its SM90 kernel takes next_n 1, 2 or 4, 16, 32 or 64 heads"),
    (dict(heads=128), "next_n 1, 128 heads: its SM90 kernel takes next_n 1, 2 or 4, 16, 32 or 64 heads"),
])
def test_nv_dev_refuses_less(kwargs, reason):
    """nv_dev's SM90 kernel also takes next_n 4, 32-token blocks and 16 heads; main's does not."""
    assert deepgemm.refusal(problem_of(**kwargs), NV_DEV) == reason
    for taken in (dict(next_n=4), dict(block_size=32), dict(heads=16), dict(next_n=2, block_size=32, heads=16)):
        assert deepgemm.refusal(problem_of(**taken), NV_DEV) is None, taken
        assert deepgemm.refusal(problem_of(**taken)) is not None, taken


def test_build_info_reads_the_environment_then_the_build_folder(monkeypatch, tmp_path):
    for name in ("PRESHUFFLE_DEEPGEMM_BRANCH", "PRESHUFFLE_DEEPGEMM_COMMIT"):
        monkeypatch.delenv(name, raising=False)
    package = tmp_path / "deepgemm-nvdev-a6b593d" / "DeepGEMM" / "deep_gemm"
    package.mkdir(parents=True)
    module = types.SimpleNamespace(__version__="2.5.0", __file__=str(package / "__init__.py"))
    assert deepgemm.build_info(module) == NV_DEV
    main = tmp_path / "deepgemm-54e2261" / "DeepGEMM" / "deep_gemm"
    main.mkdir(parents=True)
    built = deepgemm.build_info(types.SimpleNamespace(__version__="2.6.1", __file__=str(main / "__init__.py")))
    assert (built.branch, built.commit, built.source, built.label) == ("main", "54e2261", "build folder",
                                                                        "main 54e2261 (2.6.1)")
    elsewhere = types.SimpleNamespace(__file__=str(Path(tmp_path, "site", "deep_gemm.py")))
    monkeypatch.setattr(importlib.metadata, "version", lambda name: {"deep_gemm": "2.6.1+54e2261"}[name])
    installed = deepgemm.build_info(elsewhere)
    assert (installed.branch, installed.commit, installed.source) == (None, "54e2261", "package version")

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    unknown = deepgemm.build_info(elsewhere)
    assert (unknown.version, unknown.branch, unknown.commit, unknown.source) == (None, None, None, "unknown")
    assert unknown.next_n == deepgemm.MAIN.next_n and unknown.label == "of unknown branch"
    monkeypatch.setenv("PRESHUFFLE_DEEPGEMM_BRANCH", "nv_dev")
    monkeypatch.setenv("PRESHUFFLE_DEEPGEMM_COMMIT", "8b1392b")
    named = deepgemm.build_info(module)
    assert (named.branch, named.commit, named.source) == ("nv_dev", "8b1392b", "environment")
    assert named.as_dict() == {"version": "2.5.0", "branch": "nv_dev", "commit": "8b1392b", "source": "environment"}


def recording_deepgemm(seen: dict, sms: int = 132):
    """A stand-in ``deep_gemm`` that records what the adapter hands it."""
    def metadata(visible, block_size, slots):
        seen["metadata"] = (visible.clone(), block_size, slots)
        return "schedule"

    def logits(q_pair, kv_cache, weights, visible, block_tables, schedule, max_model_len, clean, *, logits_dtype):
        seen["call"] = (q_pair, kv_cache, weights, visible, block_tables, schedule, max_model_len, clean)
        seen["logits_dtype"] = logits_dtype
        return "logits"

    return types.SimpleNamespace(get_paged_mqa_logits_metadata=metadata, get_num_sms=lambda: sms,
                                 fp8_fp4_paged_mqa_logits=logits)


@pytest.mark.parametrize("next_n", [1, 2])
@pytest.mark.parametrize("logits_dtype", [torch.float32, torch.bfloat16])
def test_logits_fn_passes_each_row_its_visible_length_and_the_schedule(next_n, logits_dtype):
    problem = problem_of(next_n=next_n)
    assert deepgemm.refusal(problem) is None
    seen = {}
    fn = deepgemm.logits_fn(recording_deepgemm(seen), problem, deepgemm.MAIN, logits_dtype)
    visible, block_size, sms = seen["metadata"]
    lens = problem.context_lens.tolist()
    assert visible.dtype == torch.int32 and visible.is_contiguous()
    assert visible.tolist() == [[n - next_n + j + 1 for j in range(next_n)] for n in lens]
    assert (block_size, sms) == (64, 132)
    assert fn() == "logits"
    q_pair, kv_cache, weights, passed, block_tables, schedule, max_model_len, clean = seen["call"]
    assert q_pair[0] is problem.q and q_pair[1] is None and kv_cache is problem.kv_cache
    assert weights is problem.weights and block_tables is problem.block_tables
    assert torch.equal(passed, visible) and schedule == "schedule"
    assert max_model_len == problem.max_model_len and clean is False and seen["logits_dtype"] == logits_dtype


@pytest.mark.parametrize("next_n, slots", [(1, 132), (2, 132), (4, 66)])
def test_nv_dev_schedules_next_n_4_over_clusters_of_two_sms(next_n, slots):
    """vLLM passes nv_dev get_num_sms() // 2 scheduler slots at next_n = 4, where each task is a cluster of two
    CTAs; one slot an SM elsewhere."""
    seen = {}
    deepgemm.logits_fn(recording_deepgemm(seen), problem_of(next_n=next_n), NV_DEV)
    assert seen["metadata"][2] == slots == NV_DEV.schedule_slots(132, next_n)
    assert deepgemm.MAIN.schedule_slots(132, next_n) == 132


def test_logits_fn_reads_the_build_of_the_module_it_is_given(monkeypatch, tmp_path):
    for name in ("PRESHUFFLE_DEEPGEMM_BRANCH", "PRESHUFFLE_DEEPGEMM_COMMIT"):
        monkeypatch.delenv(name, raising=False)
    seen = {}
    module = recording_deepgemm(seen)
    with pytest.raises(ValueError, match="next_n 4, 32 heads: its SM90 kernel takes next_n 1-2"):
        deepgemm.logits_fn(module, problem_of(next_n=4))     # a build of unknown branch is taken for main
    package = tmp_path / "deepgemm-nvdev-a6b593d" / "DeepGEMM" / "deep_gemm"
    package.mkdir(parents=True)
    module.__file__ = str(package / "__init__.py")
    deepgemm.logits_fn(module, problem_of(next_n=4))
    assert seen["metadata"][2] == 66


@pytest.mark.parametrize("next_n", [2, 3])
def test_flattened_rows_have_the_original_logits(next_n):
    problem = problem_of(next_n=next_n, heads=16)
    flat = deepgemm.flattened(problem)
    assert (flat.batch, flat.next_n) == (problem.batch * next_n, 1)
    assert flat.context_lens.tolist() == kv_lengths(problem.context_lens, next_n).reshape(-1).tolist()
    ref, magnitude = problem.call(reference_and_magnitude)
    verdict = compare_logits(flat.call(reference_and_magnitude)[0], ref, magnitude)
    assert verdict["same_inf_pattern"] and verdict["max_rel_error"] == 0.0 and verdict["finite"] > 0


def test_masked_like_sets_only_the_reference_masked_positions():
    problem = problem_of(next_n=2)
    ref, _ = problem.call(reference_and_magnitude)
    garbage = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float32)
    written = torch.where(torch.isneginf(ref), garbage, ref.float())
    assert not check_logits(written, problem)["same_inf_pattern"]
    masked = deepgemm.masked_like(written, ref)
    assert masked.dtype == torch.float32 and torch.equal(torch.isneginf(masked), torch.isneginf(ref))
    assert torch.equal(masked[torch.isfinite(ref)], written[torch.isfinite(ref)])


def test_api_call_calls_any_module_of_deepgemms_api_as_vllm_does():
    """On this package's DeepGEMM-compatible module: each row its visible length as [B, next_n], the schedule built
    once, the module's own keywords passed through (here, preshuffled pages)."""
    from preshuffle import deepgemm_compat, device
    from preshuffle.kernels import fp8_paged_mqa_logits

    problem = random_problem([70, 130, 3], next_n=3, block_size=16, layout="shuffle", heads=16, seed=5,
                             device=device.KERNEL_DEVICE)
    out = deepgemm.api_call(deepgemm_compat, problem, 4, torch.bfloat16, True, layout="shuffle")()
    expected = problem.call(fp8_paged_mqa_logits, precision="fp8", logits_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16 and torch.equal(out, expected)
