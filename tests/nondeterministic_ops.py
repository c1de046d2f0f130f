"""PyTorch's list of the aten ops that raise on CUDA in deterministic mode,
and :func:`raises_on_cuda`: what tests/segmentation/test_determinism.py
checks a whole stream against on the CPU (the package itself only names
what may remain: ``engine.determinism.REMAINING_NONDETERMINISTIC_OPS``)."""
from typing import Any, Dict, Mapping, Optional, Tuple

#: aten ops that raise on CUDA in deterministic mode: torch 2.13's
#: ``use_deterministic_algorithms`` list (its wording) plus ``kthvalue``;
#: conditional entries are narrowed by :func:`raises_on_cuda`.
NONDETERMINISTIC_CUDA_OPS: Dict[str, str] = {
    'avg_pool3d_backward': 'AvgPool3d backward',
    '_adaptive_avg_pool2d_backward': 'AdaptiveAvgPool2d backward',
    '_adaptive_avg_pool3d_backward': 'AdaptiveAvgPool3d backward',
    'adaptive_max_pool2d_backward': 'AdaptiveMaxPool2d backward',
    'fractional_max_pool2d_backward': 'FractionalMaxPool2d backward',
    'fractional_max_pool3d_backward': 'FractionalMaxPool3d backward',
    'max_unpool2d': 'MaxUnpool1d / MaxUnpool2d',
    'max_unpool3d': 'MaxUnpool3d',
    'upsample_linear1d_backward': "interpolate(mode='linear') backward",
    'upsample_bilinear2d_backward': "interpolate(mode='bilinear') backward",
    'upsample_bicubic2d_backward': "interpolate(mode='bicubic') backward",
    'upsample_trilinear3d_backward': "interpolate(mode='trilinear') backward",
    'reflection_pad1d_backward': 'ReflectionPad1d backward',
    'reflection_pad2d_backward': 'ReflectionPad2d backward',
    'reflection_pad3d_backward': 'ReflectionPad3d backward',
    'nll_loss2d_forward': 'NLLLoss (2-D, reduced)',
    '_ctc_loss_backward': 'CTCLoss backward',
    '_embedding_bag_backward': "EmbeddingBag(mode='max') backward",
    '_embedding_bag_dense_backward': "EmbeddingBag(mode='max') backward",
    'put_': 'Tensor.put_',
    'put': 'Tensor.put_',
    'histc': 'histc',
    'bincount': 'bincount with weights',
    'median': 'median with indices',
    'kthvalue': 'kthvalue',
    'grid_sampler_2d_backward': 'grid_sample backward',
    'grid_sampler_3d_backward': 'grid_sample backward',
    'cumsum': 'cumsum of a floating-point tensor',
    'scatter_reduce': "scatter_reduce(reduce='prod')",
}

#: backward ops ``F.interpolate`` never reaches on CUDA in deterministic
#: mode (bilinear, trilinear: a decomposition with a deterministic backward)
ROUTED_BY_INTERPOLATE = ('upsample_bilinear2d_backward',
                         'upsample_trilinear3d_backward')


def raises_on_cuda(func, args: Tuple = (),
                   kwargs: Optional[Mapping[str, Any]] = None
                   ) -> Optional[str]:
    """Return why an aten call (``func``, an ``OpOverload`` as a
    ``TorchDispatchMode`` sees it) would raise on CUDA in deterministic
    mode: the op's wording in the list, or None if it would not."""
    op = func.overloadpacket.__name__
    if op not in NONDETERMINISTIC_CUDA_OPS:
        return None
    named = {a.name: v for a, v in zip(func._schema.arguments, args)}
    named.update(kwargs or {})
    if op == 'bincount':
        holds = named.get('weights') is not None
    elif op == 'median':  # only the overloads with indices
        holds = 'dim' in named
    elif op == 'cumsum':  # floating point or complex, given or cast to
        dtype = named.get('dtype') or named['self'].dtype
        holds = dtype.is_floating_point or dtype.is_complex
    elif op == 'scatter_reduce':
        holds = named.get('reduce') == 'prod'
    elif op == 'nll_loss2d_forward':  # reduction 'none' is deterministic
        holds = named.get('reduction', 1) != 0
    elif op in ('_embedding_bag_backward', '_embedding_bag_dense_backward'):
        holds = named.get('mode') == 2  # 'max'
    else:
        holds = True
    return NONDETERMINISTIC_CUDA_OPS[op] if holds else None
