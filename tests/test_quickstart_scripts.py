"""The quick start's scripts run under ``torchrun`` on CPU processes (gloo).

* ``quickstart_torch_ddp.py``, plain PyTorch (``DistributedDataParallel``,
  ``DistributedSampler`` with ``set_epoch``), on 2 processes ends where one
  process ends that trains on the whole global batches, shuffled as
  ``DistributedSampler`` shuffles each epoch; and where the same script ends on
  1 process. Float32 sums in another order: the bound is 1e-6.
* ``quickstart_ddp.py`` (``MyDDP``, ``mylib.init_from_env``): the replicas end
  identical.

Each launch has a time limit after which every process it started is killed
(checked with workers that never end), and each test checks that none is left.
"""

import pathlib
import shutil
import subprocess

import portable_kernels
import pytest
import torch
from torch import nn
from torchrun_script import left_behind, run_torchrun

from mylib.experiments.common import max_param_diff

SCRIPTS = pathlib.Path(__file__).resolve().parent.parent / "notebooks" / "scripts"
LIMIT_S = 120  # per launch; then every process it started is killed


def one_process(reshuffle=True):
    """The plain script's training in one process, written out by hand.

    The same data and model (seed 0), SGD with lr 0.1, 3 epochs of whole global
    batches of 64 in the order ``DistributedSampler(seed=0)`` draws for epoch
    e: ``randperm`` seeded ``0 + e`` (``reshuffle=False``: epoch 0's order every
    epoch, as a script that forgets ``set_epoch`` gets).
    """
    torch.manual_seed(0)
    x = torch.randn(1024, 16)
    y = torch.sin(x.sum(dim=1, keepdim=True))
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        seed = epoch if reshuffle else 0
        order = torch.randperm(1024, generator=torch.Generator().manual_seed(seed))
        for batch in order.split(64):
            loss = nn.functional.mse_loss(model(x[batch]), y[batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.state_dict()


def _launch(script, cwd, nproc, env=None):
    cwd.mkdir()
    done = run_torchrun(script, cwd, nproc=nproc, timeout=LIMIT_S, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_the_plain_pytorch_script_trains_as_one_process_does(tmp_path):
    """On the portable kernels (tests/portable_kernels.py): nbval runs the quick
    start's launches on this machine's own, and make test-portable leaves them here."""
    script = tmp_path / "quickstart_torch_ddp.py"
    shutil.copy(SCRIPTS / script.name, script)  # on the workers' command lines
    models = {}
    for n in (2, 1):
        done = _launch(script, tmp_path / f"{n}-processes", n, portable_kernels.ENV)
        assert done.stdout == f"rank 0 of {n} (gloo): 3 epochs, model.pt saved\n"
        models[n] = torch.load(tmp_path / f"{n}-processes" / "model.pt")
    assert left_behind(script) == []
    assert max_param_diff(models[2], one_process()) < 1e-6
    assert max_param_diff(models[2], models[1]) < 1e-6
    # the comparison sees the shuffle: epoch 0's order every epoch ends elsewhere
    assert max_param_diff(models[2], one_process(reshuffle=False)) > 1e-3


@pytest.mark.slow
def test_the_mylib_script_ends_with_identical_replicas(tmp_path):
    script = tmp_path / "quickstart_ddp.py"
    shutil.copy(SCRIPTS / script.name, script)
    done = _launch(script, tmp_path / "run", 2)
    assert done.stdout == (
        "2 ranks on cpu, 20 steps; weights identical on every rank: True\n"
    )
    assert left_behind(script) == []


@pytest.mark.slow
def test_a_launch_past_its_time_limit_leaves_no_process(tmp_path):
    # workers that never finish (and import nothing, to start quickly)
    script = tmp_path / "hang.py"
    script.write_text(
        "import os, time\n"
        "open(f'started-{os.environ[\"RANK\"]}', 'w').close()\n"
        "time.sleep(600)\n"
    )
    # torchrun imports torch (a few seconds), its workers nothing: 20 s is ample
    with pytest.raises(subprocess.TimeoutExpired):
        run_torchrun(script, tmp_path, nproc=2, timeout=20)
    assert sorted(p.name for p in tmp_path.glob("started-*")) == [
        "started-0",
        "started-1",
    ]  # both workers ran, and were killed with torchrun
    assert left_behind(script) == []
