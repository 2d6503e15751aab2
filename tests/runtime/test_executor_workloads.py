"""The realistic-size built-ins: their sizes, no buffers (the executor moves parameters),
and layer-by-layer loading gives the same outputs as the model itself."""

from __future__ import annotations

import pytest
import torch

from hetsched.runtime.executor.slots import JobSlot
from hetsched.runtime.workloads import BUILTINS, bert_base, resnet50

pytestmark = pytest.mark.slow  # subprocesses or multi-process torch: `make test`, not `make test-fast`


@pytest.mark.parametrize(("name", "lo", "hi"), [("resnet50", 25.5e6, 25.6e6),
                                               ("bert-base", 108e6, 111e6)])
def test_sizes_and_pipelined_loading(name: str, lo: float, hi: float) -> None:
    wl = resnet50(4, 0, image=32) if name == "resnet50" else bert_base(4, 0, seq=4)
    assert BUILTINS[name] in (resnet50, bert_base)
    ref = wl.model
    n = sum(p.numel() for p in ref.parameters())
    assert lo <= n <= hi, n
    assert not list(ref.buffers())
    other = (resnet50(4, 1, image=32) if name == "resnet50" else bert_base(4, 1, seq=4)).model
    slot = JobSlot(other, torch.device("cpu"))
    slot.host.copy_(torch.cat([p.detach().reshape(-1) for p in ref.parameters()]))
    slot.load(0)
    x = wl.dataset[:2][0]  # type: ignore[index]
    with torch.no_grad():
        out = slot.model(x)
        slot.check_loaded()
        assert torch.allclose(out, ref(x), atol=1e-5)
