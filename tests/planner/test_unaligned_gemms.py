"""A Linear whose K or N is no multiple of 16 bytes runs cuBLAS's slower kernels (costmodel.price.kernels,
Alignment): the plan prices it where a kernel timing measured that, says what it costs and which padding removes
it, and where nothing measured it says the price is optimistic instead of staying silent."""
from partita.planner.api import plan
from partita.planner.enumerate.space import TrainConfig

GPT = "gpt:layers=2,hidden=256,heads=4,vocab={vocab},seq=128"


def _plan(vocab: int, cluster: str):
    return plan(GPT.format(vocab=vocab), cluster=cluster, train=TrainConfig(global_batch=8))


def _said(p) -> list[str]:
    return [a for a in p.predicted["assumptions"] if a.startswith("unaligned GEMMs")]


def test_an_unaligned_head_is_priced_slower_and_named_with_its_padding_on_a_timed_gpu():
    odd, padded = _plan(50257, "1xH200-141GB"), _plan(50304, "1xH200-141GB")
    assert odd.predicted["step_time_s"] > 1.2 * padded.predicted["step_time_s"]  # 47 more columns cost < 0.1%
    (line,) = _said(odd)
    assert "head (K x N = 256 x 50257)" in line and "padding 50257 to 50304" in line and "% of the model's" in line
    assert not _said(padded)


def test_an_untimed_gpu_prices_it_as_aligned_and_says_so():
    odd, padded = _plan(50257, "1xA100-80GB"), _plan(50304, "1xA100-80GB")
    assert odd.predicted["step_time_s"] <= padded.predicted["step_time_s"]
    (line,) = _said(odd)
    assert "priced as aligned" in line and "A100-80GB" in line and "slower than predicted" in line


def test_a_cpu_plan_says_nothing_of_cublas():
    assert not _said(_plan(50257, "2xcpu"))
