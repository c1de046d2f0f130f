"""``OnlineInferencer`` on unlabeled frames: the same predictions, frame
for frame, as ``tools/test.py``'s loop on the same images in the same order
with their labels (the labels change nothing), its state carried across
calls, saved and loaded, its reset policies and refusals."""
import os.path as osp

import numpy as np
import pytest
import torch
from frame_helpers import benchmark_predictions, options
from seg_helpers import REPO, SEG_CFG, tiny_options

from mmseg_stag.apis import OnlineInferencer


def inferencer(method, tiny_acdc, checkpoint, work_dir, **kwargs):
    """The method's inferencer; a stage every 2 frames, as the tiny
    stream's conditions (beta_t restarts there in the +STAG configs)."""
    kwargs.setdefault('stage_frames', 2)
    return OnlineInferencer(osp.join(REPO, SEG_CFG.format(method)),
                            checkpoint, work_dir=str(work_dir),
                            cfg_options=options(method, tiny_acdc),
                            **kwargs)


@pytest.mark.parametrize('method', ['tent-stag', 'cotta', 'bn-adapt-stag'])
def test_frames_without_labels_predict_as_the_benchmark_loop(
        method, tiny_acdc, tiny_checkpoint, tmp_path):
    want = benchmark_predictions(method, tiny_acdc, tiny_checkpoint,
                                 tmp_path / 'test')
    assert len(want) == 8
    adapt = inferencer(method, tiny_acdc, tiny_checkpoint, tmp_path / 'api')
    for path, labels in want:
        got = adapt(path)
        assert np.array_equal(got.pred_sem_seg.data.cpu().numpy(), labels), \
            path
    assert adapt.frames == 8 and adapt.resets == []
    adapt.close()


def test_a_decoded_frame_is_a_file_and_the_state_carries_over(
        tiny_acdc, tiny_checkpoint, tmp_path):
    """A BGR array (as OpenCV decodes) predicts as its file; a list is
    stepped in order; a saved state continues where the stream was."""
    import cv2
    want = benchmark_predictions('tent-stag', tiny_acdc, tiny_checkpoint,
                                 tmp_path / 'test')
    paths = [p for p, _ in want]
    adapt = inferencer('tent-stag', tiny_acdc, tiny_checkpoint,
                       tmp_path / 'a')
    first = adapt([cv2.imread(p) for p in paths[:3]])
    for got, (_, labels) in zip(first, want[:3]):
        assert np.array_equal(got.pred_sem_seg.data.numpy(), labels)
    state = adapt.state_dict()
    adapt.save_checkpoint(str(tmp_path / 'adapted.pth'))
    rest = [adapt(p).pred_sem_seg.data.numpy() for p in paths[3:]]
    again = inferencer('tent-stag', tiny_acdc, tiny_checkpoint,
                       tmp_path / 'b')
    again.load_state_dict(state)
    assert again.frames == 3
    for got, labels in zip(rest, [again(p) for p in paths[3:]]):
        assert np.array_equal(got, labels.pred_sem_seg.data.numpy())
    # the adapted weights as a checkpoint: the model after three frames
    saved = torch.load(tmp_path / 'adapted.pth', weights_only=True)
    assert saved['meta']['frames'] == 3
    assert set(saved['state_dict']) == set(adapt.model.state_dict())


def test_reset_every_n_frames_restarts_from_the_source(
        tiny_acdc, tiny_checkpoint, tmp_path):
    want = benchmark_predictions('tent-stag', tiny_acdc, tiny_checkpoint,
                                 tmp_path / 'test')
    paths = [p for p, _ in want]
    adapt = inferencer('tent-stag', tiny_acdc, tiny_checkpoint,
                       tmp_path / 'a', reset_every=2)
    source = {k: v.clone() for k, v in adapt.model.state_dict().items()}
    events = [adapt.step(adapt.load_frame(p))[1]['reset'] for p in paths[:4]]
    assert events == [None, 'every 2 frames', None, 'every 2 frames']
    assert [r['before'] for r in adapt.resets] == [2, 4]
    # the replaced methods' updates carried over, as the loop counts them
    # at a from-source stage (before, loop.num_updates stayed 0)
    assert adapt.loop.num_updates == 4 and adapt.loop.method.num_updates == 0
    for key, value in adapt.model.state_dict().items():
        assert torch.equal(value, source[key]), key
    # after a reset the stream is a fresh one's: frames 3, 4 predict as a
    # new run's frames 1, 2 would on those images
    fresh = inferencer('tent-stag', tiny_acdc, tiny_checkpoint,
                       tmp_path / 'b')
    adapt2 = inferencer('tent-stag', tiny_acdc, tiny_checkpoint,
                        tmp_path / 'c', reset_every=2)
    for p in paths[:2]:
        adapt2(p)
    for p in paths[2:4]:
        assert np.array_equal(adapt2(p).pred_sem_seg.data.numpy(),
                              fresh(p).pred_sem_seg.data.numpy())


def test_a_non_finite_step_stops_or_restarts(tiny_acdc, tiny_checkpoint,
                                             tmp_path, monkeypatch):
    """``on_nonfinite='stop'`` raises as the benchmark loop does, naming
    the frame; ``'reset'`` restarts from the source and goes on."""
    from mmseg_stag.core import NonFiniteStatistic
    paths = sorted(str(p) for p in (osp.join(tiny_acdc, 'rgb_anon'),))
    want = benchmark_predictions('tent-stag', tiny_acdc, tiny_checkpoint,
                                 tmp_path / 'test')
    paths = [p for p, _ in want]
    for policy in ('stop', 'reset'):
        adapt = inferencer('tent-stag', tiny_acdc, tiny_checkpoint,
                           tmp_path / policy, on_nonfinite=policy)
        adapt(paths[0])
        # a diverged step: the next loss is nan
        weight = adapt.loop.method.params[0][1]
        with torch.no_grad():
            weight.fill_(float('nan'))
        if policy == 'stop':
            with pytest.raises(NonFiniteStatistic, match='is nan at batch '
                               r'1 \(image .*' + osp.basename(paths[1])):
                adapt.step(adapt.load_frame(paths[1]), name=paths[1])
            continue
        _, stats = adapt.step(adapt.load_frame(paths[1]), name=paths[1])
        assert stats['reset'].startswith('non-finite')
        assert 'nonfinite' in stats
        assert torch.isfinite(adapt.loop.method.params[0][1]).all()
        _, stats = adapt.step(adapt.load_frame(paths[2]))
        assert stats['reset'] is None and np.isfinite(stats['loss'])


def test_bad_configs_and_checkpoints_are_refused_before_any_frame(
        tiny_acdc, tiny_checkpoint, tmp_path):
    plain = osp.join(REPO, 'configs/_base_/datasets/acdc_continual.py')
    with pytest.raises(ValueError, match='has no online method'):
        OnlineInferencer(plain, tiny_checkpoint)
    with pytest.raises(ValueError, match='reset_every must be >= 1'):
        inferencer('tent', tiny_acdc, tiny_checkpoint, tmp_path, reset_every=0)
    with pytest.raises(ValueError, match="on_nonfinite must be one of"):
        inferencer('tent', tiny_acdc, tiny_checkpoint, tmp_path,
                   on_nonfinite='ignore')
    with pytest.raises(ValueError, match=r'\(19 vs 7 classes'):
        OnlineInferencer(osp.join(REPO, SEG_CFG.format('tent')),
                         tiny_checkpoint, work_dir=str(tmp_path),
                         cfg_options=dict(tiny_options(tiny_acdc, rounds=1),
                                          **{'model.decode_head.num_classes':
                                             7}))


def test_frames_of_another_size_or_channels_go_through_the_pipeline(
        tiny_acdc, tiny_checkpoint, tmp_path):
    """A grey file, a grey or BGRA array and a frame of another size are
    read as the config's pipeline reads files in colour: 3-channel BGR,
    resized; a label map at each frame's own size."""
    import cv2
    want = benchmark_predictions('tent', tiny_acdc, tiny_checkpoint,
                                 tmp_path / 'test')
    image = cv2.imread(want[0][0])
    grey = cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)
    cv2.imwrite(str(tmp_path / 'grey.png'), grey)
    adapt = inferencer('tent', tiny_acdc, tiny_checkpoint, tmp_path / 'a')
    from_file = adapt(str(tmp_path / 'grey.png'))
    again = inferencer('tent', tiny_acdc, tiny_checkpoint, tmp_path / 'b')
    from_array = again(grey)
    assert np.array_equal(from_file.pred_sem_seg.data.numpy(),
                          from_array.pred_sem_seg.data.numpy())
    bgra = cv2.cvtColor(image, cv2.COLOR_BGR2BGRA)
    assert adapt(bgra).pred_sem_seg.data.shape[-2:] == image.shape[:2]
    large = cv2.resize(image, (150, 70))
    assert adapt(large).pred_sem_seg.data.shape[-2:] == (70, 150)
    with pytest.raises(ValueError, match='must be uint8'):
        adapt(image.astype(np.float32))

