"""Why the CoTTA CUDA-graph test failed on the H100 (fourth run, README):
two eager CoTTA methods and a graphed one, each from the same tiny
SegFormer, stepped on the same five view batches (Adam, then SGD); per step
the relative difference of each statistic from the first eager method and
the share of equal labels, then the largest relative parameter difference.
Run from the repository root: ``PYTHONPATH=. python3 <this file>``
(as run: the project at commit 3a84ebf; its output is
``cotta_eager_vs_eager.txt``)."""
import sys
sys.path[:0] = ['tests', 'tests/core/methods']
import torch  # noqa: E402
from test_step_graph import cotta_bench, STAG  # noqa: E402

dev = 'cuda' if torch.cuda.is_available() else 'cpu'


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


for opt in (dict(type='Adam', lr=1e-3, capturable=dev == 'cuda'),
            dict(type='SGD', lr=0.01, momentum=0.9)):
    for stag, prob in ((STAG, 0.0),):
        task, view_batch = cotta_bench(dev)
        options = dict(restore_on_device=True, batch_views=True,
                       restore_prob=prob, optimizer=opt)
        arms = {'eagerA': task.make_method('cotta', stag, **options)[0],
                'eagerB': task.make_method('cotta', stag, **options)[0]}
        if dev == 'cuda':
            arms['graph'] = task.make_method('cotta', stag, cuda_graph=True,
                                             **options)[0]
        for i in range(5):
            batch = view_batch()
            out = {k: m.adapt(batch) for k, m in arms.items()}
            ref_v, ref_s = out['eagerA']
            for k in arms:
                if k == 'eagerA':
                    continue
                v, s = out[k]
                same = float((v.value == ref_v.value).float().mean())
                d = {key: abs(float(s[key]) - float(ref_s[key])) /
                     max(abs(float(ref_s[key])), 1e-12) for key in ref_s}
                print(opt['type'], stag is not None, prob, i, k,
                      f'labels {same:.4f}', {k2: f'{x:.2e}'
                                             for k2, x in d.items()})
        for k in arms:
            if k == 'eagerA':
                continue
            worst = max((rel(p, q), n) for (n, p), (_, q) in zip(
                arms[k].model.named_parameters(),
                arms['eagerA'].model.named_parameters()))
            worst_t = max((rel(p, q), n) for (n, p), (_, q) in zip(
                arms[k].teacher.named_parameters(),
                arms['eagerA'].teacher.named_parameters()))
            print('  params', k, 'student', worst, 'teacher', worst_t)
