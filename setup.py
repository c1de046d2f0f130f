"""Install mmseg_stag: ``pip install -e .`` (see README for the full stack)."""
import os.path as osp
from setuptools import find_packages, setup


def read_version():
    init = osp.join(osp.dirname(__file__), 'mmseg_stag', '__init__.py')
    with open(init, encoding='utf-8') as f:
        for line in f:
            if line.startswith('__version__'):
                return line.split('=')[1].strip().strip("'\"")
    raise RuntimeError(f'no __version__ in {init}')


setup(
    name='mmseg_stag',
    version=read_version(),
    description='STAG (Structural Test-time Alignment of Gradients) for '
    'online test-time adaptation, as an MMSegmentation 1.x plugin',
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    license='Apache-2.0',
    packages=find_packages(include=['mmseg_stag', 'mmseg_stag.*']),
    # The floors of mmseg_stag/versions.py (which refuses an older Python
    # or torch at import, naming both versions): Python 3.9 for
    # str.removeprefix, torch 2.3 for torch.amp.GradScaler(device).
    python_requires='>=3.9',
    # The core (STAG math and loss, methods, probe) and the classification
    # harness need torch and MMEngine only; the MMSeg side needs the `seg`
    # extra (tools/install_env.sh installs it). Ranges admit the tested stack
    # (torch 2.13, mmengine 0.10.7, mmcv 2.1.0, mmsegmentation 1.2.2); mmseg
    # 1.2.x refuses mmcv >= 2.2.0.
    install_requires=[
        'torch>=2.3',
        'mmengine>=0.10.0,<1.0.0',
        'numpy',
        'matplotlib',
    ],
    extras_require={
        'seg': [
            'mmcv>=2.0.0rc4,<2.2.0',
            'mmsegmentation>=1.2.0,<1.3.0',
            'ftfy',
            'regex',
            # mmcv's setup.py and mmengine's ``mmseg::`` config prefix import
            # pkg_resources, which setuptools 81 removed.
            'setuptools<81',
        ],
        'tests': ['pytest', 'pytest-xdist', 'ruff', 'isort'],
        'demo': ['scikit-image', 'imagecorruptions-imaug', 'mlxtend'],
        # ImageNet-C models: torchvision ResNet-50, timm ResNet-50-GN/ViT-B
        'cls': ['torchvision', 'timm'],
        # tools/sweep.py: many runs on many GPUs/nodes (Ray Tune)
        'sweep': ['ray[tune]>=2.9'],
        # tools/analysis/tsne.py
        'analysis': ['scikit-learn'],
        # make docs: the documentation site (mkdocs.yml), built strict
        'docs': ['mkdocs==1.6.1', 'mkdocs-material==9.8.2'],
    },
    zip_safe=False,
)
