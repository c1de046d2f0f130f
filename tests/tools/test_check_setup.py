"""``tools/check_setup.py``: the stand-in set-up passes, each wrong piece
(a missing condition, raw Cityscapes ids, a colour label, the wrong class
count, an unconverted NVlabs file, a moved expectation) fails with a
sentence naming its file, and the exit status says which.

The Source numbers of the stand-in are recorded in
``check_setup_stand_in.json`` (its note says how);
``MMSEG_STAG_RECORD_NUMBERS=1`` records them again."""
import glob
import json
import os
import os.path as osp
import re
import shlex
import shutil

import numpy as np
import pytest
import torch
from PIL import Image
from seg_helpers import (NVLABS_SEG_CFG, REPO, SEG_CFG, as_cli,
                         build_from_config, save_checkpoint, tiny_options)

CONFIG = osp.join(REPO, SEG_CFG.format('source'))
#: the TENT+STAG fast preset (its step replayed as a CUDA graph)
PRESET = osp.join(REPO, NVLABS_SEG_CFG.format('tent-stag_bf16-graph'))
#: Scores recorded on one machine; they hold on any x86-64 CPU within the
#: file's tolerance (0.05). Sized on this stand-in by forcing ATen's
#: default/AVX2/AVX-512 kernels with oneDNN's SSE4.1/AVX2/native ISA:
#: the Source logits moved by 2.4e-6 at most and no score moved; the
#: nearest scored pixel is 1.9e-5 from an argmax tie (the four within
#: 1e-4, flipped, move their stage by 0.002 at most), and any one pixel
#: flipped to its runner-up moves a stage by 0.011 at most.
EXPECTED = osp.join(REPO, 'tests', 'tools', 'check_setup_stand_in.json')
RECORD = os.environ.get('MMSEG_STAG_RECORD_NUMBERS') == '1'
#: a duration as the tool prints it: 0.42 s, 4.2 s, 3 min 05 s, 1 h 02 min
TIME = r'(?:[\d.]+ s|\d+ min \d\d s|\d+ h \d\d min)'
#: the tool's last timing line: the whole check, then each check
TOOK = rf'^Took {TIME}: data {TIME}, checkpoint {TIME}, source {TIME}$'


def tiny_cli(data_root, head='mmseg'):
    """The tiny model and loader of ``tiny_options`` as CLI words (the data
    root goes through ``--data-root``)."""
    opts = tiny_options(data_root, rounds=1, head=head)
    del opts['test_dataloader.dataset.data_root']
    return ['--data-root', str(data_root), '--cfg-options'] + as_cli(opts)


def check(load_tool, capsys, config, checkpoint, data_root, *extra,
          head='mmseg'):
    """The tool's exit status and what it printed."""
    status = load_tool('check_setup').main(
        [config, str(checkpoint), *extra] + tiny_cli(data_root, head))
    return status, capsys.readouterr().out


def copy_tree(tiny_acdc, tmp_path):
    root = str(tmp_path / 'acdc')
    shutil.copytree(tiny_acdc, root)
    return root


def first_label(root, condition='fog'):
    folder = osp.join(root, 'gt', condition, 'train')
    return sorted(osp.join(d, n) for d, _, names in os.walk(folder)
                  for n in names if n.endswith('_gt_labelTrainIds.png'))[0]


def test_stand_in_passes_against_its_recorded_numbers(
        tiny_acdc, tiny_checkpoint, tmp_path, capsys, load_tool):
    if RECORD:  # the numbers, then the file's own check below
        tool = load_tool('check_setup')
        args = tool.parse_args([CONFIG, tiny_checkpoint] +
                               tiny_cli(tiny_acdc))
        scores = tool.run_source(tool.load_cfg(args), args,
                                 str(tmp_path / 'record'), ())
        with open(EXPECTED) as f:
            data = json.load(f)
        data['scores'] = {k: round(v, 6) for k, v in scores.items()}
        with open(EXPECTED, 'w') as f:
            f.write(json.dumps(data, indent=1) + '\n')
    status, out = check(load_tool, capsys, CONFIG, tiny_checkpoint,
                        tiny_acdc, '--expected', EXPECTED,
                        '--work-dir', str(tmp_path / 'run'))
    assert status == 0, out
    assert 'Verdict: PASS' in out
    assert 'data PASS, checkpoint PASS, source PASS' in out
    # round 1 only: Source's row
    with open(tmp_path / 'run' / 'continual_results.json') as f:
        stages = json.load(f)['stages']
    assert [(s['round'], s['condition']) for s in stages] == [
        (1, 'fog'), (1, 'night'), (1, 'rain'), (1, 'snow')]
    # how long each check took, and all of them
    assert re.search(rf'^\[PASS\] data \({TIME}\)$', out, re.M), out
    assert re.search(TOOK, out, re.M), out
    # the next command runs the config checked, in MMSeg's default work dir
    commands = next_commands(out)
    assert commands[0][:4] == ['python', 'tools/test.py', CONFIG,
                               tiny_checkpoint]
    assert osp.isfile(commands[0][2])
    stem = osp.splitext(osp.basename(CONFIG))[0]
    assert f'its work dir work_dirs/{stem}, tools/test.py\'s default' in out
    # MMSeg's zoo B5 has no table of the paper: no reproduce.py line
    assert len(commands) == 1


def next_commands(out):
    """The commands of the output's "Next:" lines, as words."""
    tail = out[out.index('\nNext: '):]
    return [shlex.split(line) for line in tail.splitlines()
            if line.strip().startswith('python ')]


@pytest.mark.parametrize('moved, status', [(0.5, 0), (2.0, 1)])
def test_an_expectation_moved_beyond_the_tolerance_fails(
        tiny_acdc, tiny_checkpoint, tmp_path, capsys, load_tool, moved,
        status):
    with open(EXPECTED) as f:
        expected = json.load(f)
    expected['scores']['night'] += moved * expected['tolerance']
    path = tmp_path / 'moved.json'
    path.write_text(json.dumps(expected))
    got, out = check(load_tool, capsys, CONFIG, tiny_checkpoint, tiny_acdc,
                     '--expected', str(path), '--work-dir',
                     str(tmp_path / 'run'))
    assert got == status, out
    if status:
        assert '[FAIL] source' in out and '- night: ' in out
        assert 'Verdict: FAIL (source)' in out
        assert '- fog' not in out  # the others still hold


def test_a_missing_condition_fails_naming_its_folder(
        tiny_acdc, tiny_checkpoint, tmp_path, capsys, load_tool):
    root = copy_tree(tiny_acdc, tmp_path)
    shutil.rmtree(osp.join(root, 'rgb_anon', 'night'))
    status, out = check(load_tool, capsys, CONFIG, tiny_checkpoint, root,
                        '--expected', EXPECTED)
    assert status == 1
    folder = osp.join(root, 'rgb_anon', 'night', 'train')
    assert f'condition night: the folder {folder} does not exist' in out
    assert '[SKIPPED] source' in out  # no run on a broken tree


@pytest.mark.parametrize('kind', ['raw ids', 'colour'])
def test_a_label_not_in_train_ids_fails_naming_the_file(
        tiny_acdc, tiny_checkpoint, tmp_path, capsys, load_tool, kind):
    root = copy_tree(tiny_acdc, tmp_path)
    label = first_label(root)
    with Image.open(label) as image:
        shape = np.asarray(image).shape
    if kind == 'raw ids':  # Cityscapes' labelIds: person 24, car 26, ...
        array = np.full(shape, 7, np.uint8)  # road
        array[:, :10], array[:, 10:20], array[:, 20:30] = 24, 26, 33
    else:
        array = np.zeros(shape + (3, ), np.uint8)
        array[..., 0] = 128
    Image.fromarray(array).save(label)
    status, out = check(load_tool, capsys, CONFIG, tiny_checkpoint, root,
                        '--expected', EXPECTED)
    assert status == 1
    if kind == 'raw ids':
        assert f'{label} has values [24, 26, 33] outside the 19 train ids' \
            in out
    else:
        assert f'{label} is a colour image (mode RGB), not train ids' in out
    assert out.count(' has values ') + out.count('colour image') == 1


def test_a_checkpoint_of_another_class_count_fails_naming_file_and_key(
        tiny_acdc, tmp_path, capsys, load_tool):
    opts = dict(tiny_options(tiny_acdc), **{
        'model.decode_head.num_classes': 7})
    model, _ = build_from_config(SEG_CFG.format('source'), opts)
    ckpt = save_checkpoint(model, tmp_path / 'seven.pth')
    status, out = check(load_tool, capsys, CONFIG, ckpt, tiny_acdc,
                        '--expected', EXPECTED)
    assert status == 1
    assert (f'{ckpt}: decode_head.conv_seg.weight has 7 classes, the data '
            'set has 19') in out
    assert 'Verdict: FAIL (checkpoint)' in out


def test_unexpected_keys_are_listed(tiny_acdc, tiny_checkpoint, tmp_path,
                                    capsys, load_tool):
    ckpt = torch.load(tiny_checkpoint, weights_only=True)
    ckpt['state_dict']['decode_head.extra.weight'] = torch.zeros(1)
    del ckpt['state_dict']['backbone.layers.0.2.weight']
    path = str(tmp_path / 'extra.pth')
    torch.save(ckpt, path)
    status, out = check(load_tool, capsys, CONFIG, path, tiny_acdc,
                        '--expected', EXPECTED, '--no-run')
    assert status == 1
    assert f'{path} does not match the model built by the config' in out
    assert 'missing keys (1): backbone.layers.0.2.weight' in out
    assert 'unexpected keys (1): decode_head.extra.weight' in out


def test_an_nvlabs_config_needs_the_converters_meta(
        tiny_acdc, tmp_path, capsys, load_tool):
    config = NVLABS_SEG_CFG.format('source')
    model, _ = build_from_config(config, tiny_options(tiny_acdc,
                                                      head='nvlabs'))
    state = model.state_dict()
    plain = save_checkpoint(model, tmp_path / 'plain.pth')  # meta: seed
    status, out = check(load_tool, capsys, osp.join(REPO, config), plain,
                        tiny_acdc, '--expected', EXPECTED, '--no-run',
                        head='nvlabs')
    assert status == 1
    assert (f'{plain} has no meta converter/converted_from: the *nvlabs* '
            'configs take NVlabs\' checkpoint after `python '
            'tools/convert_nvlabs_segformer.py') in out
    converted = str(tmp_path / 'converted.pth')
    torch.save({'state_dict': state, 'meta': {
        'converted_from': 'segformer.b5.1024x1024.city.160k.pth',
        'converter': 'tools/convert_nvlabs_segformer.py'}}, converted)
    status, out = check(load_tool, capsys, osp.join(REPO, config), converted,
                        tiny_acdc, '--expected', EXPECTED, '--no-run',
                        head='nvlabs')
    assert status == 0, out
    assert 'converted from segformer.b5.1024x1024.city.160k.pth' in out


def test_the_paper_reference_and_its_tolerances(load_tool):
    tool = load_tool('check_setup')
    nvlabs = tool.setting_of(osp.basename(NVLABS_SEG_CFG.format('tent')))
    ref = tool.reference_of(False, nvlabs, None, ())
    assert ref['scores'] == {'fog': 69.1, 'night': 40.3, 'rain': 59.7,
                             'snow': 57.8} and ref['tolerance'] == 1.0
    # MMSeg's zoo B5 is another model: the paper has no Source row of it
    mmseg = tool.setting_of(osp.basename(SEG_CFG.format('tent')))
    assert tool.reference_of(False, mmseg, None, ()) is None
    # a subset of 500: 3 binomial standard errors + 1 point
    ref = {'scores': {'gaussian_noise': 72.3}, 'tolerance': None}
    assert tool.tolerance_of(ref, 'gaussian_noise', 500) == pytest.approx(
        1.0 + 3 * 100 * (0.723 * 0.277 / 500) ** 0.5)


# ------------------------------------------------------- classification


def cifar_tree(root, names=('gaussian_noise', 'fog'), n=20, classes=4):
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(0)
    np.save(osp.join(root, 'labels.npy'),
            np.tile(rng.integers(0, classes, n), 5))
    for c in names:
        np.save(osp.join(root, f'{c}.npy'),
                rng.integers(0, 256, (5 * n, 32, 32, 3), dtype=np.uint8))
    return root


def cls_check(load_tool, capsys, root, checkpoint, tmp_path, *extra,
              classes=4):
    """The real CIFAR-10-C Source config with the tiny CNN and stream, as a
    config file of the shipped name (the tool reads the setting from it)."""
    from cls_helpers import CIFAR, options
    from run_helpers import killable_config
    opts = options(root, ['gaussian_noise', 'fog'], n_examples=20)
    del opts['test_cfg.method.optimizer']  # Source has none
    config = killable_config(CIFAR.format('source'), opts, tmp_path,
                             kill=False, name=osp.basename(
                                 CIFAR.format('source')))
    expected = tmp_path / 'cls_expected.json'
    expected.write_text(json.dumps(dict(
        scores={'gaussian_noise': 50.0, 'fog': 50.0}, tolerance=50.0,
        metric='err', classes=classes, images_per_corruption=20)))
    status = load_tool('check_setup').main(
        [config, checkpoint, '--expected', str(expected),
         '--corruptions', 'gaussian_noise', 'fog', '--images', '20',
         '--work-dir', str(tmp_path / 'cls_run'), *extra])
    return status, capsys.readouterr().out


@pytest.fixture
def cls_checkpoint(tmp_path):
    from mmseg_stag.classification import SmallCNN
    torch.manual_seed(0)
    path = str(tmp_path / 'cnn.pth')
    torch.save({'state_dict': SmallCNN(num_classes=4, width=4,
                                       norm='BN').state_dict(), 'meta': {}},
               path)
    return path


def test_classification_tree_checkpoint_and_source(tmp_path, capsys,
                                                    load_tool,
                                                    cls_checkpoint):
    root = cifar_tree(str(tmp_path / 'cifar-c'))
    status, out = cls_check(load_tool, capsys, root, cls_checkpoint,
                            tmp_path)
    assert status == 0, out
    assert 'data PASS, checkpoint PASS, source PASS' in out
    with open(tmp_path / 'cls_run' / 'continual_results.json') as f:
        per = json.load(f)['details']['per_corruption']
    assert {c: v['total'] for c, v in per.items()} == {
        'gaussian_noise': 20, 'fog': 20}
    # the data set has 10 classes, the checkpoint 4
    status, out = cls_check(load_tool, capsys, root, cls_checkpoint,
                            tmp_path, '--no-run', classes=10)
    assert status == 1
    assert f'{cls_checkpoint}: fc.weight has 4 classes, the data set has 10' \
        in out


def test_classification_missing_corruption_file_fails(
        tmp_path, capsys, load_tool, cls_checkpoint):
    root = cifar_tree(str(tmp_path / 'cifar-c'), names=('gaussian_noise', ))
    status, out = cls_check(load_tool, capsys, root, cls_checkpoint,
                            tmp_path)
    assert status == 1
    assert f'corruption fog: {osp.join(root, "fog.npy")} does not exist' \
        in out


@pytest.mark.parametrize('config, kept', [
    ('configs/cls/imagenet-c/imagenet-c_mild_resnet50-bn_eata-stag.py', {}),
    (NVLABS_SEG_CFG.format('tent-stag_bf16-graph'), {
        'mixed_precision': 'bf16', 'preset': 'fast'}),
    (NVLABS_SEG_CFG.format('cotta_bf16-graph'), {
        'mixed_precision': 'bf16', 'preset': 'fast'}),
    (NVLABS_SEG_CFG.format('bn-adapt-stag_bf16'), {
        'mixed_precision': 'bf16', 'preset': 'fast'})])
def test_the_source_run_drops_the_method_and_keeps_the_loop(config, kept,
                                                            load_tool):
    tool = load_tool('check_setup')
    args = tool.parse_args([osp.join(REPO, config), 'unused.pth'])
    cfg = tool.source_cfg(tool.load_cfg(args), args, ['fog'])
    # the method and its options (CoTTA's restore_on_device, batch_views)
    # (test-batch BN statistics among them: Source keeps the running ones)
    assert cfg.test_cfg.method == {'type': 'source'}
    assert 'source_dataloader' not in cfg.test_cfg
    # the graph of the method's step (the wrapper refuses Source)
    assert 'cuda_graph' not in cfg.test_cfg
    assert 'graph_warmup' not in cfg.test_cfg
    assert {k: cfg.test_cfg.get(k) for k in kept} == kept
    if kept:  # what moves Source's numbers stays: the preset's attention
        assert cfg.model.backbone.attention == 'sdpa'
    ds = cfg.test_dataloader.dataset
    if tool.is_classification(cfg):
        assert ds.corruptions == ['fog']
        assert ds.corruption_set.n_examples == tool.DEFAULT_IMAGES
    else:
        assert ds.rounds == 1


def test_conditions_kept_by_the_config_are_compared_alone(
        tiny_acdc, tiny_checkpoint, tmp_path, capsys, load_tool):
    status, out = check(load_tool, capsys, CONFIG, tiny_checkpoint,
                        tiny_acdc, '--expected', EXPECTED, '--work-dir',
                        str(tmp_path / 'run'), '--cfg-options',
                        "test_dataloader.dataset.conditions=['snow']")
    assert status == 0, out
    assert '  snow ' in out and '  fog ' not in out


# ------------------------------------------------------- the fast presets


@pytest.fixture(scope='module')
def nvlabs_checkpoint(tiny_acdc, tmp_path_factory):
    """The tiny NVlabs-head SegFormer with the converter's meta, as the
    ``*nvlabs*`` configs (the presets among them) take it."""
    model, _ = build_from_config(NVLABS_SEG_CFG.format('source'),
                                 tiny_options(tiny_acdc, head='nvlabs'))
    path = str(tmp_path_factory.mktemp('nvlabs') / 'converted.pth')
    torch.save({'state_dict': model.state_dict(), 'meta': {
        'converted_from': 'segformer.b5.1024x1024.city.160k.pth',
        'converter': 'tools/convert_nvlabs_segformer.py'}}, path)
    return path


def test_a_preset_without_cuda_checks_data_and_checkpoint_and_says_how(
        tiny_acdc, nvlabs_checkpoint, tmp_path, capsys, load_tool):
    tool = load_tool('check_setup')
    tool.cuda_available = lambda: False  # a CPU machine, on any machine
    status = tool.main([PRESET, nvlabs_checkpoint, '--expected', EXPECTED,
                        '--work-dir', str(tmp_path / 'run')]
                       + tiny_cli(tiny_acdc, head='nvlabs'))
    out = capsys.readouterr().out
    assert status == 1, out
    assert 'Traceback' not in out
    assert 'Verdict: FAIL (source) -- data PASS, checkpoint PASS, source ' \
        'FAIL' in out
    assert "not run: test_cfg.preset='fast' runs on a CUDA GPU only, and " \
        'this machine has none' in out
    # the check of the faithful config instead: a config that exists
    line = next(line for line in out.splitlines()
                if 'python tools/check_setup.py' in line)
    faithful = shlex.split(line.split(' (and those of', 1)[0])
    assert faithful[2] == osp.join(REPO, NVLABS_SEG_CFG.format('tent-stag'))
    assert osp.isfile(faithful[2])
    assert faithful[3:] == [nvlabs_checkpoint, '--data-root', tiny_acdc,
                            '--expected', EXPECTED]
    # what the preset changes, stated before
    assert 'Source in place of tent; dropped with it: test_cfg.cuda_graph=' \
        'True (Source has no step to replay as a CUDA graph)' in out
    assert 'preset fast: bfloat16 autocast, SDPA attention on views of the' \
        ' tokens' in out
    assert not osp.exists(tmp_path / 'run')  # nothing ran
    assert re.search(TOOK, out, re.M), out
    assert 'Next: the check on the GPU machine, or the faithful config' in out


def test_a_preset_source_run_drops_the_graph_and_keeps_bf16(
        tiny_acdc, nvlabs_checkpoint, tmp_path, capsys, load_tool):
    """On the CPU the preset runs once its CUDA requirement is lifted
    (``test_cfg.preset=None``): the graph of the method's step (which the
    loop refuses without CUDA, and the wrapper refuses for Source) is
    dropped, bfloat16 autocast and SDPA kept."""
    expected = tmp_path / 'wide.json'  # the numbers are not the question
    expected.write_text(json.dumps(dict(
        scores=dict.fromkeys(('fog', 'night', 'rain', 'snow'), 50.0),
        tolerance=100.0, images_per_condition=2)))
    status = load_tool('check_setup').main(
        [PRESET, nvlabs_checkpoint, '--expected', str(expected),
         '--work-dir', str(tmp_path / 'run')]
        + tiny_cli(tiny_acdc, head='nvlabs') + ['test_cfg.preset=None'])
    out = capsys.readouterr().out
    assert status == 0, out
    assert 'Verdict: PASS -- data PASS, checkpoint PASS, source PASS' in out
    with open(tmp_path / 'run' / 'continual_results.json') as f:
        provenance = json.load(f)['provenance']
    assert provenance['method'] == {'type': 'source'}
    assert provenance['mixed_precision'] == 'bf16'
    assert provenance['cuda_graph'] is False
    assert 'speed options: bfloat16 autocast, SDPA attention on views of ' \
        'the tokens -- compared with --expected\'s numbers within its ' \
        '100.00 points' in out
    commands = next_commands(out)
    assert commands[0][2] == PRESET and osp.isfile(commands[0][2])
    assert commands[1] == ['python', 'tools/reproduce.py', 'table9',
                           '--checkpoint', nvlabs_checkpoint,
                           '--data-root', tiny_acdc]


def test_the_paper_comparison_of_a_preset_states_its_tolerance(load_tool):
    tool = load_tool('check_setup')
    args = tool.parse_args([PRESET, 'unused.pth'])
    cfg = tool.load_cfg(args)
    ref = tool.reference_of(False, tool.setting_of(osp.basename(PRESET)),
                            None, ())
    sentence = tool.preset_sentence(tool.source_cfg(cfg, args, ()), ref)
    assert sentence.startswith(
        'preset fast: bfloat16 autocast, SDPA attention on views of the '
        'tokens (8 loader workers: no effect on the numbers) -- compared '
        'with the paper\'s Source (float32) within 1.0 point')
    assert f'at most {tool.BF16_SHIFT} point a condition' in sentence
    # the faithful config: no such sentence
    faithful = tool.parse_args([osp.join(REPO, NVLABS_SEG_CFG.format(
        'tent-stag')), 'unused.pth'])
    assert tool.preset_sentence(tool.load_cfg(faithful), ref) is None


@pytest.mark.parametrize('config', sorted(glob.glob(osp.join(
    REPO, 'configs', 'stag_acdc', '*nvlabs*.py'))))
def test_the_next_command_names_configs_that_exist(config, load_tool):
    tool = load_tool('check_setup')
    args = tool.parse_args([config, 'ckpt.pth', '--data-root', 'data/acdc'])
    cfg = tool.load_cfg(args)
    commands = [shlex.split(line) for line in tool.next_command(
        cfg, args).splitlines() if line.strip().startswith('python ')]
    assert commands[0] == [
        'python', 'tools/test.py', config, 'ckpt.pth', '--cfg-options',
        'test_dataloader.dataset.data_root=data/acdc']
    preset = cfg.test_cfg.get('preset')
    if preset:  # its faithful sibling exists, for the check on a CPU
        assert osp.isfile(tool.faithful_config(config))
    table = commands[1:]
    if tool.setting_of(osp.basename(config))['method'] in (
            'source', 'bn_adapt', 'tent'):  # Table 9's rows
        assert table == [['python', 'tools/reproduce.py', 'table9',
                          '--checkpoint', 'ckpt.pth', '--data-root',
                          'data/acdc'] + (['--preset', preset]
                                          if preset else [])]
    else:  # CoTTA, EATA, ...: no row of the paper's Table 9
        assert table == []


def test_a_classification_config_names_its_table(load_tool):
    tool = load_tool('check_setup')
    config = osp.join(REPO, 'configs', 'cls', 'cifar-c',
                      'cifar10-c_continual_wrn-28-10_tent.py')
    args = tool.parse_args([config, 'ckpt.pth', '--data-root', 'c10c'])
    commands = [shlex.split(line) for line in tool.next_command(
        tool.load_cfg(args), args).splitlines()
                if line.strip().startswith('python ')]
    assert commands == [
        ['python', 'tools/test.py', config, 'ckpt.pth', '--cfg-options',
         'test_dataloader.dataset.corruption_set.data_root=c10c'],
        ['python', 'tools/reproduce.py', 'cifar10-c_continual_wrn-28-10',
         '--checkpoint', 'ckpt.pth', '--data-root', 'c10c']]


@pytest.mark.skipif(torch.cuda.is_available(), reason='fp16 runs on CUDA')
def test_a_refused_option_of_the_source_run_is_a_verdict(
        tiny_acdc, tiny_checkpoint, tmp_path, capsys, load_tool):
    status, out = check(load_tool, capsys, CONFIG, tiny_checkpoint,
                        tiny_acdc, '--expected', EXPECTED, '--work-dir',
                        str(tmp_path / 'run'), '--cfg-options',
                        'test_cfg.mixed_precision=fp16')
    assert status == 1
    assert "- the Source run stopped: mixed_precision='fp16' needs a GPU" \
        in out
    assert 'Verdict: FAIL (source)' in out
    assert 'speed options: float16 autocast' in out
