"""A user's own frames as an MMSeg stream, without labels: what
``tools/adapt.py`` and :class:`~mmseg_stag.apis.OnlineInferencer` adapt on,
through the config's own test pipeline with its label loading taken out."""
import copy
from typing import List, Optional, Sequence

from mmengine.dataset import BaseDataset
from mmseg.registry import DATASETS

#: the transforms that load or pack ground truth: dropped from an
#: unlabeled pipeline (``ScaleFlipViews`` loses its ``load_label``)
LABEL_TRANSFORMS = ('LoadAnnotations', 'LoadBiomedicalAnnotation',
                    'LoadDepthAnnotation')


def unlabeled_pipeline(pipeline: Sequence[dict],
                       from_array: bool = False) -> List[dict]:
    """The config's test ``pipeline`` without its label loading, the same
    transforms otherwise (a prediction cannot depend on labels);
    ``from_array``: frames come decoded (``np.ndarray`` BGR, as OpenCV
    and MMCV read them), so ``LoadImageFromNDArray`` replaces the file
    loader.

    Raises:
        ValueError: If the pipeline does not start with
            ``LoadImageFromFile``.
    """
    steps = [copy.deepcopy(dict(t)) for t in pipeline]
    if not steps or steps[0].get('type') != 'LoadImageFromFile':
        raise ValueError('an unlabeled stream needs a test pipeline that '
                         'starts with LoadImageFromFile, got '
                         f'{steps[0].get("type") if steps else "none"}')
    if from_array:
        steps[0] = dict(type='LoadImageFromNDArray')
    out = []
    for step in steps:
        if step.get('type') in LABEL_TRANSFORMS:
            continue
        if 'load_label' in step:  # ScaleFlipViews
            step['load_label'] = False
        out.append(step)
    return out


def frame_info(index: int, path: Optional[str] = None, image=None) -> dict:
    """What a dataset gives the pipeline for one frame (a file, or a
    decoded image for ``LoadImageFromNDArray``): MMSeg's keys, no label."""
    info = dict(img_path=path, seg_fields=[], reduce_zero_label=False,
                sample_idx=index, frame=index)
    if image is not None:
        info['img'] = image
    return info


@DATASETS.register_module()
class FrameStream(BaseDataset):
    """Image files in the given order, one continual stage, no labels.

    Args:
        frames (Sequence[str]): The image files, in stream order.
        pipeline (list): The transforms (:func:`unlabeled_pipeline`).
        metainfo (dict, optional): Classes and palette (the config's
            dataset's, e.g. Cityscapes').
    """

    #: checked by ``OnlineTask.check_dataset``
    task = 'segmentation'

    def __init__(self, frames: Sequence[str] = (), pipeline=(),
                 metainfo: Optional[dict] = None):
        self.frames = list(frames)
        super().__init__(metainfo=metainfo, pipeline=list(pipeline),
                         serialize_data=False, test_mode=True)

    def load_data_list(self) -> List[dict]:
        return [frame_info(i, path) for i, path in enumerate(self.frames)]
