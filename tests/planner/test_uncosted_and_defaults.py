"""Operators with no FLOP formula are named in the report and the JSON, never priced as 0 silently; the
training dtype defaults by device kind (fp32 on CPU, bf16 on accelerators) in the API as in the CLI."""
import json

import torch
import torch.nn as nn

from partita.planner.api import plan
from partita.cli import main
from partita.planner.plan.explain import explain
from partita.planner.enumerate.space import TrainConfig


@torch.library.custom_op("partita_test::opaque_mix", mutates_args=())
def opaque_mix(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A kernel whose arithmetic the cost model cannot see (a matmul inside a custom op)."""
    return x @ w


@opaque_mix.register_fake
def _(x, w):
    return x.new_empty(*x.shape[:-1], w.shape[1])


class Opaque(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(32, 32)
        self.w = nn.Parameter(torch.randn(32, 32))
        self.out = nn.Linear(32, 4)

    def forward(self, x):
        return self.out(torch.ops.partita_test.opaque_mix(self.inp(x), self.w)).sum()


def test_an_op_without_a_flop_formula_is_named_in_the_report_and_the_json():
    p = plan(Opaque(), (torch.randn(2, 32),), cluster="4xcpu", train=TrainConfig(global_batch=4))
    assert p.predicted["uncosted_ops"] == {"partita_test.opaque_mix": 1}
    text = explain(p)
    assert "uncosted operators: partita_test.opaque_mix (1 node)" in text
    assert json.loads(json.dumps(p.to_dict()))["predicted"]["uncosted_ops"] == {"partita_test.opaque_mix": 1}


def test_presets_have_no_uncosted_ops_and_no_such_line():
    p = plan("tiny-gpt", cluster="4xcpu", train=TrainConfig(global_batch=8))
    assert p.predicted["uncosted_ops"] == {}
    assert "uncosted" not in explain(p)


def test_the_api_defaults_dtype_by_device_kind():
    assert plan("tiny-gpt", cluster="4xcpu", train=TrainConfig(global_batch=8)).train["dtype"] == "fp32"
    assert plan("tiny-gpt", cluster="8xA100-80GB", train=TrainConfig(global_batch=8)).train["dtype"] == "bf16"
    explicit = plan("tiny-gpt", cluster="4xcpu", train=TrainConfig(global_batch=8, dtype="bf16"))
    assert explicit.train["dtype"] == "bf16"        # a dtype the user gives is kept
    assert TrainConfig(global_batch=8).dtype == "bf16"   # code reading TrainConfig directly sees bf16


def test_the_cli_and_the_api_agree_on_the_default(capsys):
    for cluster, dtype in (("4xcpu", "fp32"), ("8xA100-80GB", "bf16")):
        assert main(["plan", "--model", "tiny-gpt", "--cluster", cluster, "--global-batch", "8", "--json"]) == 0
        cli = json.loads(capsys.readouterr().out)
        api = plan("tiny-gpt", cluster=cluster, train=TrainConfig(global_batch=8))
        assert cli["train"]["dtype"] == api.train["dtype"] == dtype
        assert cli["predicted"]["step_time_s"] == api.predicted["step_time_s"]
