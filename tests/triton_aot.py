"""Triton kernels compiled for a GPU on a machine without one: Triton's own
compiler (to PTX, then to machine code by the ``ptxas`` its NVIDIA backend
bundles), what the interpreter the CPU tests use does not run. The
arguments are specialised as a launch would (ints equal to 1, multiples of
16, 16-byte aligned pointers), from CPU tensors of the real shapes.
Relies on Triton 3.x internals (``JITFunction``'s binder)."""
import collections
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import JITFunction, create_function_from_signature


def nvidia_tool(name):
    return os.path.join(os.path.dirname(triton.__file__), 'backends',
                        'nvidia', 'bin', name)


def compile_launch(fn, args, kwargs, arch=90):
    """``fn`` (plain Python, not yet ``triton.jit``) compiled for
    ``sm_{arch}`` as launched with ``args`` and ``kwargs``."""
    jit = JITFunction(fn)  # not triton.jit: TRITON_INTERPRET=1 here
    target = GPUTarget('cuda', arch, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(jit.signature, jit.params,
                                            backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = jit._pack_args(
        backend, kwargs, bound, specialization, options)
    return triton.compile(ASTSource(jit, signature, constexprs, attrs),
                          target=target, options=options.__dict__)


def machine_code(kernel):
    """``{regs, local, ...}`` a thread uses (``cuobjdump`` of the cubin;
    ``local`` > 0: registers spilled to memory), the global loads and
    stores of the PTX by width (``ld.global.v4.b32``: 16 bytes a thread)
    and the PTX's math instructions and library calls by name."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, 'kernel.cubin')
        with open(path, 'wb') as f:
            f.write(kernel.asm['cubin'])
        usage = subprocess.run(
            [nvidia_tool('cuobjdump'), '--dump-resource-usage', path],
            capture_output=True, text=True, check=True).stdout
    found = re.search(r'REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)',
                      usage)
    if found is None:
        raise RuntimeError(f'no resource usage in cuobjdump output:\n{usage}')
    ptx = kernel.asm['ptx']
    return dict(
        regs=int(found[1]), stack=int(found[2]), local=int(found[4]),
        memory=collections.Counter(
            re.findall(r'\b((?:ld|st)\.global[.\w]*)', ptx)),
        math=collections.Counter(re.findall(
            r'\b((?:ex2|lg2|rcp|sqrt|div)\.[\w.]+|__nv_\w+)', ptx)),
        # the asynchronous copies to shared memory a pipelined GEMM loads
        # its tiles with (cp.async.cg: 16 bytes a thread), its MMAs
        copies=collections.Counter(re.findall(
            r'\b(cp\.async\.c[ag]\.shared\.global)', ptx)),
        mma=collections.Counter(re.findall(r'\b((?:wg)?mma\.[\w.]+)', ptx)))


def launches_of(step):
    """``{kernel name: (fn, grid, args, kwargs)}`` of the Triton launches
    of ``step()`` (the term's and the fused classifier's), captured
    instead of run (their outputs stay unwritten)."""
    from mmseg_stag.core import classifier_triton, stag_triton
    launches = {}

    class Capture:
        def __init__(self, fn):
            self.fn = fn

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches[self.fn.__name__] = (self.fn, grid, args, kwargs)
            return launch
    modules = (stag_triton, classifier_triton)
    kernels = [module._kernel for module in modules]
    for module in modules:
        module._kernel = Capture
    try:
        step()
    finally:
        for module, kernel in zip(modules, kernels):
            module._kernel = kernel
    return launches


#: the term's kernels as a GPU would launch them: (features, logits
#: shapes, features' dtype, logits' dtype, classifier, SMs, arch)
CASES = {
    # SegFormer-B5 per pixel at 960x540, bf16 autocast, on an H100
    'b5_bf16_h100': ((1, 768, 32400), (1, 19, 32400), 'bfloat16',
                     'float32', 'frozen', 132, 90),
    # the same on an A100
    'b5_bf16_a100': ((1, 768, 32400), (1, 19, 32400), 'bfloat16',
                     'float32', 'frozen', 108, 80),
    # ResNet-50 per sample, batch 64, ImageNet, float32
    'resnet50_fp32_h100': ((64, 2048, 1), (64, 1000, 1), 'float32',
                           'float32', 'frozen', 132, 90),
    # float64, the classifier trained (projections from a matrix)
    'fp64_trained_h100': ((2, 64, 1024), (2, 19, 1024), 'float64',
                          'float64', 'trained', 132, 90),
    # the B5 with ||h|| tapped beside the classifier (stag.norm_tap)
    'b5_bf16_tapped_h100': ((1, 768, 32400), (1, 19, 32400), 'bfloat16',
                            'float32', 'frozen+tap', 132, 90),
}


def compile_case(name):
    """``{kernel name: dict(grid, constexprs, **machine_code)}``."""
    import torch
    from mmseg_stag.core import stag_triton
    h_shape, z_shape, h_dtype, z_dtype, classifier, sms, arch = CASES[name]
    h = torch.zeros(h_shape, dtype=getattr(torch, h_dtype))
    z = torch.zeros(z_shape, dtype=getattr(torch, z_dtype))
    c = z_shape[1]
    table, eps = torch.zeros(c, 3, dtype=z.dtype), torch.tensor(1e-8)
    matrix = torch.zeros(c, h_shape[1], dtype=h.dtype) \
        if classifier == 'trained' else None
    tapped = classifier.endswith('+tap')
    norm = torch.zeros(h_shape[0], 1, h_shape[2], dtype=z.dtype) \
        if tapped else None
    multiprocessors = stag_triton._multiprocessors
    stag_triton._multiprocessors = lambda tensor: sms

    def step():
        loss, saved = stag_triton.hard_alignment_forward(
            h, z, table, 1e-8, eps.to(z.dtype), matrix, matrix is not None,
            False, norm)
        stag_triton.hard_alignment_backward(
            torch.ones((), dtype=z.dtype), h, *saved, tapped)
    try:
        launches = launches_of(step)
    finally:
        stag_triton._multiprocessors = multiprocessors
    out = {}
    for kernel, (fn, grid, args, kwargs) in launches.items():
        code = machine_code(compile_launch(fn, args, kwargs, arch))
        out[kernel] = dict(grid=list(grid), constexprs={
            k: v for k, v in kwargs.items() if k.startswith('BLOCK')},
            **code)
    return out


#: the fused classifier's kernels (``stag.norm_tap='fused'``) as a GPU
#: would launch them: (module, its input's shape, dtype, SMs, arch)
CLASSIFIER_CASES = {
    # the B5's decode head classifier at 960x540 (1/4 resolution), bf16
    'b5_bf16_classifier_h100': (('Conv2d', 768, 19), (1, 768, 135, 240),
                                'bfloat16', 132, 90),
    'b5_bf16_classifier_a100': (('Conv2d', 768, 19), (1, 768, 135, 240),
                                'bfloat16', 108, 80),
    # ResNet-50's fc at batch 64 in float32 (TF32 off)
    'resnet50_fp32_classifier_h100': (('Linear', 2048, 1000), (64, 2048),
                                      'float32', 132, 90),
    'fp64_classifier_h100': (('Conv2d', 64, 19), (2, 64, 32, 32), 'float64',
                             132, 90),
}


def compile_classifier_case(name):
    """``{kernel name: dict(grid, constexprs, **machine_code)}`` of the
    fused classifier's forward and backward (``||h||``'s gradient
    given)."""
    import torch
    from torch import nn

    from mmseg_stag.core import classifier_triton
    (kind, dim, classes), shape, dtype, sms, arch = CLASSIFIER_CASES[name]
    dtype = getattr(torch, dtype)
    module = getattr(nn, kind)(dim, classes, 1) if kind == 'Conv2d' else \
        nn.Linear(dim, classes)
    module = module.to(dtype).requires_grad_(False)
    features = torch.zeros(shape, dtype=dtype, requires_grad=True)
    check = classifier_triton.check_device
    multiprocessors = classifier_triton._multiprocessors
    classifier_triton.check_device = lambda tensor: None
    classifier_triton._multiprocessors = lambda tensor: sms

    def step():
        logits, norm = classifier_triton.classify_with_norm(module, features)
        torch.autograd.backward([logits, norm], [torch.zeros_like(logits),
                                                 torch.zeros_like(norm)])
    try:
        launches = launches_of(step)
    finally:
        classifier_triton.check_device = check
        classifier_triton._multiprocessors = multiprocessors
    return {kernel: dict(grid=list(grid), constexprs={
        k: v for k, v in kwargs.items() if k.startswith('BLOCK')},
        **machine_code(compile_launch(fn, args, kwargs, arch)))
        for kernel, (fn, grid, args, kwargs) in launches.items()}


if __name__ == '__main__':
    # one process for all cases, without TRITON_INTERPRET: in a process
    # where the interpreter is on, Triton's own jitted helpers (tl.max,
    # ...) are interpreted and the compiler cannot call them
    import json
    import sys
    names = sys.argv[1:] or list(CASES) + list(CLASSIFIER_CASES)
    json.dump({name: compile_case(name) if name in CASES else
               compile_classifier_case(name) for name in names},
              sys.stdout, indent=1)
