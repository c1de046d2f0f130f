"""An adapted checkpoint (``OnlineInferencer.save_checkpoint``,
``tools/test.py --save-adapted``) that every reader takes: the inferencer
with the same config, the strict loader with the method's config and the
Source one, and MMSeg's own ``MMSegInferencer`` with the inference config
written beside it, predicting as the adapted model. BN Adapt's layers on
batch statistics keep the source's running statistics (named in the
meta); Hybrid-TTA's added modules are attached again from the meta."""
import glob
import os.path as osp
import sys
import warnings

import numpy as np
import pytest
import torch
from frame_helpers import options
from seg_helpers import REPO, SEG_CFG, as_cli, build_from_config, run_script

from mmseg_stag.apis import OnlineInferencer
from mmseg_stag.checkpoint import load_model_checkpoint
from mmseg_stag.engine.online_task import head_layer_of

METHODS = ('bn-adapt', 'bn-adapt-stag', 'hybrid-tta', 'tent')
#: Hybrid-TTA on 64x32 inputs: 8-px mask patches, a small neck
HYBRID = {'test_cfg.method.mask_patch_size': 8,
          'test_cfg.method.neck_embed_dim': 16}


def method_options(method, tiny_acdc):
    opts = options(method, tiny_acdc)
    return dict(opts, **HYBRID) if method.startswith('hybrid') else opts


def frames_of(tiny_acdc):
    return sorted(glob.glob(osp.join(tiny_acdc, 'rgb_anon', '*', '*', '*',
                                     '*.png')))


def inferencer(method, tiny_acdc, checkpoint, work_dir):
    return OnlineInferencer(osp.join(REPO, SEG_CFG.format(method)),
                            checkpoint, work_dir=str(work_dir),
                            cfg_options=method_options(method, tiny_acdc))


def eval_prediction(adapt, frame):
    """The adapted model's own prediction of ``frame`` (its modes as the
    method set them: BN Adapt's layers on batch statistics), no step."""
    data = adapt.collate([adapt.load_frame(frame)])
    with torch.no_grad():
        return adapt.model.test_step(data)[0].pred_sem_seg.data.numpy()


@pytest.fixture(scope='module')
def adapted(tiny_acdc, tiny_checkpoint, tmp_path_factory):
    """Each method's inferencer after 3 frames, its checkpoint saved."""
    done = {}

    def run(method):
        if method not in done:
            work = tmp_path_factory.mktemp(method)
            adapt = inferencer(method, tiny_acdc, tiny_checkpoint,
                               work / 'run')
            adapt(frames_of(tiny_acdc)[:3])
            path = str(work / 'adapted_final.pth')
            config = adapt.save_checkpoint(path)
            done[method] = (adapt, path, config)
        return done[method]

    return run


def test_the_meta_says_what_the_weights_are(adapted, tiny_checkpoint):
    source = torch.load(tiny_checkpoint, weights_only=True)['state_dict']
    _, path, _ = adapted('bn-adapt')
    meta = torch.load(path, weights_only=True)['meta']
    assert meta['batch_statistics'] == ['decode_head.convs.0.bn',
                                        'decode_head.convs.1.bn',
                                        'decode_head.convs.2.bn',
                                        'decode_head.convs.3.bn',
                                        'decode_head.fusion_conv.bn']
    saved = torch.load(path, weights_only=True)['state_dict']
    for layer in meta['batch_statistics']:  # the source's statistics
        for buffer in ('running_mean', 'running_var'):
            key = f'{layer}.{buffer}'
            assert torch.equal(saved[key], source[key]), key
    assert meta['method'] == 'BNAdapt' and meta['frames'] == 3
    assert meta['dataset_meta']['classes'][0] == 'road'
    meta = torch.load(adapted('hybrid-tta')[1], weights_only=True)['meta']
    assert meta['added_modules'] == dict(
        type='hybrid_tta', adapter_hidden=5, adapter_init='backbone',
        neck_embed_dim=16)
    assert meta['weights'] == 'student'
    assert 'batch_statistics' not in meta
    meta = torch.load(adapted('tent')[1], weights_only=True)['meta']
    assert 'batch_statistics' not in meta and 'added_modules' not in meta


def mmseg_inferencer(config, path, capsys):
    """MMSeg's inferencer of ``config`` and ``path``; fails on any
    missing or unexpected key, or Cityscapes' classes by default."""
    from mmseg.apis import MMSegInferencer
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        inf = MMSegInferencer(model=config, weights=path, device='cpu')
    printed = capsys.readouterr()
    text = printed.out + printed.err + ' '.join(str(w.message)
                                                 for w in caught)
    for words in ('missing keys', 'unexpected key', 'size mismatch',
                  'dataset_meta or class names are not saved'):
        assert words not in text, text[-2000:]
    saved = torch.load(path, weights_only=True)['state_dict']
    assert set(inf.model.state_dict()) == set(saved)
    return inf


def same_config_reads(method, adapt, path, tiny_acdc, work_dir):
    """The inferencer of the method's config, from the adapted checkpoint:
    the saved weights, the same predictions."""
    saved = torch.load(path, weights_only=True)
    again = inferencer(method, tiny_acdc, path, work_dir)
    own = again.model.state_dict()  # after its method's configure
    assert own and set(own) <= set(saved['state_dict'])
    for key, value in own.items():
        assert torch.equal(value, saved['state_dict'][key]), key
    frame = frames_of(tiny_acdc)[3]
    assert np.array_equal(eval_prediction(again, frame),
                          eval_prediction(adapt, frame))


def strict_loader_reads(method, config, path, tiny_acdc):
    """``run_test``'s strict load into the model of ``config`` (Source or
    the method's): every key, the saved values."""
    saved = torch.load(path, weights_only=True)['state_dict']
    model, cfg = build_from_config(SEG_CFG.format(config),
                                   method_options(method, tiny_acdc))
    load_model_checkpoint(model, path, head_layer=head_layer_of(cfg))
    assert set(model.state_dict()) == set(saved)
    for key, value in model.state_dict().items():
        assert torch.equal(value, saved[key]), key


@pytest.mark.parametrize('method', METHODS)
def test_every_reader_takes_the_adapted_checkpoint(
        method, adapted, tiny_acdc, tiny_checkpoint, tmp_path, capsys):
    adapt, path, config = adapted(method)
    same_config_reads(method, adapt, path, tiny_acdc, tmp_path / 'again')
    for name in ('source', method):
        strict_loader_reads(method, name, path, tiny_acdc)
    # MMSeg's inferencer, with the inference config beside the checkpoint
    assert config == osp.splitext(path)[0] + '.py' and osp.isfile(config)
    inf = mmseg_inferencer(config, path, capsys)
    frame = frames_of(tiny_acdc)[4]
    got = inf(frame, return_datasamples=True).pred_sem_seg.data.numpy()
    assert np.array_equal(got, eval_prediction(adapt, frame))
    assert inf.model.dataset_meta['classes'] == list(adapt.classes)
    if method == 'bn-adapt':  # no update: BN Adapt's from the source
        fresh = inferencer(method, tiny_acdc, tiny_checkpoint,
                           tmp_path / 'fresh')
        assert np.array_equal(got, fresh(frame).pred_sem_seg.data.numpy())
        # its layers normalise with each frame's statistics in eval mode
        assert inf.model.decode_head.fusion_conv.bn.training
        assert not inf.model.training


def test_tools_test_py_saves_what_every_reader_takes(
        tiny_acdc, tiny_checkpoint, tmp_path, capsys):
    method = 'bn-adapt'
    path = tmp_path / 'adapted.pth'
    short = dict(options(method, tiny_acdc), **{  # one image of each
        'test_dataloader.dataset.images_per_condition': 1})
    proc = run_script(
        [sys.executable, osp.join(REPO, 'tools/test.py'),
         osp.join(REPO, SEG_CFG.format(method)), tiny_checkpoint,
         '--work-dir', str(tmp_path / 'work'), '--save-adapted', str(path),
         '--cfg-options'] + as_cli(short), cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert osp.isfile(tmp_path / 'adapted.py')
    for config in ('source', method):
        model, cfg = build_from_config(SEG_CFG.format(config),
                                       options(method, tiny_acdc))
        load_model_checkpoint(model, str(path),
                              head_layer=head_layer_of(cfg))
    # the next reader: the inferencer with the same config, then MMSeg's
    again = inferencer(method, tiny_acdc, str(path), tmp_path / 'again')
    fresh = inferencer(method, tiny_acdc, tiny_checkpoint, tmp_path / 'new')
    frame = frames_of(tiny_acdc)[0]
    want = fresh(frame).pred_sem_seg.data.numpy()
    assert np.array_equal(again(frame).pred_sem_seg.data.numpy(), want)
    inf = mmseg_inferencer(str(tmp_path / 'adapted.py'), str(path), capsys)
    got = inf(frame, return_datasamples=True).pred_sem_seg.data.numpy()
    assert np.array_equal(got, want)


def test_a_checkpoint_of_unknown_or_other_modules_is_refused(
        adapted, tiny_acdc, tmp_path):
    """One sentence naming the file: added modules of a type this version
    does not know; a config whose method attaches other options."""
    from mmseg_stag.checkpoint import adapted_checkpoint
    from mmseg_stag.core import use_batch_statistics
    _, path, _ = adapted('hybrid-tta')
    checkpoint = torch.load(path, weights_only=True)
    checkpoint['meta']['added_modules']['type'] = 'unknown'
    torch.save(checkpoint, tmp_path / 'unknown.pth')
    model, _ = build_from_config(SEG_CFG.format('source'),
                                 method_options('hybrid-tta', tiny_acdc))
    with pytest.raises(ValueError, match=r'unknown\.pth names added modules '
                       r"of type 'unknown'"):
        load_model_checkpoint(model, str(tmp_path / 'unknown.pth'))
    with pytest.raises(ValueError, match=r'Hybrid-TTA config .* asks for '
                       r'the added modules .*neck_embed_dim.: 32'):
        OnlineInferencer(
            osp.join(REPO, SEG_CFG.format('hybrid-tta')), path,
            work_dir=str(tmp_path / 'other'), cfg_options=dict(
                method_options('hybrid-tta', tiny_acdc),
                **{'test_cfg.method.neck_embed_dim': 32}))
    # layers on batch statistics and no source statistics kept
    model, _ = build_from_config(SEG_CFG.format('source'),
                                 method_options('bn-adapt', tiny_acdc))
    use_batch_statistics(model)
    with pytest.raises(ValueError, match='5 BatchNorm layers normalise with '
                       'batch statistics'):
        adapted_checkpoint(model)
