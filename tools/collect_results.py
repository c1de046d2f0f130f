"""Turn finished runs into the paper's table, the paper's score beside ours::

    python tools/collect_results.py WORK_DIR [WORK_DIR ...] --out DIR

Each WORK_DIR is a finished ``tools/test.py`` run of a shipped config
(``configs/stag_acdc/...``, ``configs/cls/...``): its
``continual_results.json`` and the config dumped beside it, whose name says
the benchmark, scenario, model, method and +STAG. Writes
``DIR/paper_table.{md,csv,json,png}``: one row per model and method, the
baseline and +STAG, ours and the paper's, and STAG's gain in each. Runs of
different protocols (task, benchmark, scenario, conditions, rounds), an
unfinished run or results of another schema are refused before anything is
written. The table logic is ``tools/paper_tables.py``, beside this script.
"""
import argparse
import os.path as osp
import sys

TOOLS = osp.dirname(osp.abspath(__file__))
REPO = osp.dirname(TOOLS)
# the package (not installed in a checkout) and the table logic beside this
# script (tools/ is no package: a script loaded by path still finds it)
for path in (REPO, TOOLS):
    if path not in sys.path:
        sys.path.insert(0, path)

from paper_tables import collect  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="finished runs as the paper's table, the paper's score "
        'beside ours')
    parser.add_argument('work_dirs', nargs='+', metavar='WORK_DIR',
                        help='work dirs of finished tools/test.py runs')
    parser.add_argument('--out', required=True, metavar='DIR',
                        help='where paper_table.{md,csv,json,png} go')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        paths = collect(args.work_dirs, args.out)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f'error: {err}') from None
    with open(paths['md'], encoding='utf-8') as f:
        print(f.read(), end='')
    print(f"written: {', '.join(paths[k] for k in ('md', 'csv', 'json', 'png'))}")


if __name__ == '__main__':
    main()
