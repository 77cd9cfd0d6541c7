"""The tracer and the calibration run (mylib.experiments: tracer, calibrate).

Both are tested on real MyDDP steps on gloo ranks.

No timing is asserted (the machine is shared); what is asserted is the
structure: every event lands in the right span, in a consistent order, and
the model is fed the same buckets MyDDP uses.
"""

import pytest
import torch
from torch import nn

from mylib import run_ranks
from mylib.experiments.tracer import Tracer, _layers_from_events, time_layers
from mylib.models import timeline as tl
from mylib.models.buckets import MB


def test_timeline_from_synthetic_events():
    tracer = Tracer()
    events = [
        ("backward", 10.0, {}),
        ("grad_ready", 10.5, {"name": "2.bias", "bucket": 0}),
        ("grad_ready", 10.6, {"name": "2.weight", "bucket": 0}),
        ("bucket_launch", 10.6, {"bucket": 0}),
        ("grad_ready", 11.0, {"name": "0.bias", "bucket": 1}),
        ("grad_ready", 11.1, {"name": "0.weight", "bucket": 1}),
        ("bucket_launch", 11.1, {"bucket": 1}),
        ("bucket_done", 11.2, {"bucket": 0}),
        ("bucket_done", 11.5, {"bucket": 1}),
        ("sync_done", 11.6, {}),
    ]
    for event, t, fields in events:
        tracer(event, t, **fields)
    t = tracer.timeline()
    backward = [s for s in t.spans if s.kind == "backward"]
    assert [(s.label, s.start_s, s.end_s) for s in backward] == [
        ("2", 10.0, 10.6),
        ("0", 10.6, 11.1),
    ]
    comm = [s for s in t.spans if s.kind == "allreduce"]
    assert [(s.bucket, s.start_s, s.end_s, s.ready_s) for s in comm] == [
        (0, 10.6, 11.2, 10.6),
        (1, 11.1, 11.5, 11.1),
    ]
    assert [s.kind for s in t.spans][-1] == "sync"
    assert t.step_s == pytest.approx(1.6)
    assert t.backward_end_s == pytest.approx(1.1)
    assert t.exposed_comm_s == pytest.approx(0.4)
    assert t.n_buckets == 2
    assert t.comm_s == pytest.approx(0.9)  # union of [0.6, 1.2] and [1.1, 1.5]
    assert t.overlap == pytest.approx(0.5 / 0.9)


class _FakeDeviceEvent:
    """Stands in for torch.Event on an accelerator: done at a scripted device time."""

    def __init__(self, times):
        self.t, self.synced = times.pop(0), False

    def record(self):
        pass

    def synchronize(self):
        self.synced = True

    def elapsed_time(self, end):  # milliseconds, as torch.Event's
        assert self.synced and end.synced
        return (end.t - self.t) * 1e3


def test_device_clock_places_events_where_the_device_ran_them():
    # No GPU here: the arithmetic only, with device events whose times are scripted.
    # The host issues everything within 0.1 s; the device runs the backward over
    # 1 s and finishes the all-reduce at 1.5 s (an NCCL future completes at enqueue).
    host = [0.0, 0.01, 0.02, 0.03, 0.05, 0.1]
    device = [5.0, 5.5, 6.0, 6.0, 6.5, 6.5]
    tracer = Tracer(device="cuda")
    tracer._new_device_event = lambda: _FakeDeviceEvent(device)
    for (event, fields), t in zip(
        [
            ("backward", {}),
            ("grad_ready", {"name": "0.bias", "bucket": 0}),
            ("grad_ready", {"name": "0.weight", "bucket": 0}),
            ("bucket_launch", {"bucket": 0}),
            ("bucket_done", {"bucket": 0}),
            ("sync_done", {}),
        ],
        host,
    ):
        tracer(event, t, **fields)
    on_host, on_device = tracer.timeline(), tracer.timeline(clock="device")
    assert on_host.step_s == pytest.approx(0.1)
    assert on_device.step_s == pytest.approx(1.5)
    (comm,) = [s for s in on_device.spans if s.kind == "allreduce"]
    assert (comm.start_s, comm.end_s) == pytest.approx((1.0, 1.5))
    with pytest.raises(ValueError, match="Tracer\\(device="):
        Tracer(device="cpu").timeline(clock="device")
    with pytest.raises(ValueError, match="clock must be"):
        tracer.timeline(clock="gpu")


def test_tracer_errors_name_the_fix():
    with pytest.raises(ValueError, match="ddp.tracer = tracer"):
        Tracer().timeline()
    with pytest.raises(ValueError, match="unknown mark"):
        Tracer().mark("warmup")
    tracer = Tracer()
    tracer("grad_ready", 1.0, name="a.weight", bucket=0)
    tracer("bucket_launch", 1.0, bucket=0)
    with pytest.raises(ValueError, match="finish_gradient_sync"):
        tracer.timeline()


def test_layers_group_parameters_by_module():
    sizes = {"0.weight": 400, "0.bias": 4, "2.weight": 800, "2.bias": 8}
    events = [("2.bias", 1.2), ("2.weight", 1.25), ("0.bias", 1.5), ("0.weight", 1.5)]
    layers = _layers_from_events(1.0, events, sizes)
    assert [name for name, _, _ in layers] == ["2", "0"]
    assert [b for _, _, b in layers] == [(8, 800), (4, 400)]
    assert [round(s, 9) for _, s, _ in layers] == [0.25, 0.25]


def test_time_layers_on_a_real_backward():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
    x, y = torch.randn(8, 32), torch.randn(8, 16)
    for statistic in ("median", "min"):
        layers = time_layers(
            model,
            lambda: nn.functional.mse_loss(model(x), y),
            repeats=3,
            warmup=1,
            statistic=statistic,
        )
        assert [layer.name for layer in layers] == ["2", "0"]  # backward order
        assert [layer.param_bytes for layer in layers] == [
            (16 * 4, 16 * 64 * 4),
            (64 * 4, 64 * 32 * 4),
        ]
        assert all(layer.backward_s >= 0 for layer in layers)
    runs = time_layers(
        model,
        lambda: nn.functional.mse_loss(model(x), y),
        repeats=3,
        warmup=1,
        statistic="runs",
    )
    assert len(runs) == 3 and all(
        [layer.name for layer in run] == ["2", "0"] for run in runs
    )
    assert all(
        not p._post_accumulate_grad_hooks for p in model.parameters()
    )  # hooks removed
    with pytest.raises(ValueError, match="statistic"):
        time_layers(model, lambda: model(x).sum(), statistic="mean")


def test_link_is_calibrated_over_the_sizes_a_bucket_can_have():
    from mylib.experiments.calibrate import link_sizes_for
    from mylib.experiments.common import mlp

    sizes = link_sizes_for(mlp([1024] * 9))  # 8 x 4.004 MB of fp32 gradients
    assert sizes[0] == 4096 and sizes[-1] == 32 * 2**20
    assert all(b == 2 * a for a, b in zip(sizes, sizes[1:]))
    assert link_sizes_for(nn.Linear(2, 2)) == [
        4096,
        8192,
    ]  # a tiny model: still two sizes, to fit two constants
    assert len(link_sizes_for(nn.Linear(64, 64))) == 3  # 16.6 KB: 4, 8 and 16 KB


def traced_steps(cap_mb, steps=3):
    import torch.distributed as dist

    from mylib.ddp import MyDDP
    from mylib.experiments.calibrate import traced_step
    from mylib.experiments.common import mlp

    model = mlp([128] * 5)
    ddp = MyDDP(model, bucket_cap_mb=cap_mb)
    tracer = Tracer()
    ddp.tracer = tracer
    x = torch.randn(16, 128, generator=torch.Generator().manual_seed(dist.get_rank()))

    def loss():
        return nn.functional.mse_loss(ddp(x), x)

    timelines, nbytes = [], []
    for _ in range(steps):
        timelines.append(traced_step(ddp, loss, tracer, "measured"))
        # the buckets this step used: MyDDP rebuilds them before the second forward
        nbytes.append([b.nbytes for b in ddp.buckets])
    sizes = [p.numel() * p.element_size() for p in model.parameters()][::-1]
    model_buckets = [
        list(bucket)
        for bucket in tl.simulate(
            [tl.Layer(str(i), 1e-3, b) for i, b in enumerate(sizes)],
            cap_mb * MB,
            tl.Link(2, 1e-5, 1e9),
        ).buckets
    ]
    backward_index = {id(p): i for i, p in enumerate(list(model.parameters())[::-1])}
    ddp_buckets = [[backward_index[id(q)] for q in b.params] for b in ddp.buckets]
    return {
        "timelines": timelines,
        "nbytes": nbytes,
        "model_buckets": model_buckets,
        "ddp_buckets": ddp_buckets,
    }


@pytest.mark.parametrize("cap_mb", [0, 0.1, 25])
def test_traced_myddp_steps_on_two_ranks(cap_mb):
    for result in run_ranks(traced_steps, 2, args=(cap_mb,), timeout_s=120):
        # The model and MyDDP bucket the same parameters the same way (one rule,
        # mylib.models.buckets).
        assert result["model_buckets"] == result["ddp_buckets"]
        for t, nbytes in zip(result["timelines"], result["nbytes"]):
            comm = [s for s in t.spans if s.kind == "allreduce"]
            backward = [s for s in t.spans if s.kind == "backward"]
            assert [s.bucket for s in comm] == list(range(len(nbytes)))
            assert [s.nbytes for s in comm] == nbytes
            assert [s.label for s in backward] == [
                "6",
                "4",
                "2",
                "0",
            ]  # the Linear layers, last first
            for a, b in zip(backward, backward[1:]):
                assert a.end_s <= b.start_s + 1e-9
            for s in comm:
                assert s.ready_s <= s.start_s + 1e-9 and s.start_s <= s.end_s
            for a, b in zip(
                comm, comm[1:]
            ):  # launched from a hook, before later gradients arrived: overlap
                assert a.start_s <= b.ready_s
            assert t.step_s >= t.backward_end_s and 0.0 <= t.overlap <= 1.0


def test_calibration_run_end_to_end():
    from mylib.experiments.calibrate import (
        ALL_AT_END,
        compare,
        cost_of_model_choice,
        experiment,
        model_for,
        typical_round,
    )

    caps = [0, 1, ALL_AT_END]
    result = run_ranks(
        experiment,
        2,
        args=(caps,),
        kwargs=dict(n_layers=2, width=128, batch_size=16, rounds=2, warmup=1),
        timeout_s=300,
    )[0]
    assert len(result["rounds"]) == 2 and result["caps"] == caps
    for r in result["rounds"]:
        c = r["calibration"]
        assert c["alpha_s"] >= 0 and c["bandwidth"] > 0
        assert c["comm_stretch"] >= 1 and c["compute_stretch"] >= 1
        assert [layer.name for layer in c["layers"]] == ["2", "0"]
        assert r["measured"][ALL_AT_END].n_buckets == 1
        assert model_for(c, ALL_AT_END).n_buckets == 1
        assert model_for(c, 0).n_buckets == r["measured"][0].n_buckets == 4
    rows, best_model, best_measured = compare(result)
    assert [row["cap"] for row in rows] == caps
    assert best_model in caps and best_measured in caps
    assert cost_of_model_choice(rows, best_model, best_measured) >= 0
    assert cost_of_model_choice(rows, best_measured, best_measured) == 0
    assert all(row["model_s"] > 0 and row["measured_s"] > 0 for row in rows)
    assert typical_round(result) in result["rounds"]
