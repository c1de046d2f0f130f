"""The task interface of the online loop: batches in, data samples out."""
from abc import ABC, abstractmethod
from typing import Iterable, Iterator, Optional

import torch
import torch.nn as nn
from mmengine.registry import Registry
from mmengine.structures import BaseDataElement

from mmseg_stag.core import (Batch, HeadProbe, Prediction, TaskAdapter,
                             build_method)

#: ``segmentation`` (``mmseg_stag.segmentation``) and ``classification``
ONLINE_TASKS = Registry('online adaptation task', scope='mmseg_stag')


class OnlineTask(ABC):
    """Task side of ``OnlineAdaptationLoop``, one object per run.

    Args:
        model (nn.Module): The runner's model.
        head_layer (str, optional): Module name of the classifier in the
            adapted module; None: the task's default.
    """

    #: ``'per_sample'`` or ``'per_pixel'``: where the classifier predicts
    prediction_kind = 'per_sample'
    #: the ``task`` a stream dataset declares
    name = ''

    def __init__(self, model: nn.Module, head_layer: Optional[str]):
        self.probe = HeadProbe(head_layer or self.default_head_layer(model),
                               prediction_kind=self.prediction_kind)
        self.probe.find(self.adapted_module(model))  # fail before the stream
        #: what the method is given: the task's operations on a batch
        self.task_adapter = self.build_adapter(model)

    def build_adapter(self, model: nn.Module) -> TaskAdapter:
        """Return the :class:`TaskAdapter` the method is configured with."""
        return TaskAdapter(self.probe)

    def default_head_layer(self, model: nn.Module) -> Optional[str]:
        """Return the default head layer (None: the last ``nn.Linear``)."""
        return None

    def setup(self, dataset) -> None:
        """Read settings from the stream dataset, once."""

    def build_method(self, cfg: dict):
        """Build the method of ``cfg`` from ``METHODS``."""
        return build_method(cfg)

    # how a method is readied for a stream: the loop's, and the step
    # benchmarks' before they time (benchmarks/step_benchmark.py)
    def configure(self, method, adapted: nn.Module) -> None:
        """Configure ``method`` on the ``adapted`` module with the task's
        task_adapter (:meth:`adapted_module` of the runner's model)."""
        method.configure(adapted, self.task_adapter)

    def fit_source(self, method, batches: Iterable[Batch]) -> None:
        """``method.fit_source(batches)`` in float32: squared fp16 gradients
        underflow (EATA's Fisher information); it runs once a run."""
        adapter = self.task_adapter
        dtype, adapter.autocast_dtype = adapter.autocast_dtype, None
        try:
            method.fit_source(batches)
        finally:
            adapter.autocast_dtype = dtype

    @classmethod
    @abstractmethod
    def matches(cls, model: nn.Module) -> bool:
        """Return whether ``model`` is this task's kind of model."""

    def adapted_module(self, model: nn.Module) -> nn.Module:
        """Return the module the method adapts."""
        return model

    def check_dataset(self, dataset) -> None:
        """Raise ``ValueError`` if ``dataset`` declares another task."""
        task = getattr(dataset, 'task', None)
        if task is not None and task != self.name:
            raise ValueError(
                f'test_dataloader.dataset is a {task} stream '
                f'({type(dataset).__name__}) but the model is a {self.name} '
                f'model ({self.model_kind}): use a {self.name} dataset, or '
                f'a {task} model')

    model_kind = ''

    @abstractmethod
    def batch(self, model: nn.Module, data_batch: dict) -> Batch:
        """Return the preprocessed batch the method adapts on."""

    @abstractmethod
    def outputs(self, batch: Batch, prediction: Prediction) -> list:
        """Return the data samples with ``prediction`` (``Logits`` or
        ``Labels``) set."""

    def source_batches(self, model: nn.Module, dataloader) -> Iterator[Batch]:
        """Yield the clean source batches of the method's ``fit_source``."""
        for data_batch in dataloader:
            yield self.source_batch(preprocess(model, data_batch)['inputs'])

    def source_batch(self, inputs) -> Batch:
        """Return a clean source batch of preprocessed ``inputs``."""
        return Batch(inputs)

    def inference_config(self, cfg, meta: dict,
                         path: str = '<config>') -> Optional[dict]:
        """The config another library's inferencer rebuilds an adapted
        checkpoint of a run of ``cfg`` with (its ``meta``), written beside
        it; None: none (a segmentor's: MMSeg's ``MMSegInferencer``)."""
        return None


def preprocess(model: nn.Module, data_batch: dict) -> dict:
    """``model.data_preprocessor(data_batch)`` (no grad), its tensors and
    data samples copied to the model's device first without waiting for
    it (:func:`to_device`); the preprocessor then finds them there."""
    device = next(model.parameters()).device
    with torch.no_grad():
        return model.data_preprocessor(to_device(data_batch, device), False)


def to_device(data, device: torch.device):
    """``data`` (a loader's batch: tensors and data samples in dicts,
    lists and tuples) on ``device``, each copy ``non_blocking``: from the
    pinned memory of ``pin_memory=True`` it runs while the GPU still works
    on the step before, and from pageable memory it returns once the host
    buffer is staged. A blocking copy, MMSeg's preprocessor's, would wait
    for every queued kernel first, at each batch."""
    if torch.is_tensor(data) or isinstance(data, BaseDataElement):
        return data.to(device, non_blocking=True)
    if isinstance(data, dict):
        return type(data)((k, to_device(v, device)) for k, v in data.items())
    if isinstance(data, (list, tuple)):
        return type(data)(to_device(v, device) for v in data)
    return data


def head_layer_of(cfg) -> Optional[str]:
    """Return ``test_cfg.head_layer``, the one config key of the
    classifier's module name; None: the task's default."""
    return (cfg.get('test_cfg') or {}).get('head_layer')


def build_task(model: nn.Module, task: Optional[str],
               head_layer: Optional[str], **options) -> OnlineTask:
    """Build the task named ``task``, or the one matching ``model``
    (``ValueError`` if none fits or ``task`` does not match the model)."""
    if task is None:
        found = [cls for cls in ONLINE_TASKS.module_dict.values()
                 if cls.matches(model)]
        if not found:
            raise ValueError(
                f'OnlineAdaptationLoop: no task for a {type(model).__name__}'
                f' model (known: {sorted(ONLINE_TASKS.module_dict)}); '
                'a segmentor needs MMSeg installed, a classifier is an '
                'OnlineClassifier')
        cls = found[0]
    else:
        cls = ONLINE_TASKS.get(task)
        if cls is None:
            raise ValueError(f'test_cfg.task={task!r}: unknown task (known: '
                             f'{sorted(ONLINE_TASKS.module_dict)})')
        if not cls.matches(model):
            raise ValueError(f'test_cfg.task={task!r} but the model is a '
                             f'{type(model).__name__}')
    return cls(model, head_layer, **options)
