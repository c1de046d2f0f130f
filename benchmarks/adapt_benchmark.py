"""``tools/adapt.py`` beside ``tools/test.py`` on the same stream: what the
command adds to the benchmark loop when it writes each frame's label map
(decoding in its own loader, the per-frame statistics read, the PNG and
CSV writes)::

    python benchmarks/adapt_benchmark.py --config CONFIG --checkpoint CKPT
        --data-root ACDC_ROOT [--rounds R] [--repeats K] [--out JSON]
        [--cfg-options k=v ...]

Each of ``--repeats`` rounds runs ``tools/test.py`` on the config's stream
(with its labels and metric) and ``tools/adapt.py`` on the same images in
the same order (``tools/stream_list.py``), one after the other in fresh
processes; the rates are their own: ``tools/test.py``'s loop images/s
(its provenance: loader, steps, metric) and the command's frames/s over
its frames (decoding, steps, writes), both after their set-up. The
machine, the processor and the kernel path are printed with them.
"""
import argparse
import json
import os
import os.path as osp
import statistics
import subprocess
import sys
import tempfile

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO not in sys.path:  # the package, not installed in a checkout
    sys.path.insert(0, REPO)


def run(cmd):
    proc = subprocess.run([sys.executable] + cmd, cwd=REPO,
                          capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f'error: {" ".join(cmd[:2])} failed '
                         f'({proc.returncode}):\n{proc.stderr[-3000:]}')
    return proc


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--config', required=True)
    parser.add_argument('--checkpoint', required=True)
    parser.add_argument('--data-root', required=True)
    parser.add_argument('--rounds', type=int, default=1)
    parser.add_argument('--repeats', type=int, default=2)
    parser.add_argument('--out', help='the figures as JSON')
    parser.add_argument('--cfg-options', nargs='+', default=[])
    args = parser.parse_args(argv)
    import torch

    from mmseg_stag.engine.provenance import device_name
    opts = [f'test_dataloader.dataset.data_root={args.data_root}',
            f'test_dataloader.dataset.rounds={args.rounds}'] + \
        args.cfg_options
    test_rates, adapt_rates = [], []
    with tempfile.TemporaryDirectory() as tmp:
        stream = osp.join(tmp, 'stream.txt')
        run(['tools/stream_list.py', args.config, '--out', stream,
             '--cfg-options'] + opts)
        for k in range(args.repeats):
            work = osp.join(tmp, f'test{k}')
            run(['tools/test.py', args.config, args.checkpoint,
                 '--work-dir', work, '--cfg-options'] + opts)
            with open(osp.join(work, 'continual_results.json')) as f:
                test_rates.append(
                    json.load(f)['provenance']['images_per_second'])
            out = osp.join(tmp, f'adapt{k}')
            run(['tools/adapt.py', args.config, args.checkpoint, stream,
                 '--out-dir', out] + (['--cfg-options'] + args.cfg_options
                                      if args.cfg_options else []))
            with open(osp.join(out, 'summary.json')) as f:
                adapt_rates.append(json.load(f)['frames_per_second'])
            print(f'[adapt_benchmark] repeat {k + 1}: tools/test.py '
                  f'{test_rates[-1]:.2f} images/s, tools/adapt.py '
                  f'{adapt_rates[-1]:.2f} frames/s', flush=True)
    test, adapt = statistics.median(test_rates), statistics.median(
        adapt_rates)
    result = dict(
        config=args.config, rounds=args.rounds, repeats=args.repeats,
        test_images_per_second=test_rates, adapt_frames_per_second=
        adapt_rates, added_time_pct=round(100 * (test / adapt - 1), 1),
        machine=dict(processor=device_name(torch.device('cpu')),
                     cores=os.cpu_count(),
                     threads=os.environ.get('OMP_NUM_THREADS'),
                     kernel_paths=os.environ.get('MMSEG_STAG_KERNEL_PATHS',
                                                 'native')))
    print(f'[adapt_benchmark] median: tools/test.py {test:.2f} images/s, '
          f'tools/adapt.py {adapt:.2f} frames/s: the command adds '
          f'{result["added_time_pct"]:+.1f} % time a frame '
          f'({result["machine"]})')
    if args.out:
        os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
        with open(args.out, 'w') as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == '__main__':
    sys.exit(main())
