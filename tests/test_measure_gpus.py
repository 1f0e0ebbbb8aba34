"""Where the nccl backend's ranks run: the placement of ranks on GPUs, the note where they share
one, and the refusal without CUDA (all without a GPU)."""

from __future__ import annotations

import pytest

from stragglar.errors import InputError
from stragglar.measure.gpus import check_cuda, placement, sharing_note

torch = pytest.importorskip("torch")


@pytest.mark.parametrize(("world", "gpus"), [(4, 1), (4, 4), (8, 2), (3, 8), (5, 3)])
def test_rank_r_runs_on_gpu_r_mod_the_gpu_count(world: int, gpus: int) -> None:
    assert [placement(r, world, gpus).device for r in range(world)] == [r % gpus for r in range(world)]


@pytest.mark.parametrize(("world", "gpus"), [(4, 4), (3, 8), (2, 2)])
def test_ranks_with_a_gpu_each_keep_their_environment(world: int, gpus: int) -> None:
    assert all(placement(r, world, gpus).env == {} for r in range(world))
    assert sharing_note(world, gpus) is None


@pytest.mark.parametrize(("world", "gpus"), [(4, 1), (8, 2), (5, 3)])
def test_ranks_that_share_gpus_are_separate_hosts_on_the_loopback(world: int, gpus: int) -> None:
    """NCCL refuses two ranks of one host on one GPU: every rank gets a host id of its own."""
    envs = [placement(r, world, gpus).env for r in range(world)]
    assert len({env["NCCL_HOSTID"] for env in envs}) == world
    assert all(env["NCCL_SOCKET_IFNAME"] == "lo" for env in envs)
    note = sharing_note(world, gpus)
    assert note is not None and "\n" not in note
    for words in (f"the {gpus} GPU", "socket transport", "indicative"):
        assert words in note, note


@pytest.mark.parametrize(("rank", "world", "gpus"), [(4, 4, 1), (-1, 4, 1), (0, 4, 0)])
def test_there_is_no_placement_outside_the_ranks_or_without_gpus(rank: int, world: int, gpus: int) -> None:
    with pytest.raises(ValueError, match="no placement"):
        placement(rank, world, gpus)


@pytest.mark.parametrize("backend", ["nccl", "device"])
def test_without_cuda_a_gpu_backend_is_refused_in_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(InputError) as info:
        check_cuda(backend)
    assert str(info.value) == (
        f"the {backend} backend needs CUDA GPUs: torch sees none (torch.cuda.device_count() is 0)"
    )


def test_with_cuda_the_nccl_backend_gets_the_gpu_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert check_cuda("nccl") == 3
