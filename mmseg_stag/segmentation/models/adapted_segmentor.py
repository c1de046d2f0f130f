"""An adapted checkpoint as MMSeg's own tools read it: the segmentor that
rebuilds what a method changed (:class:`AdaptedEncoderDecoder`) and the
inference config written beside the checkpoint (:func:`inference_config`),
which ``mmseg.apis.MMSegInferencer(model=CONFIG, weights=CHECKPOINT)``
reads (docs/adapt.md)."""
import copy
from typing import List, Optional, Sequence, Union

from mmseg.models.segmentors import EncoderDecoder
from mmseg.registry import MODELS
from torch.nn.modules.batchnorm import _BatchNorm

from mmseg_stag.checkpoint import attach_added_modules

#: the segmentors an inference config can stand in for
SEGMENTOR_TYPES = ('EncoderDecoder', 'AdaptedEncoderDecoder')


@MODELS.register_module()
class AdaptedEncoderDecoder(EncoderDecoder):
    """MMSeg's ``EncoderDecoder`` as an adapted checkpoint's run left it.

    Args:
        batch_statistics (bool | list[str]): The BatchNorm layers that
            normalise with each input's own statistics, in eval mode too
            (BN Adapt's): True for every one, or their names (an adapted
            checkpoint's ``meta['batch_statistics']``). Their running
            statistics stay buffers (the checkpoint's, the source's), so it
            loads key for key, and stay as loaded (momentum 0). Default:
            False.
        added_modules (dict, optional): The modules a method attached
            (``meta['added_modules']``, e.g. Hybrid-TTA's adapters), at
            init. Default: None.
        **kwargs: ``EncoderDecoder``'s.

    Raises:
        ValueError: If a named layer is no BatchNorm layer of the model,
            or ``added_modules`` is unknown.
    """

    def __init__(self, batch_statistics: Union[bool, Sequence[str]] = False,
                 added_modules: Optional[dict] = None, **kwargs):
        super().__init__(**kwargs)
        if added_modules:
            attach_added_modules(self, added_modules,
                                 'AdaptedEncoderDecoder(added_modules)')
        layers = dict((name, m) for name, m in self.named_modules()
                      if isinstance(m, _BatchNorm))
        if batch_statistics is True:
            names = list(layers)
        else:
            names = list(batch_statistics or [])
        unknown = [n for n in names if n not in layers]
        if unknown:
            raise ValueError(f'AdaptedEncoderDecoder: batch_statistics names'
                             f' {unknown[:4]}, which are not BatchNorm layers'
                             ' of the model')
        #: the layers on batch statistics
        self.batch_statistics: List[str] = names
        for name in names:
            # batch statistics in the forward, running ones kept as loaded
            layers[name].momentum = 0.0
        self.train(self.training)

    def train(self, mode: bool = True):
        """Set the mode; the layers on batch statistics stay in training
        mode (batch statistics), in eval mode too."""
        super().train(mode)
        modules = dict(self.named_modules())
        for name in getattr(self, 'batch_statistics', ()):
            modules[name].train(True)
        return self


def config_dict(value) -> dict:
    """A config's dict (a ``ConfigDict`` too) as a plain, copied dict."""
    if hasattr(value, 'to_dict'):
        return value.to_dict()
    return copy.deepcopy(dict(value))


def plain_pipeline(pipeline: Sequence[dict]) -> List[dict]:
    """A test ``pipeline`` for one image at a time: no label loading
    (:func:`~mmseg_stag.segmentation.datasets.unlabeled_pipeline`), no
    ``LabelsAsUint8``, and ``ScaleFlipViews`` (CoTTA's teacher views) as
    its scale-1 ``Resize`` and its transforms."""
    from ..datasets import unlabeled_pipeline
    out = []
    for step in unlabeled_pipeline(pipeline):
        if step.get('type') == 'LabelsAsUint8':
            continue
        if step.get('type') == 'ScaleFlipViews':
            out.append(dict(type='Resize', scale=tuple(step['scale']),
                            keep_ratio=True))
            out.extend(copy.deepcopy(list(step.get('transforms') or [])))
            continue
        out.append(step)
    return out


def inference_config(cfg, meta: dict, path: str = '<config>') -> dict:
    """What ``MMSegInferencer`` reads to rebuild an adapted checkpoint of a
    run of ``cfg``: the package imported, the config's model as an
    :class:`AdaptedEncoderDecoder` with the checkpoint's
    ``batch_statistics`` and ``added_modules`` (its ``meta``), a plain test
    pipeline, the classes and palette, the visualizer.

    Raises:
        ValueError: If ``cfg``'s model is no ``EncoderDecoder`` (naming
            ``path``).
    """
    model = config_dict(cfg.model)
    if model.get('type') not in SEGMENTOR_TYPES:
        raise ValueError(f'{path}: an inference config rebuilds an '
                         f'EncoderDecoder, not {model.get("type")!r}')
    model.update(type='AdaptedEncoderDecoder',
                 batch_statistics=list(meta.get('batch_statistics') or []),
                 added_modules=meta.get('added_modules'))
    if model.get('data_preprocessor') is None and cfg.get(
            'data_preprocessor') is not None:
        model['data_preprocessor'] = config_dict(cfg.data_preprocessor)
    dataset = cfg.test_dataloader.dataset
    pipeline = plain_pipeline(dataset.pipeline)
    dataset_meta = meta.get('dataset_meta') or {}
    metainfo = {k: dataset_meta[k] for k in ('classes', 'palette')
                if dataset_meta.get(k) is not None}
    out = dict(
        custom_imports=dict(imports=['mmseg_stag'],
                            allow_failed_imports=False),
        default_scope='mmseg', model=model, test_pipeline=pipeline,
        test_dataloader=dict(
            batch_size=1, num_workers=0,
            dataset=dict(type='FrameStream', frames=[], pipeline=pipeline,
                         metainfo=metainfo)),
        visualizer=config_dict(cfg.get('visualizer') or dict(
            type='SegLocalVisualizer',
            vis_backends=[dict(type='LocalVisBackend')],
            name='visualizer')))
    return out
