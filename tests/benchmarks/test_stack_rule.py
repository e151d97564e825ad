"""benchmarks.stack_rule: a run's stack follows from what it used, by a table written down beforehand."""
import pytest

from benchmarks.published_data import ROWS
from benchmarks.published_data_first_contact import FIRST_CONTACT_ROWS
from benchmarks.stack_rule import RULES, NoStack, RunFacts, rule_for, stack_for
from partita.costmodel.hardware.stacks import STACKS


def facts(elementwise, attention, torch="", tp_overlap="none"):
    return RunFacts(framework="test", elementwise=elementwise, attention=attention, torch=torch, tp_overlap=tp_overlap)


def test_every_rule_names_a_stack_the_cost_model_has():
    assert {r.stack for r in RULES} == set(STACKS)


@pytest.mark.parametrize("run, stack", [
    (facts("fused", "math", "1.12"), "megatron-2021"),          # Megatron-LM / NeMo 2021-22: apex kernels, scores
    (facts("fused", "flash2", "2.1"), "megatron-2021"),         # fused kernels around flash-attn 2, no TE
    (facts("fused", "flash1", "1.13"), "flash1-2022"),          # flash-attn 0.2's training scripts
    (facts("te", "cudnn", "2.4", "userbuffers"), "te-2024"),    # Megatron-Core / NeMo with Transformer Engine
    (facts("te", "flash2", "2.3", "userbuffers"), "te-2024-flash2"),
    (facts("eager", "flash_triton", "2.1"), "triton-2023"),     # llm-foundry's Triton attention
    (facts("eager", "flash2", "2.1"), "flash-2023"),            # llm-foundry with flash-attn 2.4
    (facts("eager", "sdpa", "2.2"), "flash-2023"),              # fms-fsdp
    (facts("eager", "sdpa", "2.11"), "pytorch"),                # partita's own runs
    (facts("eager", "sdpa", "2.8", "async-tp"), "pytorch-fa2"),  # torchtitan's async TP: SDPA ran FlashAttention-2
    (facts("eager", "sdpa", "2.10"), "pytorch-fa2"),            # cuDNN attention opt-in from 2.5.1 to 2.10
    (facts("eager", "flash2", "2.11"), "pytorch-fa2"),          # the flash-attn 2 package is FA2 on any torch
])
def test_the_table_assigns_the_stack_of_what_ran(run, stack):
    assert stack_for(run) == stack


def test_a_run_no_rule_describes_gets_no_stack():
    with pytest.raises(NoStack):
        stack_for(facts("fused", "sdpa", "2.4"))           # fused kernels around torch SDPA: no stack runs that
    with pytest.raises(NoStack):
        stack_for(facts("eager", "sdpa"))                   # torch release not stated: flash-2023 or pytorch?
    with pytest.raises(NoStack):
        stack_for(facts("eager", "sdpa", "2.1", "userbuffers"))
    with pytest.raises(ValueError):
        facts("jit", "sdpa", "2.1")


def test_a_stack_that_shares_constants_is_priced_with_them():
    """pytorch-fa2 runs flash-2023's kernels: the same constants, and only what may overlap differs."""
    from partita.costmodel.hardware.device import kernel_constants
    assert STACKS["pytorch-fa2"].constants == "flash-2023"
    assert kernel_constants("hopper", "pytorch-fa2") == kernel_constants("hopper", "flash-2023")
    assert kernel_constants("hopper", "pytorch-fa2") != kernel_constants("hopper", "pytorch")
    assert STACKS["pytorch-fa2"].tp_comm_overlap and not STACKS["flash-2023"].tp_comm_overlap


def test_the_first_matching_rule_decides():
    index, rule = rule_for(facts("te", "math", "2.1", "userbuffers"))
    assert rule.stack == "te-2024" and index == 0


def test_every_table_that_states_its_run_is_on_the_rules_stack():
    stated = [r for r in ROWS + FIRST_CONTACT_ROWS if r.table.run is not None]
    assert len(stated) >= len(FIRST_CONTACT_ROWS) and all(r.table.run for r in FIRST_CONTACT_ROWS)
    for r in stated:
        assert r.table.stack == stack_for(r.table.run), r.table.citation
