"""A batch goes to the model's device without waiting for it: every tensor
and data sample of a loader's batch is copied ``non_blocking`` before
MMSeg's data preprocessor (whose own copy is blocking: a wait for every
queued kernel at each batch) sees it; the preprocessor then finds them
there. On the CPU the copy is a no-op, so the calls are what is held."""
import torch
from mmengine.structures import PixelData
from mmseg.structures import SegDataSample

from mmseg_stag.engine import online_task
from mmseg_stag.engine.online_task import preprocess, to_device


def loader_batch():
    sample = SegDataSample(metainfo=dict(img_path='a.png'))
    sample.gt_sem_seg = PixelData(data=torch.zeros(1, 4, 6, dtype=torch.uint8))
    return dict(inputs=[torch.zeros(3, 4, 6, dtype=torch.uint8)],
                data_samples=[sample], tag='fog')


def test_every_tensor_and_sample_is_copied_without_waiting(monkeypatch):
    calls = []
    to = torch.Tensor.to

    def spy(self, *args, **kwargs):
        calls.append((args, kwargs))
        return to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, 'to', spy)
    batch = loader_batch()
    moved = to_device(batch, torch.device('cpu'))
    assert moved['tag'] == 'fog' and isinstance(moved['inputs'], list)
    # the image and the label (through the data sample)
    assert len(calls) == 2
    for args, kwargs in calls:
        assert args == (torch.device('cpu'), ) and kwargs == dict(
            non_blocking=True)
    assert isinstance(moved['data_samples'][0], SegDataSample)
    assert moved['data_samples'][0].img_path == 'a.png'


def test_the_preprocessor_gets_the_batch_on_the_device(monkeypatch):
    order = []
    real = online_task.to_device
    monkeypatch.setattr(online_task, 'to_device', lambda data, device: (
        order.append(('to_device', device)), real(data, device))[1])

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))

        def data_preprocessor(self, data, training):
            order.append(('preprocessor', training,
                          torch.is_grad_enabled()))
            return data

    out = preprocess(Model(), loader_batch())
    # to_device walks the batch (calling itself), all before the
    # preprocessor, which runs once, without gradients
    assert order[-1] == ('preprocessor', False, False)
    assert set(order[:-1]) == {('to_device', torch.device('cpu'))}
    assert out['tag'] == 'fog'
