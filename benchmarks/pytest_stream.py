"""A pytest plugin of the GPU check: ``tools/gpu_check.py`` runs ``pytest
-p benchmarks.pytest_stream`` with the repository on ``PYTHONPATH``
(``benchmarks.gpu_steps.run_tests``). Each test's start and outcome (as
JUnit XML counts it), failure report and time go to the files named by
:data:`ENV` as it happens, so that a run stopped at its time limit keeps
them (pytest writes JUnit XML, tracebacks and durations only at the end of
the session)."""
import collections
import json
import os

#: the environment variables naming the files
ENV = dict(outcomes='GPU_CHECK_OUTCOMES', failures='GPU_CHECK_FAILURES',
           durations='GPU_CHECK_DURATIONS')
_paths = {}
_tests = {}


def pytest_configure(config):
    # under pytest-xdist the controller writes: it sees every worker's
    # reports, and a worker's would be written twice
    if not hasattr(config, 'workerinput'):
        _paths.update((key, os.environ.get(env)) for key, env in ENV.items())


def _append(key, text):
    if _paths.get(key):
        with open(_paths[key], 'a') as out:
            out.write(text)


def _outcome(**record):
    _append('outcomes', json.dumps(record) + '\n')


def pytest_runtest_logstart(nodeid):
    _outcome(started=nodeid)


def pytest_collectreport(report):
    # a module whose collection failed or skipped counts as JUnit XML's
    if report.failed:
        _outcome(test=report.nodeid, outcome='errors',
                 message='collection failure')
    elif report.skipped:
        _outcome(test=report.nodeid, outcome='skipped',
                 reason='collection skipped')


def crash_message(report):
    """JUnit XML's message of a failed report: its crash line, outside
    the call ``failed on setup/teardown with "..."``."""
    crash = getattr(report.longrepr, 'reprcrash', None)
    message = str(report.longrepr) if crash is None else crash.message
    if report.when == 'call':
        return message
    return f'failed on {report.when} with "{message}"'


def pytest_runtest_logreport(report):
    test = _tests.setdefault(report.nodeid, dict(
        test=report.nodeid, outcome='passed', seconds=0.0))
    test['seconds'] += report.duration
    if report.failed:
        _append('failures', f'___ {report.nodeid} ({report.when}) ___\n'
                f'{report.longreprtext}\n\n')
        message = crash_message(report)[:500]
        if test['outcome'] == 'failed':  # JUnit XML: an error entry too
            test['error'] = message
        else:
            test.update(outcome='failed' if report.when == 'call'
                        else 'errors', message=message)
    elif report.skipped:
        test.update(outcome='skipped', reason=report.wasxfail.removeprefix(
            'reason: ') if hasattr(report, 'wasxfail') else
            report.longrepr[2].removeprefix('Skipped: '))
    if report.when == 'teardown':
        del _tests[report.nodeid]
        _append('durations', f'{report.nodeid}\t{test["seconds"]:.2f}\n')
        error = test.pop('error', None)
        _outcome(seconds=round(test.pop('seconds'), 2), properties=[
            (name, str(value)) for name, value in report.user_properties],
            **test)
        if error:
            _outcome(test=report.nodeid, outcome='errors', message=error)


def read_outcomes(path):
    """Counts, failures, skip reasons, properties and times (slowest
    first) of a file this plugin wrote, and ``running_at_limit``: the
    tests started and not ended."""
    out = dict(passed=0, failed=0, errors=0, skipped=0, failures=[],
               skip_reasons={}, properties=[])
    records, running, reasons, times = [], {}, collections.Counter(), []
    if os.path.exists(path):
        with open(path) as f:  # a line cut by a kill has no newline
            records = [json.loads(line) for line in f if line.endswith('\n')]
    for record in records:
        test = record.get('test')
        if test is None:
            running[record['started']] = True
            continue
        running.pop(test, None)
        out[record['outcome']] += 1
        if 'message' in record:
            out['failures'].append(dict(
                test=test, kind='failure' if record['outcome'] == 'failed'
                else 'error', message=record['message']))
        elif record['outcome'] == 'skipped':
            reasons[record['reason']] += 1
        out['properties'] += [dict(test=test, name=name, value=value)
                              for name, value in record.get('properties', ())]
        if 'seconds' in record:
            times.append(dict(test=test, seconds=record['seconds']))
    return dict(out, skip_reasons=dict(reasons),
                running_at_limit=list(running),
                slowest=sorted(times, key=lambda row: -row['seconds']))
