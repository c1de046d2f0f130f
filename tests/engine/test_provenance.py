"""Every run's ``continual_results.json`` says what its numbers came from
(``provenance``, docs/running.md): the code, the environment, the device,
the config and method, the speed options, the seed and the wall time,
each field checked against what the run really was."""
import os.path as osp
import platform
import subprocess

import mmcv
import mmengine
import mmseg
import pytest
import torch
from mmengine.config import Config
from run_helpers import run_config
from seg_helpers import REPO, SEG_CFG, tiny_options

import mmseg_stag
from mmseg_stag.engine import provenance


def git(*args):
    return subprocess.run(['git', '-C', REPO, *args], capture_output=True,
                          text=True, check=True).stdout.strip()


def test_a_run_records_its_provenance(tiny_acdc, tiny_checkpoint, tmp_path):
    config = osp.join(REPO, SEG_CFG.format('tent-stag'))
    opts = tiny_options(tiny_acdc, rounds=1)
    opts['test_cfg.mixed_precision'] = 'bf16'
    record = run_config(config, tiny_checkpoint, tmp_path, opts, seed=7)
    prov = record['provenance']
    assert prov['config'] == 'segformer_mit-b5_acdc-continual_tent-stag.py'
    method = Config.fromfile(config).test_cfg.method.to_dict()
    assert prov['method'] == provenance.plain(method)
    assert prov['method']['type'] == 'tent' and \
        (prov['method']['stag']['beta0'], prov['method']['stag']['gamma']) \
        == (500, 35)  # the paper's TENT+STAG (Table appendix_hp)
    assert (prov['mixed_precision'], prov['preset'], prov['cuda_graph'],
            prov['tf32']) == ('bf16', None, False, None)
    assert (prov['seed'], prov['deterministic']) == (7, False)
    assert prov['dataset']['split'] == 'train' and \
        prov['dataset']['data_root'] == tiny_acdc and \
        'pipeline' not in prov['dataset']
    assert prov['versions'] == dict(
        python=platform.python_version(), torch=torch.__version__,
        cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
        mmcv=mmcv.__version__, mmengine=mmengine.__version__,
        mmseg=mmseg.__version__)
    assert prov['device'] == dict(type='cpu',
                                  name=provenance.device_name(
                                      torch.device('cpu')))
    assert prov['device']['name'] not in ('', 'x86_64')  # a model's name
    # the CPU kernel path this process ran (the suite does not pin it)
    assert prov['cpu_kernels'] == dict(
        aten=torch.backends.cpu.get_cpu_capability(),
        threads=torch.get_num_threads(), pinned=False)
    code = prov['mmseg_stag']
    assert code['version'] == mmseg_stag.__version__
    assert code['commit'] == git('rev-parse', 'HEAD')
    dirty = bool(git('status', '--porcelain', '--untracked-files=no'))
    assert code['dirty'] is dirty
    assert code['describe'].endswith('-dirty') is dirty
    # the whole stream, in this process: 4 stages of 2 images
    assert [s['num_images'] for s in record['stages']] == [2] * 4
    assert (prov['images'], prov['resumed'], prov['resumed_at_batch']) == (
        8, False, None)
    assert prov['seconds'] > 0 and prov['images_per_second'] == \
        pytest.approx(8 / prov['seconds'], rel=1e-2)


def test_an_installed_copy_outside_a_checkout_names_its_version(
        monkeypatch):
    """Without git, or outside the package's checkout, the commit is None
    and the version says which release ran."""
    def no_git(*args, **kwargs):
        raise FileNotFoundError('git')
    monkeypatch.setattr(provenance.subprocess, 'run', no_git)
    assert provenance.code_version() == dict(
        version=mmseg_stag.__version__, commit=None, describe=None,
        dirty=None)

    def other_repository(args, **kwargs):  # a repository above the package
        return subprocess.CompletedProcess(args, 0, '/elsewhere\nabc\n', '')
    monkeypatch.setattr(provenance.subprocess, 'run', other_repository)
    assert provenance.code_version()['commit'] is None


def test_plain_keeps_json_values_and_names_other_objects():
    assert provenance.plain(dict(a=(1, 2.5), b=[None, True], c='x')) == \
        dict(a=[1, 2.5], b=[None, True], c='x')
    assert provenance.plain(dict(type=torch.nn.Linear)) == dict(
        type=repr(torch.nn.Linear))
