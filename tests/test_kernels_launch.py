from unittest import mock

import pytest
from hypothesis import given, strategies as st

from preshuffle import device, report
from preshuffle.kernels import LaunchConfig
from preshuffle.kernels import launch


def cdiv(a, b):
    return -(-a // b)


def test_launch_config_validation():
    with pytest.raises(ValueError, match="chunk must be a power of two"):
        LaunchConfig(chunk=48)
    with pytest.raises(ValueError, match="tokens_per_program must be a positive multiple"):
        LaunchConfig(chunk=64, tokens_per_program=100)
    with pytest.raises(ValueError, match="dot must be one of"):
        LaunchConfig(dot="tf32")


@pytest.mark.parametrize("fields, exc, message", [
    # Accepted before: Triton was handed -3 warps or no stage at all.
    (dict(num_warps=-3), ValueError, "num_warps must be a positive int, got -3"),
    (dict(num_warps=6), ValueError, r"num_warps must be a power of two in \[1, 32\], got 6"),
    (dict(num_warps=64), ValueError, r"num_warps must be a power of two in \[1, 32\], got 64"),
    (dict(num_stages=0), ValueError, "num_stages must be a positive int, got 0"),
    (dict(num_stages=2.0), TypeError, "num_stages must be a positive int, got float 2.0"),
    # A raw TypeError from `64.0 & 63` before.
    (dict(chunk=64.0), TypeError, "chunk must be a positive int, got float 64.0"),
    (dict(tokens_per_program=128.0), TypeError, "tokens_per_program must be a positive int, got float 128.0"),
    (dict(tokens_per_program=-64), ValueError, "tokens_per_program must be a positive int, got -64"),
])
def test_launch_config_refuses_what_triton_cannot_launch(fields, exc, message):
    with pytest.raises(exc, match=f"^{message}$"):
        LaunchConfig(**fields)


@pytest.mark.parametrize("fields, exc, message", [
    (dict(splits=2.0), TypeError, "splits must be a positive int, got float 2.0"),
    (dict(splits=2, stages=4.0), TypeError, "stages must be a positive int, got float 4.0"),
    (dict(splits=2, maxnreg=80.0), TypeError, "maxnreg must be a positive int, got float 80.0"),
    (dict(splits=2, row_warpgroups="yes"), TypeError, "row_warpgroups must be a bool, got str 'yes'"),
])
def test_hopper_config_names_a_field_of_the_wrong_type(fields, exc, message):
    with pytest.raises(exc, match=f"^{message}$"):
        launch.HopperConfig(**fields)


def _portable_sweep():
    """results/h200-portable-703f0c9.json's fp16 rows of block 64, natural layout (what the rule was tuned on:
    docs/kernel-design.md, "Split across the SMs"), by shape, each timed at 1, 2, 4, 8 and 16 programs per SM; and
    the GPU's SMs."""
    record = report.load(report.RESULTS / "h200-portable-703f0c9.json")
    shapes = {}
    for r in record["rows"]:
        if r["kind"] == "kernel" and r["variant"] == "block64-normal":
            assert r["meets_rtol"] and r["same_inf_pattern"], r  # timed only once checked
            s = r["shape"]
            shapes.setdefault((s["batch"], s["next_n"], s["avg_ctx"]), []).append(r)
    assert len(shapes) == 8 and all(sorted(r["programs_per_sm"] for r in rows) == [1, 2, 4, 8, 16]
                                    for rows in shapes.values())
    return shapes, record["provenance"]["sms"]


# docs/kernel-design.md: 4 programs an SM "best or within 3% for batches of 64 or fewer, 16 for 128-256". The final
# sweep bears that out on six of its eight shapes; on these two the rule is further off its fastest split, which the
# test records rather than hides (B=1 ctx 128K: 2 per SM is 4.8% faster; B=64 next_n=2: 8 per SM is 10.8% faster).
FURTHER_OFF = {(1, 1, 131072): 1.05, (64, 2, 8192): 1.11}


def test_the_portable_rule_is_the_committed_sweeps_fastest_split_or_close(monkeypatch):
    shapes, sms = _portable_sweep()
    monkeypatch.setattr(launch, "multiprocessor_count", lambda: sms)
    for (batch, next_n, ctx), rows in shapes.items():
        rule = launch.default_programs_per_sm(batch)
        # The launch the sweep marked as the rule's is today's rule, with its compiled configuration.
        [marked] = [r for r in rows if r["rule"]]
        assert marked["programs_per_sm"] == rule, (batch, next_n, ctx)
        config = launch.config_for(batch)
        assert {k: marked["config"][k] for k in ("chunk", "num_warps", "num_stages", "dot")} == \
            {"chunk": config.chunk, "num_warps": config.num_warps, "num_stages": config.num_stages, "dot": config.dot}
        fastest = min(r["us"] for r in rows)
        mine = marked["us"] / fastest
        bound = FURTHER_OFF.get((batch, next_n, ctx), 1.03)
        assert mine <= bound, (batch, next_n, ctx, rule, mine)
        if bound > 1.03:  # still an exception: the list must not outlive what it records
            assert mine > 1.03, (batch, next_n, ctx, mine)


def _splits(sms, batch, programs_per_sm):
    with mock.patch.object(launch, "multiprocessor_count", return_value=sms):
        return launch.splits_for(batch, programs_per_sm)


@given(batch=st.integers(1, 8192), programs_per_sm=st.integers(1, 32), sms=st.sampled_from([1, 16, 78, 108, 132, 144]))
def test_splits_for_asks_about_the_programs_per_sm_given(batch, programs_per_sm, sms):
    splits = _splits(sms, batch, programs_per_sm)
    asked = programs_per_sm * sms
    # The fewest programs a sequence that reach the programs asked for, and one a sequence once the batch does.
    assert splits >= 1 and batch * splits >= asked
    assert splits == 1 or batch * (splits - 1) < asked


@given(batch=st.integers(1, 8192))
def test_splits_for_gives_more_programs_per_sm_no_fewer_programs(batch):
    splits = [_splits(132, batch, pps) for pps in (1, 2, 4, 8, 16)]
    assert splits == sorted(splits)


@pytest.mark.parametrize("args, exc, message", [
    ((0, 2), ValueError, "batch must be a positive int, got 0"), ((64, 2.0), TypeError,
                                                                  "programs_per_sm must be a positive int, got float"),
])
def test_splits_for_names_a_bad_argument(args, exc, message):
    with pytest.raises(exc, match=message):
        launch.splits_for(*args)


@given(max_model_len=st.integers(1, 300_000), splits=st.integers(1, 600), chunk=st.sampled_from([16, 32, 64, 128]))
def test_fixed_run_cuts_a_row_into_at_most_splits_runs_of_whole_chunks(max_model_len, splits, chunk):
    run = launch.fixed_run(max_model_len, splits, chunk)
    chunks = cdiv(max_model_len, chunk)
    assert run % chunk == 0 and chunk <= run <= chunks * chunk
    programs = cdiv(max_model_len, run)
    # Every position in exactly one run, none of them empty, and no more runs than splits ...
    assert (programs - 1) * run < max_model_len <= programs * run and programs <= splits
    # ... with the shortest run that keeps to that.
    if run > chunk:
        assert cdiv(max_model_len, run - chunk) > splits
    assert launch.fixed_run(max_model_len, 1, chunk) == launch.whole_row(max_model_len, chunk)


@given(batch=st.integers(1, 8192), programs_per_sm=st.integers(1, 32))
def test_config_for_splits_at_the_rule_in_the_tuned_configuration(batch, programs_per_sm):
    with mock.patch.object(launch, "multiprocessor_count", return_value=132):
        config = launch.config_for(batch)
        assert config.splits == launch.splits_for(batch, launch.default_programs_per_sm(batch))
        asked = launch.config_for(batch, programs_per_sm=programs_per_sm)
        assert asked.splits == launch.splits_for(batch, programs_per_sm) and asked.tokens_per_program is None
        assert launch.config_for(batch, dot="fp8").dot == "fp8"
    # Its chunk, warps, stages and MMA are the ones the committed sweep timed (checked above against its rows).
    assert (asked.chunk, asked.num_warps, asked.num_stages, asked.dot) == \
        (config.chunk, config.num_warps, config.num_stages, config.dot)


@pytest.mark.skipif(not device.INTERPRETED, reason="the interpreter's rule")
@given(batch=st.integers(1, 4096))
def test_default_config_gives_each_sequence_one_program_under_the_interpreter(batch):
    config = launch.default_config(batch)
    assert (config.chunk, config.splits, config.tokens_per_program) == (64, 1, None)


def test_launch_config_takes_one_kind_of_split():
    with pytest.raises(ValueError, match=r"give splits or tokens_per_program, not both \(got 2 and 128\)"):
        LaunchConfig(64, 128, splits=2)
    with pytest.raises(ValueError, match="splits must be a positive int, got 0"):
        LaunchConfig(splits=0)
