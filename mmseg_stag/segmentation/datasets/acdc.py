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
        split (str): The split read.
        rounds (int): Repetitions of the condition cycle.
        images_per_condition (int, optional): Keep the first N sorted
            images of each condition (a smoke test); None: all.
        img_dir, ann_dir, img_suffix, seg_map_suffix: The images are
            ``{img_dir}/{condition}/{split}/**/*{img_suffix}`` under
            ``data_root``; each label at the same path under ``ann_dir``,
            ending in ``seg_map_suffix``.
        **kwargs: Other ``BaseSegDataset`` arguments.

    Raises:
        FileNotFoundError: If a folder, the images or a label is missing.
        ValueError: For an option out of range, or reduce_zero_label=True.
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

    def load_data_list(self) -> List[dict]:
        """Load the stream, ``rounds`` x ``conditions`` x sorted files, each
        with the tags ``stage``, ``round`` and ``condition``."""
        per_condition = []
        for condition in self.conditions:
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
                img = osp.join(img_root, rel)
                seg = osp.join(ann_root, rel[:-len(self.img_suffix)] +
                               self.seg_map_suffix)
                if not osp.isfile(seg):
                    raise FileNotFoundError(
                        f'label missing for {img}: expected {seg}')
                files.append(dict(img_path=img, seg_map_path=seg))
            per_condition.append(files[:self.images_per_condition])
        self._stream_stages = None
        return [
            dict(item,
                 label_map=self.label_map,
                 reduce_zero_label=False,
                 seg_fields=[],
                 stage=round_idx * len(self.conditions) + cond_idx,
                 round=round_idx + 1,
                 condition=condition)
            for round_idx in range(self.rounds)
            for cond_idx, (condition, files) in enumerate(
                zip(self.conditions, per_condition))
            for item in files
        ]

    @staticmethod
    def first_stage_options(dataset_cfg: dict, condition=None) -> dict:
        """Options of ``dataset_cfg`` that keep one stage: round 1 of
        ``condition`` (default: the first)."""
        conditions = dataset_cfg.get('conditions',
                                     ('fog', 'night', 'rain', 'snow'))
        if isinstance(conditions, str):  # one condition, as __init__ reads it
            conditions = (conditions, )
        return dict(rounds=1, conditions=[condition or conditions[0]])

    @staticmethod
    def images_per_stage_options(num_images: int) -> dict:
        """Options that keep the first ``num_images`` images of each stage
        (each condition of each round), as the classification stream's."""
        return dict(images_per_condition=num_images)

    def stream_stages(self) -> List[StreamStage]:
        """Return the stages: one per round and condition, continual."""
        if getattr(self, '_stream_stages', None) is None:
            self._stream_stages = stages_from_tags(
                [self.get_data_info(i) for i in range(len(self))])
        return self._stream_stages
