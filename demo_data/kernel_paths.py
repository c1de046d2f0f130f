"""The demos' numeric kernel paths, pinned: the same digits on every x86-64
processor.

The numeric libraries under torch, NumPy and OpenCV choose their kernels
by the processor they run on: ATen's vectorised kernels (and its random
normal fill) by the instruction set (AVX-512, AVX2, none), oneDNN's
convolutions by the instruction set, MKL's GEMM by the instruction set and
the vendor, OpenBLAS (NumPy's ``@``) by the core, NumPy's and OpenCV's SIMD
loops and OpenCV's IPP by the instruction set, and all of them reduce in
another order with another thread count. Each path rounds differently,
and the demos train their models on the CPU, which carries a last-digit
difference on into another count of correct images or another chosen β0.
So the demos (``tools/demo.py``, ``tools/demo_cls.py``) and the tests that
compare them with recorded numbers run with every one of these paths fixed
to one that every x86-64-v2 processor (Intel or AMD, since 2009) has:

==========================  =============================================
ATen                        ``ATEN_CPU_CAPABILITY=default`` (no AVX2 or
                            AVX-512 kernels)
oneDNN                      ``ONEDNN_MAX_CPU_ISA=SSE41``
MKL                         on Intel ``MKL_CBWR=COMPATIBLE,STRICT`` (its
                            processor-independent branch, any memory
                            alignment); on other vendors
                            ``MKL_ENABLE_INSTRUCTIONS=SSE4_2`` (see below)
OpenBLAS (NumPy, SciPy)     ``OPENBLAS_CORETYPE=Nehalem``
NumPy                       its dispatched targets above the baseline off
                            (``NPY_DISABLE_CPU_FEATURES``)
OpenCV                      its dispatched SIMD off (``OPENCV_CPU_DISABLE``,
                            the ones this processor has), IPP at SSE4.2
threads                     one everywhere (OpenMP, MKL, OpenBLAS, OpenCV)
==========================  =============================================

MKL tells processors apart by vendor, and its ``COMPATIBLE`` branch is not
the same code on an AMD processor as on an Intel one: the reduced
classification demo, pinned, gave other counts on an Intel Xeon (AVX-512)
than on the AMD EPYC (AVX-512) that recorded it, and exactly the numbers
that AMD processor gave with MKL capped at SSE4.2 instead (every one;
the other pinned paths the same; tests/demo/kernel_spread.py's
``all-lowest`` run of 2026-11-28 against this Intel machine's pinned run
of 2026-12-07). So the pin takes ``COMPATIBLE`` on Intel and SSE4.2
elsewhere: the same digits on both (the segmentation demo's were the
same under either on that AMD processor).

What stays outside the pin: glibc's ``libm``, which takes its FMA variants
on every processor with AVX2, and the package versions, which
``constraints.txt`` pins. ``--native-kernels`` on the demos runs them on
this processor's fastest paths instead: its numbers are then this
machine's own. Stdlib only: imported before NumPy or torch, which read
these variables once, when they load.

A command of your own on the same paths (a demo row's config by hand)::

    python demo_data/kernel_paths.py .venv/bin/python tools/test.py CONFIG CKPT
"""
import os
import sys
from typing import Dict, Mapping, Optional

#: the variables the pin sets, whatever the environment says
PINNED = {
    'OMP_NUM_THREADS': '1',
    'MKL_NUM_THREADS': '1',
    'OPENBLAS_NUM_THREADS': '1',
    'OPENCV_FOR_THREADS_NUM': '1',
    'ATEN_CPU_CAPABILITY': 'default',
    'ONEDNN_MAX_CPU_ISA': 'SSE41',
    'OPENBLAS_CORETYPE': 'Nehalem',
    # NumPy 2.4's dispatch targets above its x86-64-v2 baseline; one that
    # this processor lacks is ignored silently
    'NPY_DISABLE_CPU_FEATURES': 'X86_V3 X86_V4 AVX512_ICL AVX512_SPR',
    'OPENCV_IPP': 'sse42',
}
#: MKL's pinned branch by the vendor MKL sees (``/proc/cpuinfo``'s
#: ``vendor_id``): Intel's processor-independent branch, and on the others
#: the SSE4.2 path that gives its digits (the module's docstring)
MKL_INTEL = {'MKL_CBWR': 'COMPATIBLE,STRICT'}
MKL_OTHER = {'MKL_ENABLE_INSTRUCTIONS': 'SSE4_2'}
#: variables that choose a kernel path, unset by the pin unless it sets
#: them (a user's ``MKL_ENABLE_INSTRUCTIONS=AVX512`` is no longer read)
CLEARED = ('MKL_ENABLE_INSTRUCTIONS', 'MKL_CBWR', 'DNNL_MAX_CPU_ISA',
           'MKL_DEBUG_CPU_TYPE', 'NPY_ENABLE_CPU_FEATURES', 'MKL_DYNAMIC',
           'OMP_DYNAMIC')
#: the ``/proc/cpuinfo`` flags of AVX-512 as ATen's and OpenCV's AVX-512
#: paths need them (Skylake-X's set)
AVX512_FLAGS = ('avx512f', 'avx512cd', 'avx512bw', 'avx512dq', 'avx512vl')
#: OpenCV's dispatched features (opencv-python 5.0: SSE4_1 ... AVX512_SKX)
#: and the ``/proc/cpuinfo`` flags that say the processor has them: OpenCV
#: warns at import about disabling one the processor lacks
OPENCV_FEATURES = (
    ('SSE4.1', ('sse4_1', )), ('SSE4.2', ('sse4_2', )),
    ('POPCNT', ('popcnt', )), ('FP16', ('f16c', )), ('AVX', ('avx', )),
    ('AVX2', ('avx2', )), ('FMA3', ('fma', )), ('AVX512F', ('avx512f', )),
    ('AVX512-SKX', AVX512_FLAGS))
#: marks a process started with the pin (the demos' re-exec is done once)
MARK = 'MMSEG_STAG_KERNEL_PATHS'


def cpuinfo_field(name: str) -> Optional[str]:
    """The first ``name`` line's value in ``/proc/cpuinfo`` (None where
    there is none)."""
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.split(':', 1)[0].strip() == name:
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags() -> frozenset:
    """The first ``flags`` line of ``/proc/cpuinfo`` (empty where none)."""
    return frozenset((cpuinfo_field('flags') or '').split())


def mkl_pin(vendor: Optional[str] = None) -> Dict[str, str]:
    """MKL's pinned variables for ``vendor`` (default: this processor's
    ``vendor_id``): :data:`MKL_INTEL` for ``GenuineIntel``, else
    :data:`MKL_OTHER`."""
    vendor = cpuinfo_field('vendor_id') if vendor is None else vendor
    return dict(MKL_INTEL if vendor == 'GenuineIntel' else MKL_OTHER)


def instruction_set(flags: Optional[frozenset] = None) -> str:
    """The widest vector instruction set the processor has, as ATen names
    its kernel paths: ``'AVX512'``, ``'AVX2'`` or ``'below AVX2'``."""
    flags = cpu_flags() if flags is None else flags
    if set(AVX512_FLAGS) <= flags:
        return 'AVX512'
    return 'AVX2' if {'avx2', 'fma'} <= flags else 'below AVX2'


def opencv_disable(flags: Optional[frozenset] = None) -> str:
    """``OPENCV_CPU_DISABLE``: OpenCV's dispatched features this processor
    has (all of them off: its baseline SSE3 code runs)."""
    flags = cpu_flags() if flags is None else flags
    return ','.join(name for name, need in OPENCV_FEATURES
                    if set(need) <= flags)


def pinned_env(env: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """``env`` (``os.environ`` by default) with the kernel paths pinned."""
    out = {k: v for k, v in (os.environ if env is None else env).items()
           if k not in CLEARED}
    out.update(PINNED)
    out.update(mkl_pin())
    disable = opencv_disable()
    if disable:
        out['OPENCV_CPU_DISABLE'] = disable
    else:
        out.pop('OPENCV_CPU_DISABLE', None)
    out[MARK] = 'pinned'
    return out


def is_pinned(env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether ``env`` already holds the pin (and nothing it clears)."""
    env = os.environ if env is None else env
    pinned = pinned_env(env)
    return all(env.get(k) == v for k, v in pinned.items()) and \
        not any(k in env for k in CLEARED if k not in pinned)


def describe(pinned: bool = True) -> str:
    """One line for a log and for a recording's provenance."""
    if not pinned:
        return (f'native ({instruction_set()} processor, its own fastest '
                'paths and thread count)')
    return ('pinned (ATen default, oneDNN SSE4.1, MKL COMPATIBLE on Intel '
            'and SSE4.2 elsewhere, OpenBLAS Nehalem, NumPy and OpenCV '
            'baseline SIMD, one thread)')


def pin_or_reexec(native: bool = False, log=print) -> None:
    """Make this process run on the pinned kernel paths: nothing to do when
    its environment holds the pin already; otherwise start the same command
    again with it (``os.execve``) before NumPy or torch is imported, which
    read it once. ``native=True`` keeps this processor's own paths."""
    if native:
        log(f'[kernels] {describe(False)}: these numbers are this '
            'machine\'s own (the recorded tables are made on the pinned '
            'paths, without --native-kernels)')
        return
    if is_pinned():
        log(f'[kernels] {describe(True)}: the same digits on every x86-64 '
            'processor (demo_data/kernel_paths.py)')
        return
    loaded = [m for m in ('numpy', 'torch', 'cv2') if m in sys.modules]
    if os.environ.get(MARK) or loaded and not sys.argv[0].endswith('.py'):
        # a second start would not change it, or no script to start again
        raise RuntimeError(
            'the pinned kernel paths could not be set for this process ('
            + (f'{", ".join(loaded)} already imported' if loaded else
               'its environment was changed after the pin') +
            '): run the demo as a script, `python tools/demo.py ...`')
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable] + sys.argv, pinned_env())


if __name__ == '__main__':
    if len(sys.argv) < 2:
        sys.exit('usage: python demo_data/kernel_paths.py COMMAND [ARGS...]: '
                 'runs COMMAND on the pinned kernel paths')
    os.execvpe(sys.argv[1], sys.argv[1:], pinned_env())
