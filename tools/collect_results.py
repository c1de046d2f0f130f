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
(``continual_graph.png``). Runs of the realistic online protocol
(``tools/test.py --realtime``, docs/realtime.md) go to a table of their
own beside it, ``DIR/paper_table_realtime.*`` (``..._stages.csv``,
``continual_graph_realtime.png``), headed with the cost and each run's
share of batches adapted; both are written where both kinds are given.
Runs of one setting that differ only by their seed are one cell: the mean
± the sample standard deviation (ddof=1) over the seeds. Runs of
different protocols (task, benchmark, scenario, conditions, rounds),
realistic runs of different costs (or given beside measured), two runs of
one setting and seed, a run of another protocol or image count than the
paper's table (unless ``--allow-short``, which marks it), an unfinished
run or results of another schema are refused before anything is
written. The table logic is ``mmseg_stag/paper/tables.py``, in the
package (a tool imports the package, never another tool).
"""
import argparse
import os.path as osp
import sys

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO not in sys.path:  # the package, not installed in a checkout
    sys.path.insert(0, REPO)

from mmseg_stag.paper.tables import collect


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="finished runs as the paper's table, the paper's score "
        'beside ours')
    parser.add_argument('work_dirs', nargs='+', metavar='WORK_DIR',
                        help='work dirs of finished tools/test.py runs')
    parser.add_argument('--out', required=True, metavar='DIR',
                        help='where paper_table.{md,csv,json,png} go (the '
                        'realistic runs\' paper_table_realtime.*)')
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
    # the offline table, then the realistic one (each where it has runs)
    for key in ('md', 'realtime_md'):
        if key in paths:
            with open(paths[key], encoding='utf-8') as f:
                print(f.read())
    print(f"written: {', '.join(paths.values())}")


if __name__ == '__main__':
    main()
