"""A classification network behind MMEngine's model interface."""
from typing import List, Optional, Sequence

import torch
from mmengine.model import BaseDataPreprocessor, BaseModel

from mmseg_stag.registry import MODELS
from .models import load_weights
from .registry import CLS_MODELS


@MODELS.register_module()
class ClassifierPreprocessor(BaseDataPreprocessor):
    """Scale uint8 images to ``[0, 1]`` and normalise them by the channel
    ``mean`` and ``std`` if either is given."""

    def __init__(self, mean: Optional[Sequence[float]] = None,
                 std: Optional[Sequence[float]] = None):
        super().__init__()
        self.normalise = mean is not None or std is not None
        if self.normalise:
            for name, value, fill in (('mean', mean, 0.), ('std', std, 1.)):
                value = (fill, ) * 3 if value is None else value
                self.register_buffer(
                    name, torch.tensor(value).view(1, -1, 1, 1), False)

    def forward(self, data: dict, training: bool = False) -> dict:
        data = self.cast_data(data)
        inputs = data['inputs']
        if isinstance(inputs, (list, tuple)):
            inputs = torch.stack(list(inputs))
        x = inputs.float().div_(255.0)
        if self.normalise:
            x = (x - self.mean) / self.std
        return dict(inputs=x, data_samples=data.get('data_samples'))


@MODELS.register_module()
class OnlineClassifier(BaseModel):
    """A ``CLS_MODELS`` config ``network`` with a ``ClassifierPreprocessor``
    config ``data_preprocessor`` (default: no normalisation)."""

    def __init__(self, network: dict,
                 data_preprocessor: Optional[dict] = None,
                 init_cfg: Optional[dict] = None):
        preprocessor = dict(data_preprocessor or {})
        preprocessor.setdefault('type', 'ClassifierPreprocessor')
        # build in this scope, whatever the caller's default scope
        super().__init__(
            data_preprocessor=MODELS.build(
                dict(preprocessor, _scope_='mmseg_stag')),
            init_cfg=init_cfg)
        self.network = CLS_MODELS.build(dict(network))

    def load_weights(self, path: str, allow_unsafe_pickle: bool = False):
        """Strictly load a weight file into the network."""
        load_weights(self.network, path, allow_unsafe_pickle)

    def forward(self, inputs: torch.Tensor,
                data_samples: Optional[List] = None, mode: str = 'tensor'):
        """Return the logits (mode ``'tensor'`` only: the online loop's task
        adapts and scores)."""
        if mode != 'tensor':
            raise ValueError(f"OnlineClassifier has mode 'tensor' only (it "
                             'runs in OnlineAdaptationLoop), got '
                             f'{mode!r}')
        return self.network(inputs)
