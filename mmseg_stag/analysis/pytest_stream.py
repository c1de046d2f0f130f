"""A pytest plugin of the GPU check (``-p mmseg_stag.analysis.
pytest_stream``): as each test ends, its failure report is appended to the
file named by ``$GPU_CHECK_FAILURES`` and its time (setup, call and
teardown) to the one named by ``$GPU_CHECK_DURATIONS``, so that a run
stopped at its time limit keeps why its tests failed and how long each
took (pytest, and pytest-xdist's controller, print the tracebacks and
``--durations`` only at the end of the session)."""
import os

#: the environment variables naming the files
FAILURES_ENV, DURATIONS_ENV = 'GPU_CHECK_FAILURES', 'GPU_CHECK_DURATIONS'
_paths = {}
_seconds = {}


def pytest_configure(config):
    # under pytest-xdist the controller writes: it sees every worker's
    # reports, and a worker's would be written twice
    if not hasattr(config, 'workerinput'):
        _paths.update(failures=os.environ.get(FAILURES_ENV),
                      durations=os.environ.get(DURATIONS_ENV))


def pytest_runtest_logreport(report):
    if _paths.get('failures') and report.failed:
        with open(_paths['failures'], 'a') as out:
            out.write(f'___ {report.nodeid} ({report.when}) ___\n'
                      f'{report.longreprtext}\n\n')
    if _paths.get('durations'):
        _seconds[report.nodeid] = _seconds.get(report.nodeid, 0.0) + \
            report.duration
        if report.when == 'teardown':
            with open(_paths['durations'], 'a') as out:
                out.write(f'{report.nodeid}\t'
                          f'{_seconds.pop(report.nodeid):.2f}\n')


def read_failures(path):
    """``{test: report text}`` of a file this plugin wrote (empty if none)."""
    if not os.path.exists(path):
        return {}
    texts, test = {}, None
    with open(path, errors='replace') as f:
        for line in f:
            if line.startswith('___ ') and line.rstrip().endswith(' ___'):
                test = line[4:].rsplit(' (', 1)[0]
                texts[test] = ''
            elif test is not None:
                texts[test] += line
    return {test: text.strip() for test, text in texts.items()}


def read_durations(path):
    """``[(test, seconds)]`` of a file this plugin wrote, slowest first
    (empty if none)."""
    if not os.path.exists(path):
        return []
    with open(path, errors='replace') as f:
        rows = [line.rstrip('\n').rsplit('\t', 1) for line in f
                if '\t' in line]
    return sorted(((test, float(s)) for test, s in rows),
                  key=lambda row: -row[1])
