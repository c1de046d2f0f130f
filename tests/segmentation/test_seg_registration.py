"""``import mmseg_stag`` registers the segmentation parts in MMSeg's
registries, and the STAG configs use them: a plain ``EncoderDecoder`` and
the ``OnlineAdaptationLoop`` with a registered method."""
import glob
import os.path as osp

import pytest
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmseg.registry import DATASETS, LOG_PROCESSORS, LOOPS, METRICS, MODELS
from seg_helpers import REPO

import mmseg_stag
from mmseg_stag.core import METHODS, STAGLoss
from mmseg_stag.engine import (OnlineAdaptationLogProcessor,
                               OnlineAdaptationLoop)
from mmseg_stag.segmentation import (ACDCContinualDataset, ContinualIoUMetric,
                                     NVMixVisionTransformer, NVSegformerHead)

# the fast presets (``…_bf16.py``, ``…_bf16-graph.py``):
# tests/segmentation/test_presets.py
STAG_CONFIGS = sorted(
    p for p in glob.glob(osp.join(REPO, 'configs', 'stag_acdc', '*.py'))
    if not p.endswith(('_bf16.py', '_bf16-graph.py')))


def test_registered_types():
    init_default_scope('mmseg')
    assert MODELS.get('NVSegformerHead') is NVSegformerHead
    assert MODELS.get('NVMixVisionTransformer') is NVMixVisionTransformer
    assert MODELS.get('STAGLoss') is STAGLoss is mmseg_stag.STAGLoss
    # the task-agnostic loop sits in MMEngine's root registries: found from
    # MMSeg's scope (and from the plugin's, see the classification tests)
    assert LOOPS.get('OnlineAdaptationLoop') is OnlineAdaptationLoop
    assert LOG_PROCESSORS.get('OnlineAdaptationLogProcessor') is \
        OnlineAdaptationLogProcessor
    assert METRICS.get('ContinualIoUMetric') is ContinualIoUMetric
    assert DATASETS.get('ACDCContinualDataset') is ACDCContinualDataset
    # the removed wrapper is not registered any more
    assert MODELS.get('TTAEncoderDecoder') is None
    loss = MODELS.build(dict(type='STAGLoss'))
    assert isinstance(loss, STAGLoss)


def test_stag_loss_is_registered_once():
    """In MMSeg's ``MODELS``, where MMSeg configs build losses, and not
    also in the ``mmseg_stag`` scope's own."""
    from mmseg_stag.registry import MODELS as SCOPE_MODELS
    assert MODELS.module_dict['STAGLoss'] is STAGLoss
    assert 'STAGLoss' not in SCOPE_MODELS.module_dict


def test_there_is_a_config_per_checkpoint_and_method():
    # Source, BN Adapt, TENT, CoTTA, EATA, SAR, DeYO, Hybrid-TTA (all but
    # Source also with STAG) x MMSeg's and NVlabs' B5
    assert len(STAG_CONFIGS) == 15 * 2


@pytest.mark.parametrize('path', STAG_CONFIGS, ids=osp.basename)
def test_stag_configs_use_the_online_loop(path):
    cfg = Config.fromfile(path)
    assert cfg.custom_imports['imports'] == ['mmseg_stag']
    assert cfg.model['type'] == 'EncoderDecoder'
    assert cfg.test_cfg['type'] == 'OnlineAdaptationLoop'
    assert cfg.log_processor['type'] == 'OnlineAdaptationLogProcessor'
    assert cfg.test_evaluator['type'] == 'ContinualIoUMetric'
    method = cfg.test_cfg['method']
    name = osp.basename(path)[:-3].rsplit('_', 1)[1]
    assert method['type'] == name.replace('-stag', '').replace('-', '_')
    # one registry of methods, Hybrid-TTA's included
    assert method['type'] in METHODS.module_dict
    # (beta0, gamma) against the paper's table: tests/test_paper_hparams.py
    assert ('stag' in method) == name.endswith('-stag')
    head = cfg.model['decode_head']['type']
    nvlabs = 'nvlabs' in osp.basename(path)  # not the checkout's path
    assert head == ('NVSegformerHead' if nvlabs else 'SegformerHead')
    assert cfg.model['backbone']['type'] == (
        'NVMixVisionTransformer' if nvlabs else 'MixVisionTransformer')
    # the default classifier is the head's 1x1 conv_seg
    assert cfg.test_cfg.get('head_layer',
                            'decode_head.conv_seg') == 'decode_head.conv_seg'
