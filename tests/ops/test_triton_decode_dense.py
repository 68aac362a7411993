"""The dense decode kernel (nsa/ops/triton/decode_dense.py) against the dense step's SDPA.

The oracle is what ``DenseCache.step`` computes without the kernel: the query attends to
keys ``<= pos`` under a boolean mask, ``F.scaled_dot_product_attention`` with GQA. CPU
interpreter, fp32, relative error <= 1e-5 (kernel_testlib.TOL); on a GPU also bf16 and a
CUDA graph.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nsa.ops.triton import decode_dense as DD
from nsa.ops.triton.decode_flash import decode_tickets
from nsa.syncs import HostSyncs
from tests.ops.kernel_testlib import TOL, fresh_seed, rel_err


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """The dense step's attention: ``q [B,1,H,D]`` over ``k, v [B,S,G,D]``, keys ``<= pos``."""
    mask = (torch.arange(k.shape[1], device=k.device)[None, :] <= pos[:, None])[:, None, None, :]
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       attn_mask=mask, enable_gqa=k.shape[2] != q.shape[2])
    return o.transpose(1, 2)


def _case(B: int, S: int, H: int, G: int, D: int, device: str = "cpu", dtype: torch.dtype = torch.float32
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q = (2 * torch.randn(B, 1, H, D)).to(device, dtype)
    k = torch.randn(B, S, G, D).to(device, dtype)
    v = torch.randn(B, S, G, D).to(device, dtype)
    return q, k, v


@pytest.mark.parametrize("splits", [1, 3, 8, DD.MAX_FUSED_SLOTS + 1])
@pytest.mark.parametrize("B,S,H,G,D", [(3, 200, 4, 1, 16), (2, 130, 8, 2, 32), (1, 64, 3, 3, 24)])
def test_equals_the_steps_sdpa(B: int, S: int, H: int, G: int, D: int, splits: int) -> None:
    """Every position from the first key to past the capacity (all S keys), several heads per
    group, one head per group, head dims not a power of two, chunks that hold no key; the
    partials merged by the launch's last program (3, 8 splits) or by a merge launch (17)."""
    seed = fresh_seed()
    q, k, v = _case(B, S, H, G, D)
    for p in (0, 1, 63, 64, S // 2, S - 1, S + 5):
        pos = torch.tensor([min(p + b, S + 5) for b in range(B)])
        got = DD.dense_decode(q, k, v, pos, splits=splits)
        want = _sdpa(q, k, v, pos)
        assert got.shape == want.shape and got.dtype == q.dtype
        assert rel_err(got, want) <= TOL, f"seed={seed} pos={pos.tolist()} splits={splits}"


def test_batch_of_different_positions_and_strided_query() -> None:
    """Each sequence sees only its own keys; a query that is a view of a wider projection (as
    the step's is) is read through its strides."""
    seed = fresh_seed()
    B, S, H, G, D = 4, 300, 4, 2, 16
    _, k, v = _case(B, S, H, G, D)
    wide = torch.randn(B, 1, H * D + 40)
    q = wide[..., :H * D].view(B, 1, H, D)
    pos = torch.tensor([0, 77, 299, 150])
    got = DD.dense_decode(q, k, v, pos, splits=4)
    assert rel_err(got, _sdpa(q, k, v, pos)) <= TOL, f"seed={seed}"
    k2 = k.clone()
    k2[1, 78:] = 1e4  # keys past sequence 1's position: unseen
    assert torch.equal(DD.dense_decode(q, k2, v, pos, splits=4)[1], got[1])


class _Launches:
    def __init__(self, name: str, log: list[tuple[str, tuple[int, ...]]]) -> None:
        self.name, self.log = name, log

    def __getitem__(self, grid: tuple[int, ...]):  # noqa: ANN204 - a Triton launcher's shape
        return lambda *args, **kwargs: self.log.append((self.name, grid))


@pytest.mark.parametrize("splits,expected", [
    (1, ["_dense_partials"]), (5, ["_dense_partials"]),
    (DD.MAX_FUSED_SLOTS + 1, ["_dense_partials", "_decode_combine"])])
def test_no_host_sync_and_launches(monkeypatch: pytest.MonkeyPatch, splits: int, expected: list[str]) -> None:
    """Nothing read back from the device, nothing built from host data (a CUDA graph holds
    it): one launch, two when split more ways than the launch merges itself."""
    log: list[tuple[str, tuple[int, ...]]] = []
    for name in ("_dense_partials", "_decode_combine"):
        monkeypatch.setattr(DD, name, _Launches(name, log))
    q, k, v = _case(2, 96, 4, 2, 16)
    pos = torch.tensor([40, 9])
    with HostSyncs() as syncs:
        DD.dense_decode(q, k, v, pos, splits=splits)
    assert not syncs.events, syncs.report()
    assert [name for name, _ in log] == expected
    assert log[0][1] == (4, splits)  # (sequence, group) on axis 0, the split on axis 1


def test_merge_tickets_are_left_zeroed_and_checked() -> None:
    """The caller's counters serve step after step (each launch leaves them zero, or the next
    would merge at the wrong program); counters of the wrong kind are refused by name."""
    seed = fresh_seed()
    q, k, v = _case(3, 200, 8, 2, 16)
    tickets = decode_tickets(3 * 2, q.device)
    for p in (5, 120, 199):
        pos = torch.tensor([p, p // 2, 7])
        got = DD.dense_decode(q, k, v, pos, splits=4, tickets=tickets)
        assert rel_err(got, _sdpa(q, k, v, pos)) <= TOL, f"seed={seed} pos={pos.tolist()}"
        assert torch.equal(tickets, torch.zeros_like(tickets))
    pos = torch.tensor([1, 2, 3])
    for bad in (tickets.long(), tickets[:5], torch.zeros(12, dtype=torch.int32)[::2]):
        with pytest.raises(ValueError, match="want a contiguous int32 vector of at least 6"):
            DD.dense_decode(q, k, v, pos, splits=4, tickets=bad)
    DD.dense_decode(q, k, v, pos, splits=1, tickets=tickets[:1])  # one split merges nothing: unused


def test_plan_and_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    """No split off CUDA; on a GPU splits fill the SMs at small batches, never below the
    minimum keys per program; bad shapes are refused with what is wrong."""
    assert DD.plan_dense_splits(1, 1, 65536, torch.device("cpu")) == 1
    monkeypatch.setattr(DD, "_sm_count", lambda device: 132)
    cuda = torch.device("cuda")
    assert DD.plan_dense_splits(1, 1, 65536, cuda) == 65536 // DD.MIN_DENSE_KEYS
    assert DD.plan_dense_splits(1, 1, 1 << 20, cuda) == 264  # 2 per SM
    assert DD.plan_dense_splits(1, 1, 8192, cuda) == 8192 // DD.MIN_DENSE_KEYS
    assert DD.plan_dense_splits(64, 1, 65536, cuda) == 5
    assert DD.plan_dense_splits(512, 1, 65536, cuda) == 1
    q, k, v = _case(2, 64, 4, 3, 16)
    with pytest.raises(ValueError, match="G dividing H"):
        DD.dense_decode(q, k, v, torch.tensor([1, 2]))
    q, k, v = _case(2, 64, 4, 2, 16)
    with pytest.raises(ValueError, match="one query per sequence"):
        DD.dense_decode(q.expand(2, 2, 4, 16), k, v, torch.tensor([1, 2]))
    with pytest.raises(TypeError, match="not fp64"):
        DD.dense_decode(q.double(), k.double(), v.double(), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="splits must be >= 1"):
        DD.dense_decode(q, k, v, torch.tensor([1, 2]), splits=0)


# ----------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("B,S,H,G", [(1, 8192, 16, 1), (3, 4096, 8, 2), (64, 2048, 16, 1)])
def test_bf16_on_gpu(B: int, S: int, H: int, G: int) -> None:
    """bf16 kernel (planned splits) vs fp32 SDPA on the same bf16-rounded inputs: 1e-2."""
    seed = fresh_seed()
    q, k, v = _case(B, S, H, G, 64, "cuda", torch.bfloat16)
    pos = torch.randint(0, S, (B,), device="cuda")
    got = DD.dense_decode(q, k, v, pos).float()
    want = _sdpa(q.float(), k.float(), v.float(), pos)
    assert rel_err(got, want) <= 1e-2, f"seed={seed}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_replays_the_kernel() -> None:
    """Captured once, a graph replays it with new positions and cache contents."""
    fresh_seed()
    q, k, v = _case(2, 8192, 16, 1, 64, "cuda", torch.bfloat16)
    pos = torch.tensor([100, 5000], device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        DD.dense_decode(q, k, v, pos)  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = DD.dense_decode(q, k, v, pos)
    for _ in range(2):
        pos.copy_(torch.randint(0, 8192, (2,), device="cuda"))
        k.normal_()
        graph.replay()
        assert torch.equal(out, DD.dense_decode(q, k, v, pos))
