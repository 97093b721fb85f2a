"""Kernel choices and kernel-made buffers that a fake-tensor run does not show by itself.

- **Attention on CUDA.** ``scaled_dot_product_attention`` on the CPU falls back to the math
  path for attention with dropout, which keeps the whole (batch, heads, seq, seq) probability
  matrix; CUDA runs the flash or memory-efficient kernel, which saves only the output and a
  log-sum-exp. :func:`cuda_attention` routes the call to the kernel the target GPU would
  pick (flash needs compute capability 8.0: on a T4 or V100 it is memory-efficient); their
  fake implementations run anywhere. It replaces ``torch.nn.functional.
  scaled_dot_product_attention`` for the whole run instead of using a torch-function mode,
  because such a mode is not active while autograd recomputes a checkpointed block: the
  recomputation took the CPU path, saved a different number of tensors than the forward, and
  failed with ``CheckpointError``. (The estimator process runs nothing else, so the
  replacement is safe there.) A model that bound the function under another name at import
  runs it as written.

- **Dropout on CUDA.** ``F.dropout`` in training takes a fused kernel on CUDA
  (``aten/src/ATen/native/Dropout.cpp``: ``dropout`` calls ``native_dropout`` when
  ``is_fused_kernel_acceptable``: a CUDA input, ``0 < p < 1``, at least one element), which
  keeps a boolean mask (one byte per element) for backward; on the CPU it draws a mask of the
  input's dtype (``empty_like`` + ``bernoulli_``) and multiplies, four bytes per element in
  float32. :func:`cuda_dropout` routes out-of-place training dropout to ``native_dropout`` for
  the whole run, as :func:`cuda_attention` does for attention (in-place dropout takes the
  unfused path on CUDA too).

Fake tensors run each operator's meta implementation, which gets shapes right but can differ
from the real kernel in what else it returns:

- **LSTM on the CPU.** ``nn.LSTM`` in training runs oneDNN's ``mkldnn_rnn_layer`` once per
  layer and direction. The real kernel returns a *workspace* (every step's gates and states,
  kept for backward), sized by oneDNN; its meta implementation returns an empty one, so a fake
  run missed most of an LSTM's activation memory. :func:`rnn_workspaces` gives each fake call a
  workspace of the size oneDNN allocates (:func:`onednn_lstm_workspace_bytes`, checked against
  the real kernel in the tests).
- **LSTM on CUDA.** cuDNN keeps its own *reserve space* for backward, whose size only cuDNN
  computes (``cudnnGetRNNTrainingReserveSize``). A CUDA estimate charges the size measured on
  an H200 with cuDNN 9 (:func:`cudnn_lstm_reserve_bytes`); cuDNN's temporary workspaces are
  not modelled.
- **Depthwise convolutions on the CPU.** The backward of a float32 depthwise convolution on a
  channels_last input makes a buffer of channels x k x k x 256 x 4 bytes inside oneDNN and
  frees it before returning (:func:`depthwise_backward_workspace`); :func:`onednn_scratch`
  allocates and frees one of that size after each such fake call.
- **oneDNN's temporaries.** Inside each LSTM layer call oneDNN reorders the weights into its
  own layout and uses a scratchpad (the gates of every step); backward also reorders the
  weight gradients when their leading dimension is padded. These live only during the call,
  but the CPU recorder sees them and they raise the peak. :func:`onednn_scratch` allocates
  and frees buffers of those sizes around each fake call (:func:`onednn_lstm_temporaries`:
  exact for the weight buffers, the scratchpad within a few tens of KB). cuDNN's workspaces
  are not modelled.
- **bitsandbytes' 8-bit optimizer update on the CPU.** Under fake tensors its
  ``optimizer_update_8bit_blockwise`` runs its fake kernel, which allocates nothing: right for
  the fused CUDA kernel, but the CPU kernel is Python that dequantises both moments, copies
  the gradient and the weight to fp32 and computes the denominator (five fp32 tensors the size
  of the parameter). :func:`bitsandbytes_cpu_update` runs that Python on the fake tensors.
- **Grouped matrix products (MoE experts).** transformers runs mixture-of-experts layers
  (Mixtral, Qwen-MoE, ...) through ``aten._grouped_mm``; its meta implementation accepts only
  bf16 inputs, although the CPU kernel (and CUDA's on recent torch) multiplies fp32 and fp16
  too, so a float32 MoE model could not be estimated. :func:`grouped_mm_any_dtype` gives the
  fake run the same output (shape and dtype by the meta implementation's own rule) for any
  float dtype.
- **Sparse gradients.** An ``nn.Embedding`` / ``nn.EmbeddingBag`` with ``sparse=True`` gets a
  sparse COO gradient: an int64 index and a row of values per looked-up id. Autograd stores a
  copy (``clone``), but the meta implementations of ``clone``, ``coalesce`` and
  ``sparse_mask`` return sparse tensors with no entries, so the fake gradient, SGD's momentum
  and SparseAdam's reads were empty. :func:`sparse_tensors` keeps their entries (``coalesce``
  keeps them all: a fake run cannot know which ids repeat, and distinct ids are the upper
  bound), and gives in-place ``mul_`` / ``add_`` of a sparse tensor new buffers as the CPU
  kernels do (``add_`` makes room for both operands' entries, which SGD's momentum keeps).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .._capture.modes import rewriting_ops

_PAGE = 4096  # oneDNN places each workspace part at a page boundary


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _good_ld(dim: int, itemsize: int) -> int:
    """oneDNN's leading dimension: a multiple of 64 bytes, moved off multiples of 256
    elements (``rnn_utils::get_good_ld``)."""
    ld = _round_up(dim, 64 // itemsize)
    return ld + 64 // itemsize if ld % 256 == 0 else ld


def onednn_lstm_workspace_bytes(steps: int, batch: int, input_size: int, hidden_size: int) -> int:
    """Bytes of the workspace oneDNN's LSTM forward-training primitive allocates for one layer
    and direction (float32), as ``mkldnn_rnn_layer`` requests it.

    Parts, each rounded up to a 4 KiB page: the states, cell states and the three diff-state
    buffers for (layers + 1) x (steps + 1) positions; the gates (4 x hidden) and the hidden
    outputs for every step.
    """
    states_ld = _good_ld(max(input_size, hidden_size), 4)
    positions = 2 * (steps + 1) * batch  # (n_layer + 1) x (n_iter + 1) x mb, one layer
    parts = [
        positions * states_ld * 4,  # states (layer input / output)
        positions * hidden_size * 4,  # cell states
        positions * states_ld * 4,  # diff states, layer
        positions * states_ld * 4,  # diff states, iteration
        positions * hidden_size * 4,  # diff cell states
        steps * batch * _good_ld(4 * hidden_size, 4) * 4,  # gates
        steps * batch * _good_ld(hidden_size, 4) * 4,  # hidden outputs
    ]
    return sum(_round_up(p, _PAGE) for p in parts)


def onednn_lstm_temporaries(
    steps: int, batch: int, input_size: int, hidden_size: int, *, backward: bool
) -> list[int]:
    """Byte sizes of the buffers oneDNN's LSTM (float32) allocates and frees inside one layer
    call: the weights reordered into its layout, the scratchpad, and in backward the bias
    gradient and the weight gradients it cannot write in place."""
    gates_ld = _good_ld(4 * hidden_size, 4)
    hidden_ld = _good_ld(hidden_size, 4)
    merged = backward or batch < 128  # the layer GEMM runs over all steps at once
    scratch = (steps if merged else 1) * batch * gates_ld * 4 + 2 * batch * hidden_ld * 4
    weights = [input_size * gates_ld * 4, hidden_size * gates_ld * 4]
    if not backward:
        return [*weights, scratch]
    diff = [
        4 * hidden_size * _good_ld(dim, 4) * 4
        for dim in (input_size, hidden_size)
        if _good_ld(dim, 4) != dim
    ]
    return [*diff, *weights, 4 * hidden_size * 4, scratch]


def cudnn_lstm_reserve_bytes(steps: int, batch: int, hidden_size: int, itemsize: int) -> int:
    """cuDNN's LSTM reserve space for one layer and direction: five (steps x batch x hidden)
    slabs (gates and states of every step). Measured on an H200 (cuDNN 9, float32): the
    reserve of an L-layer, D-direction LSTM was (5 L D + (L - 1) D) slabs + 256 bytes, the
    extra slabs being the outputs between layers, which the fake run already holds as tensors.
    Other cuDNN versions or GPUs may differ."""
    return 5 * steps * batch * hidden_size * itemsize


_RNN_LAYER_ARGS = (
    "input", "w0", "w1", "w2", "w3", "hx", "cx", "reverse", "batch_sizes", "mode",
    "hidden_size", "num_layers", "has_biases", "bidirectional", "batch_first", "train",
)  # fmt: skip


@dataclass
class RnnCalls:
    """Whether a fake run reached the LSTM layer op. The rewriting that adds workspaces is a
    dispatch mode, which costs every op of the step (about 8 % of a 7B model's run): a
    simulator leaves it out once a whole step of its model ran without that op."""

    seen: bool = False


def _with_rnn_workspace(
    target_type: str,
    calls: RnnCalls | None,
    func: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    out: Any,
) -> Any:
    """A fake ``mkldnn_rnn_layer`` call's outputs with the workspace the real kernel returns
    (see the module docstring); other ops' outputs as they are."""
    if func is not torch.ops.aten.mkldnn_rnn_layer.default:
        return out
    if calls is not None:
        calls.seen = True
    call = dict(zip(_RNN_LAYER_ARGS, args, strict=False)) | kwargs
    if not call.get("train"):
        return out
    x = call["input"]
    # nn.LSTM hands every layer time-major input, whatever its batch_first flag says
    # (the real kernel reads it so; checked against its workspace sizes in the tests)
    steps, batch = int(x.shape[0]), int(x.shape[1])
    hidden = int(call["hidden_size"])
    if target_type == "cuda":
        size = cudnn_lstm_reserve_bytes(steps, batch, hidden, x.element_size())
    else:
        size = onednn_lstm_workspace_bytes(steps, batch, int(x.shape[-1]), hidden)
    workspace = torch.empty(size, dtype=torch.uint8, device=x.device)
    return (*out[:3], workspace)


@contextlib.contextmanager
def rnn_workspaces(target_type: str, calls: RnnCalls | None = None) -> Iterator[None]:
    """Within the block, fake LSTM layers return a real-sized workspace (and set
    ``calls.seen``). Enter it below the recorder, so the recorder sees the op's real outputs."""
    with rewriting_ops(functools.partial(_with_rnn_workspace, target_type, calls)):
        yield


def depthwise_backward_workspace(input: torch.Tensor, weight: torch.Tensor, groups: int) -> int:
    """Bytes oneDNN allocates and frees inside the backward of a float32 depthwise 2-D
    convolution whose input is channels_last: channels x kernel height x kernel width x 256 x
    4, whatever the batch (measured against the CPU allocator's reports: 24.5 MiB at 512
    channels and a 7 x 7 kernel; tests/test_observer_effect.py checks the real kernel)."""
    if (
        input.dtype != torch.float32
        or input.dim() != 4
        or weight.dim() != 4
        or groups != input.shape[1]
        or weight.shape[1] != 1
        or input.shape[1] == 1
        or not input.is_contiguous(memory_format=torch.channels_last)
        or input.is_contiguous()
    ):
        return 0
    channels, kh, kw = int(weight.shape[0]), int(weight.shape[2]), int(weight.shape[3])
    return channels * kh * kw * 256 * 4


#: CPU matrix products and the positions of their matrix operands.
_MATMUL_OPERANDS = {
    torch.ops.aten.mm.default: (0, 1),
    torch.ops.aten.addmm.default: (1, 2),
    torch.ops.aten.bmm.default: (0, 1),
    torch.ops.aten.baddbmm.default: (1, 2),
}


def broadcast_operand_copies(func: Any, args: tuple[Any, ...]) -> list[int]:
    """Bytes the CPU BLAS path copies inside a matrix product: an operand whose rows or
    columns are broadcast (a zero stride in its last two dimensions, e.g. the gradient of a
    ``sum()`` handed to a linear layer's backward) is made contiguous first, numel x itemsize,
    and freed before the op returns (measured against the CPU allocator's reports: 512 KiB
    for a 512 x 256 float32 operand, expanded from a scalar or from one row; a zero stride in
    the batch dimension of ``bmm`` copies nothing). float32 / float64 only."""
    sizes = []
    for position in _MATMUL_OPERANDS.get(func, ()):
        operand = args[position] if position < len(args) else None
        if (
            isinstance(operand, torch.Tensor)
            and operand.dtype in (torch.float32, torch.float64)
            and operand.dim() >= 2
            and operand.numel() > 1
            and 0 in operand.stride()[-2:]
        ):
            sizes.append(operand.numel() * operand.element_size())
    return sizes


def _with_onednn_temporaries(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
) -> Any:
    """Allocate and free oneDNN's in-call temporaries after the fake ops that make them (see
    the module docstring); every op's outputs stay as they are."""
    aten = torch.ops.aten
    if func is aten.convolution_backward.default:
        workspace = depthwise_backward_workspace(args[1], args[2], args[9])
        if workspace:
            buffer = torch.empty(workspace, dtype=torch.uint8, device=args[1].device)
            del buffer
    elif func in _MATMUL_OPERANDS:
        copies = [
            torch.empty(n, dtype=torch.uint8, device=out.device)
            for n in broadcast_operand_copies(func, args)
        ]
        del copies
    elif func is aten.mkldnn_rnn_layer.default or func is aten.mkldnn_rnn_layer_backward.default:
        x, w_layer = args[0], args[1]
        if x.dtype == torch.float32 and x.dim() == 3:
            sizes = onednn_lstm_temporaries(
                int(x.shape[0]), int(x.shape[1]), int(w_layer.shape[1]),
                int(w_layer.shape[0]) // 4,
                backward=func is aten.mkldnn_rnn_layer_backward.default,
            )  # fmt: skip
            held = [torch.empty(n, dtype=torch.uint8, device=x.device) for n in sizes]
            del held
    return out


@contextlib.contextmanager
def onednn_scratch() -> Iterator[None]:
    """Within the block, fake LSTM layer calls also allocate oneDNN's temporaries. Enter it
    above the recorder, so the recorder sees these buffers."""
    with rewriting_ops(_with_onednn_temporaries):
        yield


@contextlib.contextmanager
def cuda_attention(*, flash: bool = True) -> Iterator[None]:
    """Within the block, ``F.scaled_dot_product_attention`` runs the kernel CUDA would pick
    (``flash``: whether the target GPU has flash attention, compute capability >= 8.0)."""
    original = F.scaled_dot_product_attention

    def attention(
        query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
        attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
        is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
    ) -> torch.Tensor:  # fmt: skip
        out = cuda_kernel_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, flash=flash
        )
        if out is not None:
            return out
        return original(
            query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
            scale=scale, enable_gqa=enable_gqa,
        )  # fmt: skip

    F.scaled_dot_product_attention = attention
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


def attention_kernel(query: torch.Tensor, attn_mask: torch.Tensor | None, *, flash: bool) -> str:
    """The kernel CUDA's dispatcher picks for these arguments: "flash" (fp16 / bf16, no mask,
    head size <= 256, a GPU with flash attention) or "efficient" (memory-efficient)."""
    half = query.dtype in (torch.float16, torch.bfloat16)
    if flash and half and attn_mask is None and query.shape[-1] <= 256:
        return "flash"
    return "efficient"


def cuda_kernel_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    flash: bool = True,
) -> torch.Tensor | None:
    """Attention through CUDA's flash or memory-efficient kernel, or None for "as written"
    (grouped-query heads, odd head sizes, a bias CUDA would pad first)."""
    same_heads = key.shape[:-2] == query.shape[:-2] == value.shape[:-2]
    if enable_gqa or query.dim() != 4 or not same_heads or query.shape[-1] % 8:
        return None
    aten = torch.ops.aten
    if attention_kernel(query, attn_mask, flash=flash) == "flash":
        result = aten._scaled_dot_product_flash_attention(
            query, key, value, dropout_p, is_causal, False, scale=scale
        )
        return result[0]  # type: ignore[no-any-return]
    bias = attn_mask
    if bias is not None and bias.dtype == torch.bool:  # CUDA turns a boolean mask into a bias
        bias = torch.zeros(bias.shape, dtype=query.dtype, device=bias.device).masked_fill(
            bias.logical_not(), float("-inf")
        )
    if bias is not None and bias.dim() == 4 and bias.shape[-1] % 16:
        return None  # CUDA pads such a bias first: leave these to the math path
    needs_grad = query.requires_grad or key.requires_grad or value.requires_grad
    result = aten._scaled_dot_product_efficient_attention(
        query, key, value, bias, needs_grad and torch.is_grad_enabled(), dropout_p, is_causal,
        scale=scale,
    )  # fmt: skip
    return result[0]  # type: ignore[no-any-return]


@contextlib.contextmanager
def cuda_dropout() -> Iterator[None]:
    """Within the block, out-of-place training ``F.dropout`` runs CUDA's fused kernel
    (``aten.native_dropout``: the output and a boolean mask), as a CUDA input would."""
    original = F.dropout

    def dropout(
        input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False
    ) -> torch.Tensor:
        if training and not inplace and 0.0 < p < 1.0 and input.numel() > 0:
            out, _mask = torch.ops.aten.native_dropout(input, p, True)
            return out  # type: ignore[no-any-return]
        return original(input, p, training, inplace)

    F.dropout = dropout
    try:
        yield
    finally:
        F.dropout = original


@contextlib.contextmanager
def cuda_kernels(*, flash: bool = True) -> Iterator[None]:
    """The CUDA kernel choices a fake CPU run must make itself: attention and dropout."""
    with cuda_attention(flash=flash), cuda_dropout():
        yield


@contextlib.contextmanager
def bitsandbytes_cpu_update(target_type: str) -> Iterator[None]:
    """Inside, bitsandbytes' optimizer updates (8-bit blockwise and 32-bit) run their CPU
    implementations (ordinary torch ops, so the fake run allocates their temporaries) when the
    target is the CPU. Nothing changes for a CUDA target, without bitsandbytes, or where the
    version has no such implementation (its fake kernel then stands for an update that
    allocates nothing)."""
    import sys

    functional = sys.modules.get("bitsandbytes.functional")
    if target_type != "cpu" or functional is None:
        yield
        return
    try:
        from bitsandbytes.backends.cpu import ops as cpu_ops
    except ImportError:
        yield
        return
    swapped: dict[str, Any] = {}
    for name, cpu_name in (
        ("optimizer_update_8bit_blockwise", "_optimizer_update_8bit_blockwise_cpu"),
        ("optimizer_update_32bit", "_optimizer_update_32bit_cpu"),
    ):
        original, cpu_update = getattr(functional, name, None), getattr(cpu_ops, cpu_name, None)
        if original is not None and cpu_update is not None:
            swapped[name] = original
            setattr(functional, name, _calling(cpu_update, original))
    try:
        yield
    finally:
        for name, original in swapped.items():
            setattr(functional, name, original)


def _calling(implementation: Callable[..., None], original: Any) -> Callable[..., None]:
    """``implementation`` in place of ``original``: the arguments ``original`` was called with,
    passed by name (the CPU kernels take them in another order), and the one it computes
    itself (``param_norm``, read when ``max_unorm`` is set)."""
    takes = inspect.signature(original)
    wanted = inspect.signature(implementation).parameters

    @functools.wraps(original)
    def update(*args: Any, **kwargs: Any) -> None:
        bound = takes.bind(*args, **kwargs)
        bound.apply_defaults()
        given = dict(bound.arguments)
        if "param_norm" in wanted and "param_norm" not in given:
            norm = given.get("max_unorm", 0.0) > 0.0
            given["param_norm"] = torch.norm(given["p"].data.float()) if norm else 0.0
        implementation(**{name: given[name] for name in wanted if name in given})

    return update


@contextlib.contextmanager
def grouped_mm_any_dtype() -> Iterator[None]:
    """Within the block, fake ``aten._grouped_mm`` accepts any float dtype (see the module
    docstring); bf16 and scaled calls still take torch's own meta implementation."""
    from torch._meta_registrations import _create_grouped_mm_output_tensor
    from torch._subclasses import fake_impls
    from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

    op = torch.ops.aten._grouped_mm.default
    table = fake_impls.op_implementations_dict
    if op in table:  # torch has a rule of its own now: keep it
        yield
        return

    def grouped_mm(fake_mode: Any, func: Any, mat_a: torch.Tensor, mat_b: torch.Tensor,
                   offs: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                   out_dtype: torch.dtype | None = None) -> Any:  # fmt: skip
        if mat_a.dtype == torch.bfloat16 or bias is not None or offs is None:
            return NotImplemented  # the meta implementation's own checks and result
        with in_kernel_invocation_manager(fake_mode):
            out = _create_grouped_mm_output_tensor(mat_a, mat_b, offs, out_dtype)  # type: ignore[no-untyped-call]
        return FakeTensor(fake_mode, out, mat_a.device)

    table[op] = grouped_mm
    try:
        yield
    finally:
        table.pop(op, None)


@contextlib.contextmanager
def sparse_tensors() -> Iterator[None]:
    """Within the block, fake sparse COO tensors (an embedding's sparse gradient, the
    optimizer state made from it) hold as many entries as the CPU kernels give them; see the
    module docstring. Enter it above the recorder, so the recorder sees the buffers the
    in-place rules make before the ones they replace are freed."""
    from torch._subclasses import fake_impls

    aten = torch.ops.aten
    rules = {aten.clone.default: _sparse_copy, aten._coalesce.default: _sparse_copy,
             aten.sparse_mask.default: _sparse_mask}  # fmt: skip
    table = fake_impls.op_implementations_dict
    added = [op for op in rules if op not in table]  # torch's own rules, where it has them
    table.update({op: rules[op] for op in added})
    try:
        with rewriting_ops(_sparse_in_place):
            yield
    finally:
        for op in added:
            table.pop(op, None)


def _is_sparse(tensor: Any) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.layout == torch.sparse_coo


def _sparse_like(like: torch.Tensor, indices: torch.Tensor, values: torch.Tensor,
                 coalesced: bool) -> Any:  # fmt: skip
    """A sparse COO tensor of ``like``'s shape, dims and device over these indices and
    values."""
    return torch.ops.aten._sparse_coo_tensor_with_dims_and_tensors.default(
        like.sparse_dim(), like.dense_dim(), list(like.shape), indices, values,
        dtype=values.dtype, layout=torch.sparse_coo, device=like.device, is_coalesced=coalesced,
    )  # fmt: skip


def _sparse_copy(fake_mode: Any, func: Any, tensor: Any, *args: Any, **kwargs: Any) -> Any:
    """``clone`` / ``coalesce`` of a fake sparse tensor: new indices and values, every entry."""
    if not _is_sparse(tensor):
        return NotImplemented
    coalesced = func is torch.ops.aten._coalesce.default or tensor.is_coalesced()
    with fake_mode:
        return _sparse_like(tensor, tensor._indices().clone(), tensor._values().clone(),
                            coalesced)  # fmt: skip


def _sparse_mask(fake_mode: Any, func: Any, dense: Any, mask: Any) -> Any:
    """``dense.sparse_mask(mask)``: the mask's indices, a new value per entry of the mask."""
    if not _is_sparse(mask) or _is_sparse(dense):
        return NotImplemented
    with fake_mode:
        values = dense.new_empty((mask._nnz(), *dense.shape[mask.sparse_dim() :]))
        return _sparse_like(mask, mask._indices(), values, mask.is_coalesced())


def _sparse_in_place(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
    """After ``mul_`` / ``add_`` on a fake sparse tensor (which keeps its buffers), give it new
    indices and values, as the CPU kernels do: as many entries for ``mul_``, room for both
    operands' for ``add_`` of a sparse tensor; the old buffers are freed after."""
    aten = torch.ops.aten
    if func is not aten.mul_.Tensor and func is not aten.add_.Tensor:
        return out
    tensor, other = args[0], args[1]
    if not _is_sparse(tensor) or tensor._nnz() == 0:
        return out
    entries = tensor._nnz()
    if func is aten.add_.Tensor:
        if not _is_sparse(other):
            return out
        entries += other._nnz()
    elif _is_sparse(other):
        return out
    old = tensor._indices(), tensor._values()  # alive until the new ones exist
    indices, values = old
    # zero-stride sources: the copy allocates the new buffers, the sources nothing
    source = _sparse_like(
        tensor,
        indices.as_strided((indices.shape[0], entries), (0, 0)),
        values.as_strided((entries, *values.shape[1:]), (0,) * values.dim()),
        coalesced=False,
    )
    aten.copy_sparse_to_sparse_(tensor, source)
    del old, indices, values, source
    return out
