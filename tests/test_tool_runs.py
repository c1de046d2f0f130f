"""``tool_runs.run``: a script run as a fork of the pre-imported server is
the process ``python SCRIPT ARGS`` would be, as the real subprocess shows."""
import json
import os
import subprocess
import sys

import pytest
import tool_runs

PROBE = '''\
import json, os, sys
if sys.argv[1] == 'crash':
    raise RuntimeError('probe crashed')
if sys.argv[1] == 'refuse':
    raise SystemExit('error: probe refused')
if sys.argv[1] == 'kill':
    os.kill(os.getpid(), 9)
if sys.argv[1] == 'sleep':
    import time
    time.sleep(60)
print(json.dumps(dict(
    argv=sys.argv, path=sys.path, cwd=os.getcwd(), name=__name__,
    file=__file__, stdin=sys.stdin.read(),
    probe=os.environ.get('MMSEG_STAG_PROBE'),
    kill=os.environ.get('KILL_AT_STAGE'),
    ours='mmseg_stag' in sys.modules, helper=__import__('helper').VALUE,
    parent=os.getppid())))
print('to stderr', file=sys.stderr)
sys.exit(int(sys.argv[2]))
'''


@pytest.fixture
def probe(tmp_path):
    (tmp_path / 'bin').mkdir()
    (tmp_path / 'lib').mkdir()
    (tmp_path / 'bin' / 'probe.py').write_text(PROBE)
    (tmp_path / 'lib' / 'helper.py').write_text('VALUE = 7\n')
    return tmp_path


def both(probe, *args, **env):
    """The probe through the server and as a real subprocess."""
    env = dict(os.environ, PYTHONPATH='lib', MMSEG_STAG_PROBE='x', **env)
    cmd = [sys.executable, 'bin/probe.py', *args]
    kwargs = dict(cwd=str(probe), env=env, capture_output=True, text=True,
                  timeout=60)
    forked = tool_runs.run(cmd, **kwargs)
    real = subprocess.run(cmd, **kwargs)
    return forked, real


def test_a_forked_run_is_the_process_python_would_start(probe):
    forked_run, real_run = both(probe, 'ok', '3', KILL_AT_STAGE='1,2')
    assert real_run.returncode == forked_run.returncode == 3
    assert forked_run.stderr == real_run.stderr == 'to stderr\n'
    forked, real = json.loads(forked_run.stdout), json.loads(real_run.stdout)
    # started by the server, not by this process
    assert real.pop('parent') == os.getpid() != forked.pop('parent')
    assert forked == real == dict(
        real, argv=['bin/probe.py', 'ok', '3'], cwd=str(probe),
        name='__main__', stdin='', probe='x', kill='1,2', ours=False,
        helper=7)


@pytest.mark.parametrize('how, code, message', [
    ('crash', 1, 'RuntimeError: probe crashed'),
    ('refuse', 1, 'error: probe refused'),
    ('kill', -9, '')])
def test_failures_read_as_from_a_real_process(probe, how, code, message):
    forked, real = both(probe, how)
    assert forked.returncode == real.returncode == code
    assert message in forked.stderr and message in real.stderr


def test_timeout_kills_the_run(probe):
    with pytest.raises(subprocess.TimeoutExpired):
        tool_runs.run([sys.executable, str(probe / 'bin' / 'probe.py'),
                       'sleep'], capture_output=True, text=True, timeout=1)


def test_a_server_whose_forks_cannot_use_cuda_is_not_used(probe,
                                                          monkeypatch):
    """Nor any with ``MMSEG_STAG_TESTS_FORK=0``."""
    env = dict(os.environ, PYTHONPATH='lib')
    server = tool_runs._server(env)
    assert server.fork_safe  # this machine: the preloading starts no CUDA

    def parent():
        done = tool_runs.run([sys.executable, 'bin/probe.py', 'ok', '0'],
                             cwd=str(probe), env=env, capture_output=True,
                             text=True)
        return json.loads(done.stdout)['parent']
    assert parent() != os.getpid()
    monkeypatch.setattr(server, 'fork_safe', False)
    assert parent() == os.getpid()
    monkeypatch.setattr(server, 'fork_safe', True)
    monkeypatch.setenv('MMSEG_STAG_TESTS_FORK', '0')  # all real processes
    assert parent() == os.getpid()


def test_what_could_differ_runs_as_a_real_subprocess(probe):
    """Another thread count (read when OpenMP loads) or CUDA_VISIBLE_DEVICES
    gets a server of its own; a PYTHONPATH that shadows a preloaded module,
    a real process."""
    key = tool_runs.import_time_env
    base = dict(PATH='/bin', OMP_NUM_THREADS='1')
    assert key(base) != key(dict(base, OMP_NUM_THREADS='2'))
    assert key(base) == key(dict(base, MKL_NUM_THREADS='1',
                                 KILL_AT_STAGE='3,1', PYTHONPATH='lib'))
    # MMCV keeps whether CUDA was available when it was imported
    assert key(base) != key(dict(base, CUDA_VISIBLE_DEVICES=''))
    (probe / 'lib' / 'yaml.py').write_text('raise ImportError("shadow")\n')
    assert tool_runs.shadows([str(probe / 'lib')], {'yaml'})
    assert not tool_runs.shadows([str(probe / 'bin')], {'yaml'})
