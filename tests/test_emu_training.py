"""A 3-layer MLP trains on `neuron` and its loss curve tracks the CPU run within the build's numerics."""

import copy

import pytest
import torch

import neuron_emu

pytestmark = pytest.mark.filterwarnings("ignore:neuron. operator")


def _train(model, x, y, device, steps=20):
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = x.to(device), y.to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("build", neuron_emu.shipped_builds())
def test_mlp_loss_tracks_cpu(build):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 16, generator=g)
    y = (x[:, :4].sum(1) > 0).long() + (x[:, 4] > 1).long()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
        torch.nn.Linear(32, 3),
    )
    prev = neuron_emu.active_build()
    neuron_emu.use_build(build)
    try:
        dev = _train(copy.deepcopy(model), x, y, "neuron")
    finally:
        neuron_emu.use_build(prev)
    ref = _train(copy.deepcopy(model), x, y, "cpu")
    assert dev[-1] < 0.6 * dev[0]  # it learns
    for a, b in zip(dev, ref, strict=False):
        assert abs(a - b) <= 0.03 * abs(b) + 1e-3, (dev, ref)
    assert dev != ref  # bf16 matmuls / reduced-precision activations are visible
