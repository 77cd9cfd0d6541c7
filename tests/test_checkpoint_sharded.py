"""Chapter 9: FSDP2 state saved with torch.distributed.checkpoint, resumed resharded.

Saved on 4 ranks and loaded on 2 (and saved on 2, loaded on 4): the loaded
model and Adam state equal, bit for bit, the whole unsharded state gathered
at save time, and training on from it stays bit-identical to a resume from
that unsharded state. Each rank wrote its own shard file.
"""

import os

import pytest

from mylib import run_ranks
from mylib.experiments import checkpoint_sharded as cs


@pytest.mark.parametrize("saved_on, loaded_on", [(4, 2), (2, 4)])
def test_a_sharded_checkpoint_resumes_at_another_world_size(
    tmp_path, saved_on, loaded_on
):
    saved = run_ranks(cs.save_both, saved_on, args=(str(tmp_path),), timeout_s=180)
    files = sorted(n for n in os.listdir(tmp_path / "dcp") if n.endswith(".distcp"))
    assert files == [f"__{r}_0.distcp" for r in range(saved_on)]
    assert all(s["bytes"] > 0 for s in saved)
    # The shards hold about the whole state between them (params + 2 Adam moments).
    whole = sum(s["bytes"] for s in saved)
    assert 0.9 < whole / os.path.getsize(tmp_path / "full.pt") < 1.1
    resumed = run_ranks(cs.resume_both, loaded_on, args=(str(tmp_path),), timeout_s=180)
    for r in resumed:
        assert r["loaded_equal"], "the resharded state differs from the saved one"
        assert r["resumed_equal"] and r["max_diff"] == 0.0


def _zero1_state(path, load):
    """ZeRO-1 (mylib.ShardedOptimizer) at this world size: save or load-and-return."""
    import torch
    import torch.distributed as dist

    from mylib import ShardedOptimizer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3))
    opt = ShardedOptimizer(
        model.parameters(), torch.optim.Adam, average_gradients=True, lr=0.01
    )
    if load:
        opt.load_state_dict(torch.load(path, weights_only=False))
    else:
        for step in range(2):
            x = torch.randn(8, 5, generator=torch.Generator().manual_seed(step))
            rows = x.chunk(dist.get_world_size())[dist.get_rank()]
            model(rows).square().mean().backward()
            opt.step()
            opt.zero_grad()
    opt.consolidate_state_dict(to=0)  # every rank takes part
    if dist.get_rank() == 0:
        if not load:
            torch.save(opt.state_dict(), path)
        return opt.state_dict()
    return None


def test_mylib_zero1_reshards_only_through_the_whole_state(tmp_path):
    # 7 * 5 + 7 + 3 * 7 + 3 = 66 elements: shards of 17 on 4 ranks, 33 on 2.
    path = str(tmp_path / "zero1.pt")
    saved = run_ranks(_zero1_state, 4, args=(path, False), timeout_s=120)[0]
    loaded = run_ranks(_zero1_state, 2, args=(path, True), timeout_s=120)[0]
    from mylib.experiments.run_events import same_state

    assert same_state(saved, loaded)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_a_folder_without_its_metadata_does_not_load(tmp_path):
    """DCP writes ``.metadata`` after every shard: without it, loading fails.

    Chapter 9 calls it the commit marker. A save that died before its last
    write leaves the shards and no ``.metadata``; ``dcp.load`` then raises
    (``FileSystemReader.read_metadata`` finds no file) and reads nothing.
    """
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    saved = {"w": torch.arange(6.0)}
    dcp.save(saved, checkpoint_id=tmp_path, no_dist=True)
    whole = {"w": torch.zeros(6)}
    dcp.load(whole, checkpoint_id=tmp_path, no_dist=True)
    assert torch.equal(whole["w"], saved["w"])  # complete: it loads
    (tmp_path / ".metadata").unlink()  # the save died before its last write
    assert any(p.suffix == ".distcp" for p in tmp_path.iterdir())  # shards remain
    target = {"w": torch.zeros(6)}
    with pytest.raises(CheckpointException, match="metadata is None"):
        dcp.load(target, checkpoint_id=tmp_path, no_dist=True)
    assert torch.equal(target["w"], torch.zeros(6))  # nothing was read
