"""Classification task of ``OnlineAdaptationLoop``."""
from mmseg_stag.core import Batch, Logits, Prediction
from mmseg_stag.engine.online_task import ONLINE_TASKS, OnlineTask, preprocess
from .classifier import OnlineClassifier


@ONLINE_TASKS.register_module(name='classification')
class ClassificationTask(OnlineTask):
    """An ``OnlineClassifier`` on a ``CorruptionStream``."""

    name = 'classification'
    model_kind = 'an OnlineClassifier'

    @classmethod
    def matches(cls, model) -> bool:
        return isinstance(model, OnlineClassifier)

    def adapted_module(self, model):
        return model.network

    def batch(self, model, data_batch: dict) -> Batch:
        data = preprocess(model, data_batch)
        return Batch(data['inputs'], data['data_samples'])

    def outputs(self, batch: Batch, prediction: Prediction) -> list:
        if not isinstance(prediction, Logits):
            raise ValueError('a classification method predicts logits, got '
                             f'{type(prediction).__name__}')
        for sample, label in zip(batch.data_samples,
                                 prediction.value.argmax(1).tolist()):
            sample.set_metainfo(dict(pred_label=label))
        return batch.data_samples
