"""A Python interpreter with torch, MMEngine and MMSeg already imported that
runs a test's ``python tools/<script>.py ...`` in a forked child.

Started by :mod:`tool_runs` (one per environment). Importing those three
takes ~3.2 s of the ~3.4 s a tool spends before its first line of work;
a run then imports ``torch._dynamo`` and pyplot (~1.4 s), preloaded too;
the suite starts ~100 tool processes. A fork of this process is a fresh
process (own pid, memory, exit status, ``atexit`` handlers, interpreter
finalisation) that has these modules loaded; the script then runs exactly
as ``python SCRIPT ARGS`` would: ``__main__``, ``sys.argv``, ``sys.path``
(the script's folder, then ``PYTHONPATH``), working directory and
environment are the request's, and it imports everything else itself
(``mmseg_stag`` included: registration through ``custom_imports`` is what
it always is). :mod:`tool_runs` sends here only what that holds for.

Protocol (one JSON object per line): first ``{"modules": [...], "fork_safe":
...}``, the top-level modules loaded and whether a fork can use CUDA (false if
the preloading started the CUDA driver); then per request ``{"argv", "cwd",
"env", "stdout", "stderr"}`` (the last two: files that take the streams); the
replies ``{"pid": PID}`` when the child starts and ``{"rc": CODE}`` when it
ended (``-N`` for a signal, as ``subprocess`` reports it).
"""
import json
import os
import sys

#: what the tools import before their work; never ``mmseg_stag`` nor any
#: package a test hides (ray, mmseg's absence is tested in real processes)
PRELOAD = ('torch', 'mmengine.runner', 'mmengine.optim', 'mmseg.models',
           'mmseg.datasets', 'mmseg.evaluation', 'mmseg.visualization',
           # what every run imports later: torch.optim's first optimizer
           # imports dynamo, MMEngine's visualizer pyplot (~1.4 s a run)
           'torch._dynamo', 'matplotlib.pyplot')


def base_path():
    """``sys.path`` without this script's folder and ``PYTHONPATH``: what
    any script's own entries are put before."""
    extra = {os.path.abspath(p) for p in
             os.environ.get('PYTHONPATH', '').split(os.pathsep) if p}
    return [p for p in sys.path[1:] if os.path.abspath(p) not in extra]


def cuda_driver_started() -> bool:
    """Whether this process has initialised the CUDA driver: a forked child
    of it could not use CUDA. (``torch.cuda.is_available()`` can do that
    without starting torch's CUDA state; ``cuDeviceGetCount`` answers
    CUDA_ERROR_NOT_INITIALIZED = 3 before ``cuInit``.)"""
    import ctypes
    try:
        driver = ctypes.CDLL('libcuda.so.1',
                             mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return False  # not even loaded
    count = ctypes.c_int()
    return driver.cuDeviceGetCount(ctypes.byref(count)) != 3


def reply(message):
    sys.stdout.write(json.dumps(message) + '\n')
    sys.stdout.flush()


def serve():
    """Answer requests until stdin closes; in a forked child, return its
    request (the parent never returns one)."""
    for line in sys.stdin:
        request = json.loads(line)
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            return request
        reply(dict(pid=pid))
        _, status = os.waitpid(pid, 0)
        reply(dict(rc=os.waitstatus_to_exitcode(status)))
    return None


def become(request, path):
    """Turn this forked child into ``python ARGV`` as the request says."""
    script, *args = request['argv'][1:]
    os.chdir(request['cwd'])
    os.environ.clear()
    os.environ.update(request['env'])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, name in ((1, 'stdout'), (2, 'stderr')):
        out = os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                      0o644)
        os.dup2(out, fd)
        os.close(out)
    os.close(null)
    extra = [os.path.abspath(p) for p in
             request['env'].get('PYTHONPATH', '').split(os.pathsep) if p]
    sys.path[:] = [os.path.dirname(os.path.abspath(script))] + extra + path
    sys.argv[:] = [script] + args
    return os.path.abspath(script)


def run_main(path):
    """Run the file as Python runs a script: a new ``__main__`` module
    (``__file__`` absolute, no ``__spec__``), ``sys.argv`` untouched."""
    import builtins
    import importlib.machinery
    import types
    main = types.ModuleType('__main__')
    main.__dict__.update(
        __file__=path, __builtins__=builtins, __cached__=None,
        __loader__=importlib.machinery.SourceFileLoader('__main__', path))
    sys.modules['__main__'] = main
    with open(path, 'rb') as f:
        code = compile(f.read(), path, 'exec')
    exec(code, main.__dict__)


if __name__ == '__main__':
    import importlib

    # a CUDA check while preloading asks NVML, not the driver (the forks
    # get the run's own environment back)
    os.environ['PYTORCH_NVML_BASED_CUDA_CHECK'] = '1'
    for name in PRELOAD:
        importlib.import_module(name)
    PATH = base_path()
    reply(dict(modules=sorted({m.split('.')[0] for m in sys.modules}),
               fork_safe=not cuda_driver_started()))
    REQUEST = serve()
    if REQUEST is None:
        sys.exit(0)
    run_main(become(REQUEST, PATH))
