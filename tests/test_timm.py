"""haloattn.integrations.timm.patch_swin: a patched timm Swin gives the stock model's logits and
gradients (same weights) and trains. Skipped where timm cannot be imported."""

import copy

import pytest
import torch

import oracle

try:
    from timm.models import swin_transformer
except Exception as exc:  # timm missing, or its torchvision built for another torch
    pytest.skip(f"timm is not importable: {exc}", allow_module_level=True)

from haloattn.integrations.timm import patch_swin

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _stock_and_patched(model):
    model = model.to(DEVICE)
    patched = patch_swin(copy.deepcopy(model))
    return model, patched


def _tiny_swin():
    # 14x14 then 7x7 grids: shifted and unshifted 7x7 windows, then one window per image.
    torch.manual_seed(0)
    return swin_transformer.SwinTransformer(
        img_size=56, patch_size=4, window_size=7, embed_dim=32, depths=(2, 2), num_heads=(2, 4),
        num_classes=10, drop_path_rate=0.0,
    )


def _relative_gradients(stock, patched):
    errors = {}
    for (name, p), (_, q) in zip(stock.named_parameters(), patched.named_parameters()):
        errors[name] = oracle.rel_error(q.grad, p.grad)
    return errors


def test_tiny_swin_matches_stock_and_trains():
    stock, patched = _stock_and_patched(_tiny_swin())
    x = torch.randn(2, 3, 56, 56, device=DEVICE)
    out_stock, out_patched = stock(x), patched(x)
    assert oracle.rel_error(out_patched, out_stock) < 1e-4
    out_stock.square().sum().backward()
    out_patched.square().sum().backward()
    errors = _relative_gradients(stock, patched)
    assert max(errors.values()) < 1e-3, max(errors.items(), key=lambda kv: kv[1])

    optimizer = torch.optim.SGD(patched.parameters(), lr=0.1)
    table = patched.layers[0].blocks[1].attn.relative_position_bias_table
    before = table.detach().clone()
    optimizer.step()
    assert not torch.equal(before, table.detach()), "the model's own bias table must train"


def test_patch_rejects_models_without_swin_blocks():
    with pytest.raises(ValueError, match="has no timm SwinTransformerBlock"):
        patch_swin(torch.nn.Linear(2, 2))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_swin_tiny_224_matches_stock():
    torch.manual_seed(0)
    stock, patched = _stock_and_patched(
        swin_transformer.swin_tiny_patch4_window7_224(pretrained=False, drop_path_rate=0.0)
    )
    stock.eval()
    patched.eval()
    x = torch.randn(4, 3, 224, 224, device=DEVICE)
    with torch.no_grad():
        assert oracle.rel_error(patched(x), stock(x)) < 1e-4
    stock(x).logsumexp(-1).sum().backward()
    patched(x).logsumexp(-1).sum().backward()
    errors = _relative_gradients(stock, patched)
    assert max(errors.values()) < 1e-3, max(errors.items(), key=lambda kv: kv[1])

    patched.zero_grad()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = patched(x).float().logsumexp(-1).mean()
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in patched.parameters())
