"""``TTAHook``: online test-time adaptation inside MMSeg's test loop."""
from typing import Optional, Union

from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmseg.registry import HOOKS

from mmseg_stag.registry import TTA_METHODS, build_tta_method


@HOOKS.register_module()
class TTAHook(Hook):
    """Adapt the model online while ``tools/test.py`` evaluates it.

    The hook builds a TTA method (``mmseg_stag.methods``) before the test loop
    starts and hands it to the segmentor (``TTAEncoderDecoder.tta_adapter``).
    The segmentor's ``predict`` then runs, per batch, one forward pass whose
    logits give both the prediction and the loss, one backward and one
    optimizer step (predict-then-adapt). After each batch the hook logs the
    loss, ``L_STAG`` and ``beta_t`` through MMEngine's message hub (printed by
    the ``LoggerHook`` every ``interval`` iterations).

    Args:
        method (str | dict): ``'source'``, ``'bn_adapt'``, ``'tent'`` or a
            method config such as ``dict(type='tent', loss='pseudo_ce')``.
        stag (dict, optional): ``dict(beta0=..., gamma=..., eps=1e-8)`` (and
            optionally ``anchor``/``label``) to add ``beta_t * L_STAG``.
        optimizer (dict, optional): optimizer config without params.
            Default: Adam, lr 7.5e-6, betas (0.9, 0.999).
        trainable (dict, optional): parameter selection, e.g.
            ``dict(kind='norm_affine', norm_types=('BN', 'LN'))`` (default:
            affine parameters of every norm layer) or ``dict(kind='all')``.
        reset_beta_per_stage (bool): restart the ``beta`` schedule at each
            stage of the continual stream. Default: False (as the paper).
    """

    priority = 'VERY_HIGH'

    def __init__(self,
                 method: Union[str, dict] = 'tent',
                 stag: Optional[dict] = None,
                 optimizer: Optional[dict] = None,
                 trainable: Optional[dict] = None,
                 reset_beta_per_stage: bool = False):
        method_cfg = dict(type=method) if isinstance(method, str) else \
            dict(method)
        if 'type' not in method_cfg:
            raise ValueError(f'TTAHook: method config needs a type, got '
                             f'{method!r}')
        for key, value in (('stag', stag), ('optimizer', optimizer),
                           ('trainable', trainable)):
            if value is not None:
                method_cfg[key] = value
        if reset_beta_per_stage:
            method_cfg['reset_beta_per_stage'] = True
        if method_cfg['type'] not in TTA_METHODS:
            raise KeyError(
                f"TTAHook: unknown method {method_cfg['type']!r}; available: "
                f'{sorted(TTA_METHODS.module_dict)}')
        self.method = build_tta_method(method_cfg)

    @staticmethod
    def _segmentor(runner):
        model = runner.model
        if is_model_wrapper(model):
            model = model.module
        if not hasattr(model, 'inference_with_features'):
            raise TypeError(
                'TTAHook needs a segmentor that exposes its head features: '
                f"use model type='TTAEncoderDecoder', not "
                f'{type(model).__name__}')
        return model

    def before_test(self, runner) -> None:
        model = self._segmentor(runner)
        self.method.configure(model, model.classifier)
        model.tta_adapter = self.method
        for metric in runner.test_evaluator.metrics:
            if getattr(metric, 'output_dir', False) is None:
                metric.output_dir = runner.work_dir
        n_params = sum(p.numel() for _, p in self.method.params)
        print_log(
            f'TTA: {self.method!r}; {len(self.method.params)} trainable '
            f'tensors ({n_params} values)', logger='current')

    def after_test_iter(self, runner, batch_idx, data_batch=None,
                        outputs=None) -> None:
        for key, value in self.method.last_stats.items():
            runner.message_hub.update_scalar(f'test/{key}', value)

    def after_test(self, runner) -> None:
        print_log(f'TTA: {self.method.num_updates} update steps',
                  logger='current')
