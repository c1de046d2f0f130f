"""The continual ACDC stream as one MMSeg dataset."""
import os
import os.path as osp
from typing import List, Optional, Sequence

from mmseg.datasets import BaseSegDataset, CityscapesDataset
from mmseg.registry import DATASETS

from mmseg_stag.engine.stream import StreamStage, stages_from_tags

@DATASETS.register_module()
class ACDCContinualDataset(BaseSegDataset):
    """ACDC as a continual stream: the conditions in order, ``rounds`` times.

    Args:
        data_root (str): ACDC root folder.
        conditions (Sequence[str]): Conditions in stream order.
            Default: ('fog', 'night', 'rain', 'snow').
        split (str): The split read. Default: 'train'.
        rounds (int): Repetitions of the condition cycle. Default: 10.
        images_per_condition (int, optional): Keep the first N sorted
            images of each condition (a smoke test). Default: None, all.
        img_dir (str): Image folder under ``data_root``. Default: 'rgb_anon'.
        ann_dir (str): Label folder under ``data_root``. Default: 'gt'.
        img_suffix (str): Image file suffix. Default: '_rgb_anon.png'.
        seg_map_suffix (str): Label file suffix.
            Default: '_gt_labelTrainIds.png'.
        **kwargs: Other ``BaseSegDataset`` arguments.

    Raises:
        FileNotFoundError: If ``data_root``, a condition folder, its images
            or an image's label is missing.
        ValueError: If ``rounds < 1``, ``images_per_condition < 1``,
            ``conditions`` is empty or ``reduce_zero_label=True``.
    """

    METAINFO = CityscapesDataset.METAINFO

    #: checked by ``OnlineTask.check_dataset``
    task = 'segmentation'

    def __init__(self,
                 data_root: str,
                 conditions: Sequence[str] = ('fog', 'night', 'rain', 'snow'),
                 split: str = 'train',
                 rounds: int = 10,
                 images_per_condition: Optional[int] = None,
                 img_dir: str = 'rgb_anon',
                 ann_dir: str = 'gt',
                 img_suffix: str = '_rgb_anon.png',
                 seg_map_suffix: str = '_gt_labelTrainIds.png',
                 **kwargs):
        if isinstance(conditions, str):
            conditions = (conditions, )
        if not conditions:
            raise ValueError('ACDCContinualDataset: conditions is empty')
        if int(rounds) < 1:
            raise ValueError(f'ACDCContinualDataset: rounds must be >= 1, '
                             f'got {rounds}')
        if images_per_condition is not None and int(images_per_condition) < 1:
            raise ValueError(f'ACDCContinualDataset: images_per_condition '
                             f'must be >= 1 or None, got '
                             f'{images_per_condition}')
        if kwargs.pop('reduce_zero_label', False):
            raise ValueError('ACDCContinualDataset: reduce_zero_label must '
                             'be False (ACDC labels are train IDs, 255 is '
                             'ignored)')
        if not isinstance(data_root, (str, os.PathLike)) or \
                not osp.isdir(data_root):
            raise FileNotFoundError(
                f'ACDC data_root not found: {data_root} (set '
                'test_dataloader.dataset.data_root=PATH)')
        data_root = os.fspath(data_root)
        self.conditions = tuple(conditions)
        self.split = split
        self.rounds = int(rounds)
        self.images_per_condition = None if images_per_condition is None \
            else int(images_per_condition)
        self.acdc_img_dir, self.acdc_ann_dir = img_dir, ann_dir
        super().__init__(
            data_root=data_root,
            img_suffix=img_suffix,
            seg_map_suffix=seg_map_suffix,
            reduce_zero_label=False,
            **kwargs)

    def _condition_files(self, condition: str) -> List[dict]:
        """Return the image and label paths of one condition, sorted."""
        img_root = osp.join(self.data_root, self.acdc_img_dir, condition,
                            self.split)
        ann_root = osp.join(self.data_root, self.acdc_ann_dir, condition,
                            self.split)
        if not osp.isdir(img_root):
            raise FileNotFoundError(
                f'ACDC condition folder not found: {img_root}')
        rel_paths = sorted(
            osp.relpath(osp.join(dirpath, name), img_root)
            for dirpath, _, names in os.walk(img_root) for name in names
            if name.endswith(self.img_suffix))
        if not rel_paths:
            raise FileNotFoundError(
                f'no *{self.img_suffix} images under {img_root}')
        files = []
        for rel in rel_paths:
            seg = osp.join(ann_root,
                           rel[:-len(self.img_suffix)] + self.seg_map_suffix)
            if not osp.isfile(seg):
                raise FileNotFoundError(
                    f'label missing for {osp.join(img_root, rel)}: expected '
                    f'{seg}')
            files.append(dict(img_path=osp.join(img_root, rel),
                              seg_map_path=seg))
        return files

    def load_data_list(self) -> List[dict]:
        """Load the stream, ``rounds`` x ``conditions`` x sorted files.

        Returns:
            list[dict]: Data infos with the paths and the tags ``stage``,
            ``round`` and ``condition``.
        """
        per_condition = [self._condition_files(c)[:self.images_per_condition]
                         for c in self.conditions]
        data_list = []
        self._stream_stages = None
        for round_idx in range(self.rounds):
            for cond_idx, (condition, files) in enumerate(
                    zip(self.conditions, per_condition)):
                stage = round_idx * len(self.conditions) + cond_idx
                for item in files:
                    data_list.append(
                        dict(item,
                             label_map=self.label_map,
                             reduce_zero_label=False,
                             seg_fields=[],
                             stage=stage,
                             round=round_idx + 1,
                             condition=condition))
        return data_list

    @staticmethod
    def first_stage_options(dataset_cfg: dict, condition=None) -> dict:
        """Options of ``dataset_cfg`` that keep one stage: round 1 of
        ``condition`` (default: the first)."""
        conditions = list(dataset_cfg.get('conditions',
                                          ('fog', 'night', 'rain', 'snow')))
        return dict(rounds=1, conditions=[condition or conditions[0]])

    @staticmethod
    def first_images_options(num_images: int) -> dict:
        """Options that keep the first ``num_images`` images."""
        return dict(indices=num_images)

    def stream_stages(self) -> List[StreamStage]:
        """Return the stages: one per round and condition, continual."""
        if getattr(self, '_stream_stages', None) is None:
            self._stream_stages = stages_from_tags(
                [self.get_data_info(i) for i in range(len(self))])
        return self._stream_stages
