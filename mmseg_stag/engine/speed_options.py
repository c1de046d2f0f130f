"""The loop's speed options (``test_cfg``: ``mixed_precision``, ``tf32``,
``cuda_graph``, ``graph_warmup``, ``preset``), checked together before the
stream: each one acts where it is accepted, or is refused with a sentence."""
from dataclasses import dataclass
from typing import Optional

import torch

#: ``mixed_precision`` values: the autocast dtype of the forward passes
MIXED_PRECISION = {'bf16': torch.bfloat16, 'fp16': torch.float16}
#: named presets (``preset``): the speed options a config sets beside its
#: faithful parent, all for a CUDA GPU; the file name says what they are
#: (``…_bf16.py``, ``…_bf16-graph.py``: docs/running.md, "The fast preset")
PRESETS = ('fast', )
#: eager steps per input shape before a capture, where not set
GRAPH_WARMUP = 2


@dataclass(frozen=True)
class SpeedOptions:
    """The checked speed options of one run (:func:`speed_options`)."""
    mixed_precision: Optional[str] = None
    tf32: Optional[bool] = None
    cuda_graph: bool = False
    graph_warmup: int = GRAPH_WARMUP
    preset: Optional[str] = None

    def check_method(self, method) -> None:
        """What the method built must allow (``ValueError`` otherwise)."""
        if self.mixed_precision == 'fp16' and method.has_loss and \
                not method.supports_grad_scaler:
            raise ValueError(
                f"mixed_precision='fp16': {method.name} cannot scale "
                'its gradients (fp16 gradients underflow without a '
                "GradScaler); use mixed_precision='bf16' or None")

    def describe(self) -> str:
        """The run's speed settings, for its first log line."""
        parts = [f'preset {self.preset}'] if self.preset else []
        if self.mixed_precision:
            parts.append(f'{self.mixed_precision} autocast')
        if self.cuda_graph:
            parts.append('steps replayed as CUDA graphs')
        return '; ' + ', '.join(parts) if parts else ''


def speed_options(device_type: str, mixed_precision: Optional[str] = None,
                  tf32: Optional[bool] = None, cuda_graph: bool = False,
                  graph_warmup: Optional[int] = None,
                  preset: Optional[str] = None,
                  fp16: bool = False) -> SpeedOptions:
    """The loop's speed options for a model on ``device_type``, checked.

    Raises:
        ValueError: In one sentence naming the option: an unknown
            precision or preset; MMEngine's ``fp16`` flag (float16 has one
            name here, ``mixed_precision='fp16'``); ``graph_warmup``
            without ``cuda_graph``; a preset, a graph or fp16 off CUDA; a
            graph with fp16 (no ``GradScaler`` replays).
    """
    if mixed_precision not in (None, *MIXED_PRECISION):
        raise ValueError(f'mixed_precision must be one of '
                         f'{sorted(MIXED_PRECISION)} or None, got '
                         f'{mixed_precision!r}')
    if fp16:
        # one name for one setting: MMEngine's flag would be a second
        raise ValueError("test_cfg.fp16=True: write mixed_precision='fp16' "
                         '(float16 autocast has that one name here)')
    if preset is not None and preset not in PRESETS:
        raise ValueError(f'test_cfg.preset must be one of {PRESETS} or '
                         f'None, got {preset!r}')
    if preset is not None and device_type != 'cuda':
        raise ValueError(
            f"test_cfg.preset='{preset}' is for a CUDA GPU, and this "
            f'model is on {device_type} (torch.cuda.is_available()'
            f' is {torch.cuda.is_available()}): run the faithful config,'
            ' the same name without the _bf16 or _bf16-graph suffix')
    if graph_warmup is not None and not cuda_graph:
        raise ValueError(f'test_cfg.graph_warmup={graph_warmup} does '
                         'nothing without test_cfg.cuda_graph=True: '
                         'remove it, or set cuda_graph=True')
    if cuda_graph and device_type != 'cuda':
        raise ValueError('test_cfg.cuda_graph=True needs the model on a '
                         f'CUDA device, it is on {device_type}')
    if cuda_graph and mixed_precision == 'fp16':
        raise ValueError("test_cfg.cuda_graph=True replays no GradScaler:"
                         " use mixed_precision='bf16' or None, not fp16")
    if mixed_precision == 'fp16' and device_type == 'cpu':
        raise ValueError("mixed_precision='fp16' needs a GPU (float16 "
                         "autocast is for CUDA); use "
                         "mixed_precision='bf16'")
    return SpeedOptions(
        mixed_precision, None if tf32 is None else bool(tf32),
        bool(cuda_graph),
        GRAPH_WARMUP if graph_warmup is None else int(graph_warmup), preset)
