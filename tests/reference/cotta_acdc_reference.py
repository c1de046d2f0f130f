"""CoTTA's ACDC code, transcribed onto MMSeg 1.x calls.

The code is an MMSeg 0.x fork that qinenergy/cotta only links to; public
copies keep it file for file: Anonymous-012/SVDP, ml4papers/GaPaTTA
(``mmseg/apis/test.py``: ``single_gpu_tent``, ``single_gpu_cotta``;
``tools/tent.py``, ``tools/cotta.py``: the loop over 10 rounds x
conditions, one call per stage; ``mmseg/models/segmentors/
encoder_decoder.py``: ``inference``, ``aug_test``).
Where MMSeg 0.x and 1.x name a step differently, the comment says which 0.x
call the line stands for.
"""
import re

import torch
import torch.nn.functional as F
from mmengine.structures import PixelData
from mmseg.evaluation.metrics import IoUMetric
from mmseg.structures import SegDataSample

#: single_gpu_tent adapts ``"norm" in name or "bn" in name`` under NVlabs'
#: names, i.e. every LayerNorm and the head's BN. MMSeg 1.x names MiT's
#: stage-final LayerNorms ``backbone.layers.{i}.2`` (NVlabs: ``norm{i+1}``).
TENT_PARAM = re.compile(r'norm|bn|^backbone\.layers\.\d+\.2\.')


def tent_params(model):
    """``single_gpu_tent``'s selection, in ``named_parameters`` order."""
    return [p for name, p in model.named_parameters()
            if TENT_PARAM.search(name)]


def single_gpu_tent(model, batches):
    """One call of ``single_gpu_tent``: one stage of the stream.

    Returns each batch's post-processed prediction (``SegDataSample``s).
    """
    model.eval()
    params = tent_params(model)
    for p in model.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    # a new optimizer at every call, i.e. every stage
    optimizer = torch.optim.Adam(params, lr=0.00006 / 8, betas=(0.9, 0.999))
    results = []
    for data in batches:
        with torch.no_grad():
            # result = model(return_loss=False, **data): simple_test, the
            # argmax of the logits rescaled to the original image size
            result = model.test_step(data)
        # loss = model.forward(return_loss=True, img=..., gt_semantic_seg=
        # result): a second forward; decode_head.losses resizes the head's
        # logits to the label's (original) size, cross-entropy over pixels
        inputs = model.data_preprocessor(data, False)['inputs']
        samples = [SegDataSample(metainfo=r.metainfo,
                                 gt_sem_seg=PixelData(data=r.pred_sem_seg.data))
                   for r in result]
        loss = model.loss(inputs, samples)
        torch.mean(loss['decode.loss_ce']).backward()
        optimizer.step()
        optimizer.zero_grad()
        results.extend(result)
    return results


def stage_miou(results, num_classes=19, ignore_index=255):
    """A stage's mIoU (%) from summed intersections and unions (MMSeg's
    ``IoUMetric``, as ``dataset.evaluate`` after each stage)."""
    return label_miou([r.pred_sem_seg.data for r in results],
                      [r.gt_sem_seg.data for r in results], num_classes,
                      ignore_index)


def inference(model, view):
    """0.x ``EncoderDecoder.inference`` with ``rescale=True``: the logits
    resized to the original image size, softmax, then the flip undone."""
    data = model.data_preprocessor(view, False)
    metas = [s.metainfo for s in data['data_samples']]
    seg_logit = model.inference(data['inputs'], metas)
    seg_logit = F.interpolate(seg_logit, size=metas[0]['ori_shape'][:2],
                              mode='bilinear', align_corners=False)
    output = F.softmax(seg_logit, dim=1)
    if metas[0].get('flip'):
        assert metas[0]['flip_direction'] == 'horizontal'
        output = output.flip(dims=(3, ))
    return output


def aug_test(model, views):
    """0.x ``aug_test`` as CoTTA's fork returns it: ``(argmax of the mean
    of the views' probabilities, per-view max probability, per-view
    argmax)``."""
    seg_logit = inference(model, views[0])
    prob, pred = seg_logit.max(dim=1)
    probs, preds = [prob], [pred]
    for view in views[1:]:
        cur_seg_logit = inference(model, view)
        seg_logit += cur_seg_logit
        prob, pred = cur_seg_logit.max(dim=1)
        probs.append(prob)
        preds.append(pred)
    seg_logit /= len(views)
    return seg_logit.argmax(dim=1), probs, preds


def update_ema_variables(ema_model, model, alpha_teacher):
    for ema_param, param in zip(ema_model.parameters(), model.parameters()):
        ema_param.data[:] = alpha_teacher * ema_param[:].data[:] + \
            (1 - alpha_teacher) * param[:].data[:]
    return ema_model


def single_gpu_cotta(model, batches, anchor, ema_model, anchor_model,
                     img_id=4, alpha_teacher=0.999):
    """One call of ``single_gpu_cotta`` (one stage). ``batches``: per
    image, the list of its views' data batches (``img_id``: scale 1.0, no
    flip). ``anchor``: the source ``state_dict``. Returns the evaluated
    label maps (original size)."""
    model.eval()
    anchor_model.eval()
    param_list = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(param_list, lr=0.00006 / 8,
                                 betas=(0.9, 0.999))
    results = []
    for views in batches:
        model.eval()
        ema_model.eval()
        anchor_model.eval()
        with torch.no_grad():
            result, probs, preds = aug_test(ema_model, views)
            _, probs_, _ = aug_test(anchor_model, views)
            mask = (probs_[img_id] > 0.69).long()
            result = mask * preds[img_id] + (1 - mask) * result
        # model.forward(return_loss=True, img=data['img'][img_id], ...)
        inputs = model.data_preprocessor(views[img_id], False)['inputs']
        samples = [SegDataSample(metainfo=s.metainfo,
                                 gt_sem_seg=PixelData(data=label[None]))
                   for s, label in zip(views[img_id]['data_samples'], result)]
        loss = model.loss(inputs, samples)
        torch.mean(loss['decode.loss_ce']).backward()
        optimizer.step()
        optimizer.zero_grad()
        ema_model = update_ema_variables(ema_model, model, alpha_teacher)
        for nm, m in model.named_modules():
            for npp, p in m.named_parameters():
                if npp in ['weight', 'bias'] and p.requires_grad:
                    mask = (torch.rand(p.shape) < 0.01).float()
                    with torch.no_grad():
                        p.data = anchor[f'{nm}.{npp}'] * mask + p * (1. - mask)
        results.append(result)
    return results


def label_miou(labels, gts, num_classes=19, ignore_index=255):
    """A stage's mIoU (%) from label maps and ground truths."""
    inter = union = 0
    for label, gt in zip(labels, gts):
        areas = IoUMetric.intersect_and_union(
            label.squeeze(0), gt.squeeze(0).to(label), num_classes,
            ignore_index)
        inter, union = inter + areas[0], union + areas[1]
    iou = inter.double() / union.double()
    return float(iou[~iou.isnan()].mean() * 100)
