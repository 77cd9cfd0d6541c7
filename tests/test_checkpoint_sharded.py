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
