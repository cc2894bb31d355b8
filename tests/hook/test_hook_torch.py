"""The torch side of the hook: world-size-independent data order, and checkpoints that restore exactly."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from flexmig import hook  # noqa: E402
from flexmig.hook import torch as torch_hook  # noqa: E402

pytestmark = pytest.mark.torch


@given(
    n=st.integers(1, 200),
    batch=st.integers(1, 64),
    step=st.integers(0, 1000),
    world=st.integers(1, 8),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=60, deadline=None)
def test_rank_shares_partition_the_global_batch_whatever_the_world_size(
    n: int, batch: int, step: int, world: int, seed: int
) -> None:
    g = torch_hook.global_batch_indices(n, batch, step, seed)
    shares = [torch_hook.rank_share(g, r, world) for r in range(world)]
    assert sorted(i for s in shares for i in s) == sorted(g)
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


@given(n=st.integers(1, 100), batch=st.integers(1, 32), seed=st.integers(0, 100))
@settings(max_examples=40, deadline=None)
def test_every_epoch_visits_each_sample_exactly_once(n: int, batch: int, seed: int) -> None:
    stream = [
        i for s in range((3 * n + batch - 1) // batch) for i in torch_hook.global_batch_indices(n, batch, s, seed)
    ]
    for e in range(3):
        assert sorted(stream[e * n : (e + 1) * n]) == list(range(n))


def test_a_job_resumed_under_another_world_size_sees_the_same_samples_at_each_step() -> None:
    before = torch_hook.StepBatchSampler(1000, 32, rank=0, world_size=2, seed=5)
    after = [torch_hook.StepBatchSampler(1000, 32, rank=r, world_size=4, seed=5, start_step=11) for r in range(4)]
    at_11_with_2 = sorted(
        before.indices(11) + torch_hook.StepBatchSampler(1000, 32, rank=1, world_size=2, seed=5).indices(11)
    )
    at_11_with_4 = sorted(i for s in after for i in next(iter(s)))
    assert at_11_with_2 == at_11_with_4 == sorted(torch_hook.global_batch_indices(1000, 32, 11, 5))


def test_sampler_length_counts_the_steps_left() -> None:
    assert len(torch_hook.StepBatchSampler(10, 2, rank=0, world_size=1, start_step=3, steps=10)) == 7
    with pytest.raises(TypeError):
        len(torch_hook.StepBatchSampler(10, 2, rank=0, world_size=1))


def test_checkpoint_restores_model_optimizer_step_and_rng_exactly(tmp_path: Path) -> None:
    h = hook.install({"FLEXMIG_CHECKPOINT_DIR": str(tmp_path)}, handler=False)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    random.seed(9)
    path = torch_hook.save_checkpoint(h, 17, model, opt, extra={"epoch": 2})
    expect_rand = (torch.rand(3), random.random())
    params = [p.detach().clone() for p in model.parameters()]

    torch.manual_seed(123)
    other = torch.nn.Linear(4, 2)
    other_opt = torch.optim.Adam(other.parameters(), lr=0.1)
    state = torch_hook.load_checkpoint(path, other, other_opt)
    assert (state.step, state.world_size, dict(state.extra)) == (17, 1, {"epoch": 2})
    for a, b in zip(params, other.parameters(), strict=True):
        assert torch.equal(a, b)
    assert other_opt.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]
    got_rand = (torch.rand(3), random.random())
    assert torch.equal(got_rand[0], expect_rand[0]) and got_rand[1] == expect_rand[1]
    assert path.name == "step-000000017.pt" and path.stat().st_mode & 0o777 == 0o600


def test_loading_something_that_is_not_our_checkpoint_is_refused(tmp_path: Path) -> None:
    torch.save({"weights": torch.zeros(1)}, tmp_path / "x.pt")
    with pytest.raises(ValueError, match=r"not a flexmig\.torch/1 checkpoint"):
        torch_hook.load_checkpoint(tmp_path / "x.pt", torch.nn.Linear(1, 1))


def test_without_torch_distributed_should_checkpoint_is_the_local_flag(tmp_path: Path) -> None:
    h = hook.install({}, handler=False)
    assert torch_hook.should_checkpoint(h) is False
    h.request()
    assert torch_hook.should_checkpoint(h) is True
