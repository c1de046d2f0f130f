"""``OnlineClassifier``: a classification network behind MMEngine's model
interface (a data preprocessor, ``forward(inputs, data_samples, mode)``), so
the online loop sees a classifier as it sees a segmentor."""
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F
from mmengine.model import BaseDataPreprocessor, BaseModel

from mmseg_stag.core import HeadProbe
from mmseg_stag.registry import MODELS
from .models import load_weights
from .registry import CLS_MODELS


@MODELS.register_module()
class ClassifierPreprocessor(BaseDataPreprocessor):
    """uint8 images -> float ``[N, 3, H, W]``: ``x / 255``, then
    ``(x - mean) / std`` per channel if given (torchvision's ``ToTensor``,
    ``Normalize``).

    Args:
        mean, std (Sequence[float], optional): normalisation of the
            ``[0, 1]`` images; ``None``: none (the RobustBench models take
            ``[0, 1]`` inputs).
    """

    def __init__(self, mean: Optional[Sequence[float]] = None,
                 std: Optional[Sequence[float]] = None):
        super().__init__()
        self.normalise = mean is not None or std is not None
        if self.normalise:
            self.register_buffer('mean', torch.tensor(
                mean if mean is not None else (0., ) * 3).view(1, -1, 1, 1),
                False)
            self.register_buffer('std', torch.tensor(
                std if std is not None else (1., ) * 3).view(1, -1, 1, 1),
                False)

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
    """A classification network (``CLS_MODELS``: torchvision, timm, the
    RobustBench WRNs, the demo nets) with its data preprocessor.

    Args:
        network (dict): a ``CLS_MODELS`` config.
        classifier (str, optional): the network's classifier module
            (``'fc'``, ``'head'``). Default: its last ``nn.Linear``.
        data_preprocessor (dict, optional): a ``ClassifierPreprocessor``
            config. Default: no normalisation.
    """

    def __init__(self, network: dict, classifier: Optional[str] = None,
                 data_preprocessor: Optional[dict] = None,
                 init_cfg: Optional[dict] = None):
        preprocessor = dict(data_preprocessor or {})
        preprocessor.setdefault('type', 'ClassifierPreprocessor')
        # built in this scope, whatever the caller's default scope is
        super().__init__(
            data_preprocessor=MODELS.build(
                dict(preprocessor, _scope_='mmseg_stag')),
            init_cfg=init_cfg)
        self.network = CLS_MODELS.build(dict(network))
        self.classifier, _ = HeadProbe(classifier).find(self.network)

    def load_weights(self, path: str, allow_unsafe_pickle: bool = False):
        """Strictly load a weight file of the network (``.pth``/``.pt``,
        ``.safetensors``, a ViT ``.npz``)."""
        load_weights(self.network, path, allow_unsafe_pickle)

    def forward(self, inputs: torch.Tensor,
                data_samples: Optional[List] = None, mode: str = 'tensor'):
        logits = self.network(inputs)
        if mode == 'tensor':
            return logits
        if mode == 'predict':
            for sample, label in zip(data_samples, logits.argmax(1).tolist()):
                sample.set_metainfo(dict(pred_label=label))
            return data_samples
        if mode == 'loss':
            labels = torch.tensor([s.gt_label for s in data_samples],
                                  device=logits.device)
            return dict(loss=F.cross_entropy(logits, labels))
        raise ValueError(f"mode must be 'tensor', 'predict' or 'loss', got "
                         f'{mode!r}')
