"""PyTorch's transformer fast paths (eval, no autograd): nn.TransformerEncoderLayer and
nn.MultiheadAttention reach the backend as one fused ATen op each, which the decompositions in
frontend/decomp_transformer.py turn into compiled kernels. Differential against eager (which
runs the fused CPU kernels), with nothing falling back."""

import pytest
import torch

import neuroncc


def _compiled_matches(fn, *inputs, atol=2e-5):
    neuroncc.reset_stats()
    torch._dynamo.reset()
    with torch.no_grad():
        got, want = torch.compile(fn, backend="neuron")(*inputs), fn(*inputs)
    got, want = (x if isinstance(x, tuple) else (x,) for x in (got, want))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=atol, rtol=1e-4)
    assert neuroncc.stats()["fallback_nodes"] == {}


@pytest.mark.parametrize(
    ("norm_first", "activation"), [(False, "relu"), (True, "gelu"), (False, "gelu")]
)
def test_encoder_layer(fresh, norm_first, activation):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(
        64, 4, 96, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first
    ).eval()
    _compiled_matches(layer, torch.randn(2, 10, 64))


def test_encoder_layer_with_masks(fresh):
    """A causal src_mask and a key-padding mask; a fully padded sequence's rows are zero, as
    the fused kernel's masked softmax gives them, not NaN."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True).eval()
    x = torch.randn(3, 6, 32)
    padding = torch.zeros(3, 6, dtype=torch.bool)
    padding[1, 4:] = True
    _compiled_matches(lambda x, m: layer(x, src_key_padding_mask=m), x, padding)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(6)
    _compiled_matches(lambda x: layer(x, src_mask=causal, is_causal=True), x)


def test_a_stack_of_layers(fresh):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, 3, enable_nested_tensor=False).eval()
    _compiled_matches(encoder, torch.randn(2, 9, 32))


@pytest.mark.parametrize(
    ("need_weights", "average", "mask_type", "additive"),
    [
        (False, True, None, False),
        (True, True, 0, False),
        (True, False, 1, False),
        (True, True, 2, False),
        (True, True, 0, True),
    ],
)
def test_native_multi_head_attention(fresh, need_weights, average, mask_type, additive):
    """The op nn.MultiheadAttention's fast path calls (Dynamo traces the module's Python path,
    so the op is called here as the module calls it): self- and cross-attention, each mask
    type (boolean, or a float mask added to the scores), the weights averaged over heads or
    per head."""
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(48, 6, batch_first=True).eval()
    x, memory = torch.randn(2, 7, 48), torch.randn(2, 7, 48)  # (the op: same shapes)
    shapes = {None: None, 0: (7, 7), 1: (2, 7), 2: (2, 6, 7, 7)}
    mask = None if mask_type is None else torch.rand(shapes[mask_type]) < 0.3
    if additive:  # a float mask is added to the scores
        mask = torch.zeros(mask.shape).masked_fill(mask, float("-inf"))
    weights = (mha.in_proj_weight, mha.in_proj_bias, mha.out_proj.weight, mha.out_proj.bias)

    def attend(q, kv, mask):
        return torch.ops.aten._native_multi_head_attention(
            q, kv, kv, 48, 6, *weights, mask, need_weights, average, mask_type
        )

    want = attend(x, memory, mask)
    assert (want[1] is not None) == need_weights
    _compiled_matches(
        lambda q, kv: attend(q, kv, mask)[0 if not need_weights else slice(None)], x, memory
    )
    if mask_type is None:
        _compiled_matches(lambda x: attend(x, x, None)[0], x)  # self-attention
