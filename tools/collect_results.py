"""Turn finished runs into the paper's table, the paper's score beside ours::

    python tools/collect_results.py WORK_DIR [WORK_DIR ...] --out DIR
        [--allow-short]

Each WORK_DIR is a finished ``tools/test.py`` run of a shipped config
(``configs/stag_acdc/...``, ``configs/cls/...``), or the ``--out`` dir of
one: its ``continual_results.json``, whose provenance names the config
(the benchmark, scenario, model, method and +STAG) and how it ran. Writes
``DIR/paper_table.{md,csv,json,png}``: one row per model and method, the
baseline and +STAG, ours and the paper's, STAG's gain in each, rounded to
two decimals, and each run's provenance (commit, precision, preset,
device, seed); for ACDC also every stage beside the paper's
(``paper_table_stages.csv``) and the paper's Figure 5
(``continual_graph.png``). Runs of different protocols (task, benchmark,
scenario, conditions, rounds), a run of another protocol or image count
than the paper's table (unless ``--allow-short``, which marks it), an
unfinished run or results of another schema are refused before anything
is written. The table logic is ``tools/paper_tables.py``, beside this
script.
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
    parser.add_argument('--allow-short', action='store_true',
                        help="collect runs of another protocol or image "
                        "count than the paper's table (a smoke test), "
                        'marked in the table, instead of refusing them')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        paths = collect(args.work_dirs, args.out,
                        allow_short=args.allow_short)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f'error: {err}') from None
    with open(paths['md'], encoding='utf-8') as f:
        print(f.read(), end='')
    print(f"written: {', '.join(paths.values())}")


if __name__ == '__main__':
    main()
