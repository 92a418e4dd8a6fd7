import pytest
import torch

from preshuffle.topk import radix as topk_radix
from preshuffle.topk.selection import topk_reference

PASSES = ("load and count", "threshold", "scatter", "candidates")


def _row(kind: str, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "ranked":      # a bucket of a few dozen candidates, ranked against each other
        return torch.randn(20000, generator=g)
    if kind == "list level":  # more than the ranking limit: a radix level over the list first
        return torch.randn(131072, generator=g)
    ties = torch.full((6000,), 0.25)  # the bucket is larger than the list: the slow path over the row
    ties[torch.randperm(6000, generator=g)[:700]] = 1.0 + torch.rand(700, generator=g)
    return ties


@pytest.mark.parametrize("kind, level", [("ranked", None), ("list level", "list"), ("row level", "row")])
def test_pass_checks_hold_on_every_path_of_fresh_rows(kind, level):
    checks = topk_radix.pass_checks(_row(kind, seed=hash(kind) % 1000), 2048)
    assert all(checks[p] for p in PASSES), checks
    assert [lv[0] for lv in checks["trace"].levels][:1] == ([level] if level else [])


def test_pass_checks_fail_where_a_pass_is_wrong(monkeypatch):
    x = _row("ranked", seed=3)
    real = topk_radix.threshold
    monkeypatch.setattr(topk_radix, "threshold", lambda hist, need: (real(hist, need)[0] + 1, *real(hist, need)[1:]))
    checks = topk_radix.pass_checks(x, 2048)
    assert not checks["threshold"] and not checks["candidates"]
    monkeypatch.setattr(topk_radix, "threshold", real)
    keys = topk_radix.fp16_keys
    monkeypatch.setattr(topk_radix, "fp16_keys", lambda v: 0xFFFF - keys(v))  # keys in the reverse order
    assert not topk_radix.pass_checks(x, 2048)["load and count"]
    monkeypatch.setattr(topk_radix, "fp16_keys", keys)
    select = topk_radix.select
    monkeypatch.setattr(topk_radix, "select", lambda *a, **kw: (set(sorted(select(*a, **kw)[0])[1:]), select(*a, **kw)[1]))
    checks = topk_radix.pass_checks(x, 2048)
    assert checks["scatter"] and not checks["candidates"]


def test_pass_checks_refuse_a_row_that_selects_everything():
    with pytest.raises(ValueError, match="selects them all"):
        topk_radix.pass_checks(torch.randn(100), 2048)


def test_select_keeps_the_float64_reference_with_nan_and_signed_zero():
    x = torch.randn(9000, generator=torch.Generator().manual_seed(5))
    x[[3, 50, 700]] = float("nan")
    x[[4, 5]] = torch.tensor([-0.0, 0.0])
    got, _ = topk_radix.select(x, 2048)
    assert got == set(topk_reference(x[None], torch.tensor([9000], dtype=torch.int32), 2048)[0].tolist())
