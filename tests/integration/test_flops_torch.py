"""FLOPs per step from a CPU capture's recorded shapes equal torch's FlopCounterMode on the same step.

The answer is torch's own: the step runs once under the profiler (``record_shapes=True``, one ProfilerStep) and once
under FlopCounterMode, same model, same inputs. Models with linear, conv (forward and backward), bmm, matmul,
baddbmm and scaled-dot-product attention. FlopCounterMode has no formula for the CPU flash-attention ops (it counts
them 0); we count them with torch's attention formulas, so the attention model's reference registers those very
formulas for the two CPU ops (``custom_mapping``): everything else is FlopCounterMode's stock table.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kinetoscope.analyze.analyzers.efficiency import compute  # noqa: E402
from kinetoscope.analyze.ingest.loader import load_rank  # noqa: E402

pytestmark = pytest.mark.torch


def _models():
    nn = torch.nn
    F = torch.nn.functional

    class ConvNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, stride=2, padding=1)
            self.conv2 = nn.Conv2d(8, 12, (3, 5), padding=(2, 1), dilation=(1, 2))
            self.up = nn.ConvTranspose2d(12, 4, 2, stride=2)
            self.fc = nn.Linear(4 * 16 * 10, 10)

        def forward(self, x):
            y = F.relu(self.conv1(x))
            y = self.up(F.relu(self.conv2(y)))
            return self.fc(y.flatten(1))

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(32, 96)
            self.out = nn.Linear(32, 32, bias=False)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, 4, 8).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, 32)
            scores = torch.bmm(a, a.transpose(1, 2))  # bmm
            mixed = torch.baddbmm(a, scores, a, beta=0.5)  # baddbmm
            return self.out(torch.matmul(mixed, torch.ones(32, 32)))  # matmul of a 3-d and a 2-d tensor

    return {"conv": (ConvNet(), torch.randn(4, 3, 16, 20)), "attention": (Attention(), torch.randn(2, 12, 32))}


def _step(model, x):
    loss = model(x).square().mean()
    loss.backward()
    model.zero_grad(set_to_none=True)


def _flop_counter_flops(model, x, cpu_attention: bool) -> int:
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten
    mapping = {}
    if cpu_attention:  # the two CPU flash-attention ops, with torch's own attention formulas
        mapping = {aten._scaled_dot_product_flash_attention_for_cpu:
                   lambda q, k, v, *_, out_shape=None, **__: fc.sdpa_flop_count(q, k, v),
                   aten._scaled_dot_product_flash_attention_for_cpu_backward:
                   lambda g, q, k, v, *_, out_shape=None, **__: fc.sdpa_backward_flop_count(g, q, k, v)}
    with fc.FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        _step(model, x)
    return int(counter.get_total_flops())


def _captured_flops(model, x, path: Path):
    from torch.profiler import ProfilerActivity, profile, schedule

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=0, warmup=1, active=1, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for _ in range(2):
            _step(model, x)
            prof.step()
    result, _ = compute(load_rank(path))
    return result


@pytest.mark.parametrize("which", ["conv", "attention"])
def test_flops_per_step_equal_flop_counter_mode(tmp_path, which):
    torch.manual_seed(0)
    model, x = _models()[which]
    expected = _flop_counter_flops(model, x, cpu_attention=which == "attention")
    result = _captured_flops(model, x, tmp_path / f"{which}.json")
    assert result.steps == 1 and result.matrix_ops_unknown == 0
    assert result.flops_per_step == expected
    assert result.mfu is None and result.peak_tflops is None  # a CPU: no peak, no MFU


def test_the_stock_flop_counter_agrees_without_attention(tmp_path):
    """No custom formula at all: the conv model against FlopCounterMode as torch ships it."""
    torch.manual_seed(0)
    model, x = _models()["conv"]
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        _step(model, x)
    result = _captured_flops(model, x, tmp_path / "conv.json")
    assert result.flops_per_step == counter.get_total_flops()
    # by hand, forward (2 x batch x c_out x c_in x filter x output positions): conv1 out 8x10 (stride 2, pad 1):
    # 2*4*8*3*9*80 = 138240; conv2 out 10x4 ((8+4-2-1)+1, (10+2-8-1)+1 with padding (2,1), dilation (1,2)):
    # 2*4*12*8*15*40 = 460800; the transposed conv counts its input's 10x4 positions, weight [12, 4, 2, 2]:
    # 2*4*12*4*4*40 = 61440; fc 2*4*640*10 = 51200. Backward: grad input and grad weight each cost the forward again,
    # but conv1's input needs no grad (grad weight only)
    assert counter.get_total_flops() == 138240 * 2 + 460800 * 3 + 61440 * 3 + 51200 * 3 == 1996800
