"""Classification task of ``OnlineAdaptationLoop``."""
import torch

from mmseg_stag.core import BatchContext
from mmseg_stag.engine.online_task import (ONLINE_TASKS, OnlineBatch,
                                           OnlineTask)
from .classifier import OnlineClassifier


@ONLINE_TASKS.register_module(name='classification')
class ClassificationTask(OnlineTask):
    """An ``OnlineClassifier`` on a ``CorruptionStream``."""

    name = 'classification'
    prediction_kind = 'per_sample'
    model_kind = 'an OnlineClassifier'

    @classmethod
    def matches(cls, model) -> bool:
        return isinstance(model, OnlineClassifier)

    def adapted_module(self, model):
        return model.network

    def batch(self, model, data_batch: dict) -> OnlineBatch:
        with torch.no_grad():
            data = model.data_preprocessor(data_batch, False)
        samples = data['data_samples']

        def to_outputs(logits):
            for sample, label in zip(samples, logits.argmax(1).tolist()):
                sample.set_metainfo(dict(pred_label=label))
            return samples

        return OnlineBatch(BatchContext(data['inputs'], self.probe),
                           to_outputs)

    def source_batches(self, model, dataloader):
        def inputs():
            for batch in dataloader:
                with torch.no_grad():
                    yield model.data_preprocessor(batch, False)['inputs']

        return self.probe, inputs()
