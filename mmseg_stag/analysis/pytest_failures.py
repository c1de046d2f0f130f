"""A pytest plugin of the GPU check (``-p mmseg_stag.analysis.
pytest_failures``): each failed test's report is appended to the file
named by ``$GPU_CHECK_FAILURES`` as the test ends, so that a run stopped at
its time limit keeps why its tests failed (pytest, and pytest-xdist's
controller, print the tracebacks only at the end of the session)."""
import os

#: the environment variable naming the file
ENV = 'GPU_CHECK_FAILURES'
_path = None


def pytest_configure(config):
    global _path
    # under pytest-xdist the controller writes: it sees every worker's
    # reports, and a worker's would be written twice
    if not hasattr(config, 'workerinput'):
        _path = os.environ.get(ENV)


def pytest_runtest_logreport(report):
    if _path and report.failed:
        with open(_path, 'a') as out:
            out.write(f'___ {report.nodeid} ({report.when}) ___\n'
                      f'{report.longreprtext}\n\n')


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
