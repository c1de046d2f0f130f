"""``run(cmd, ...)``: ``subprocess.run`` for the tests' ``python SCRIPT ARGS``
runs, started as a fork of a process that has torch, MMEngine and MMSeg
imported (``tool_server.py``) where that gives the same process.

A server is started with the environment of the first run that needs it
and serves the runs whose environment differs from it only in variables
that the preloaded modules do not read (:data:`RUN_TIME_VARIABLES`); a test
process keeps a few. A run goes through one only if it is a plain
``[sys.executable, 'x.py', ...]`` with captured text output and no input,
its ``PYTHONPATH`` shadows no preloaded module, and the preloading did
not start the CUDA driver (a fork could not use CUDA); anything else runs
as a real subprocess, as does everything when ``MMSEG_STAG_TESTS_FORK=0``.
The saving: ~3 s of imports per tool run (docs/tests.md).
"""
import atexit
import collections
import importlib.util
import json
import os
import os.path as osp
import select
import signal
import subprocess
import sys
import tempfile
import time

SERVER = osp.join(osp.dirname(osp.abspath(__file__)), 'tool_server.py')
#: read at run time only, by code the server has not imported (PYTHONPATH
#: the child applies itself). Not CUDA_VISIBLE_DEVICES: importing MMCV asks
#: whether CUDA is available and keeps the answer
RUN_TIME_VARIABLES = ('KILL_AT_STAGE', 'PYTHONPATH', 'PYTHONUNBUFFERED',
                      'RAY_DEDUP_LOGS', 'LOCAL_RANK')
RUN_TIME_PREFIXES = ('PYTEST_', 'MMSEG_STAG_', 'GPU_CHECK_')
#: servers kept per test process (each holds ~0.5 GB)
MAX_SERVERS = 3


def import_time_env(env) -> tuple:
    """The variables of ``env`` that importing the preloaded modules may
    read: two environments with the same value here load them alike."""
    env = {k: v for k, v in env.items() if k not in RUN_TIME_VARIABLES
           and not k.startswith(RUN_TIME_PREFIXES)}
    if env.get('OMP_NUM_THREADS') == '1' and \
            env.get('MKL_NUM_THREADS', '1') == '1':
        env.pop('MKL_NUM_THREADS', None)  # MKL follows OpenMP's one thread
    return tuple(sorted(env.items()))


def shadows(path_entries, modules) -> bool:
    """Whether a ``PYTHONPATH`` entry holds a module or regular package the
    server preloaded (a real process would import that one instead)."""
    for entry in path_entries:
        for name in os.listdir(entry) if osp.isdir(entry) else ():
            module = name.split('.')[0]
            if module in modules and (
                    name.endswith(('.py', '.so')) or
                    osp.isfile(osp.join(entry, name, '__init__.py'))):
                return True
    return False


class _Server:
    """One forking server (``tool_server.py``) and its environment."""

    def __init__(self, env):
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, SERVER], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.log, env=env, text=True,
            cwd=osp.dirname(SERVER))
        hello = self._reply()
        self.modules, self.fork_safe = set(hello['modules']), \
            hello['fork_safe']

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)

    def _reply(self, deadline=None):
        if deadline is not None:
            left = max(0.0, deadline - time.monotonic())
            if not select.select([self.proc.stdout], [], [], left)[0]:
                return None
        line = self.proc.stdout.readline()
        if not line:
            self.log.seek(0)
            raise RuntimeError('the tool server stopped: ' +
                               self.log.read().decode(errors='replace'))
        return json.loads(line)

    def run(self, cmd, cwd, env, timeout):
        with tempfile.TemporaryDirectory() as tmp:
            streams = {name: osp.join(tmp, name)
                       for name in ('stdout', 'stderr')}
            self.proc.stdin.write(json.dumps(dict(
                argv=cmd, cwd=cwd, env=env, **streams)) + '\n')
            self.proc.stdin.flush()
            pid = self._reply()['pid']
            deadline = None if timeout is None else time.monotonic() + timeout
            done = self._reply(deadline)
            if done is None:
                os.kill(pid, signal.SIGKILL)
                self._reply()
            out, err = (_read(streams[name]) for name in ('stdout', 'stderr'))
            if done is None:
                raise subprocess.TimeoutExpired(cmd, timeout, out, err)
            return subprocess.CompletedProcess(cmd, done['rc'], out, err)


def _read(path):
    with open(path) as f:  # text=True: the locale's encoding, as subprocess
        return f.read()


#: import-time environment -> server, least recently used first
_SERVERS: 'collections.OrderedDict[tuple, _Server]' = collections.OrderedDict()


def _close_all():
    for server in _SERVERS.values():
        server.close()


atexit.register(_close_all)


def _server(env) -> _Server:
    key = import_time_env(env)
    if key in _SERVERS:
        _SERVERS.move_to_end(key)
    else:
        if len(_SERVERS) == MAX_SERVERS:
            _SERVERS.popitem(last=False)[1].close()
        _SERVERS[key] = _Server(env)
    return _SERVERS[key]


def run(cmd, *, cwd=None, env=None, timeout=None, capture_output=False,
        text=False, **kwargs):
    """``subprocess.run(cmd, ...)``; through a server when that gives the
    same process (see the module's docstring)."""
    env = dict(os.environ if env is None else env)
    cmd = [str(c) for c in cmd]
    server = None
    if os.environ.get('MMSEG_STAG_TESTS_FORK', '1') != '0' and \
            capture_output and text and not kwargs and len(cmd) >= 2 and \
            cmd[0] == sys.executable and cmd[1].endswith('.py'):
        server = _server(env)
        cwd = osp.abspath(cwd or os.getcwd())
        path = [osp.join(cwd, p)
                for p in env.get('PYTHONPATH', '').split(os.pathsep) if p]
        if not server.fork_safe or shadows(path, server.modules):
            server = None
    if server is None:
        return subprocess.run(cmd, cwd=cwd, env=env, timeout=timeout,
                              capture_output=capture_output, text=text,
                              **kwargs)
    return server.run(cmd, cwd, env, timeout)


def tool_module(name: str):
    """The script ``tools/<name>.py`` (``'analysis/tsne'``) as a fresh
    module: a test of a tool's own logic loads it by its path (``tools``
    is no package)."""
    repo = osp.dirname(osp.dirname(osp.abspath(__file__)))
    spec = importlib.util.spec_from_file_location(
        'tool_' + name.replace('/', '_'),
        osp.join(repo, 'tools', f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
