"""An independent transcription of EcoTTA's public code, for the tests.

The architecture is the authors' notebook (``Lily-Le/EcoTTA`` at
``d72f0ce``, ``ecotta_sample_code.py``): a WideResNet "simplified" into
``conv1``, a flat list of residual blocks and a classifier, ``conv_block``,
``build_meta_block``, ``one_part_of_networks`` with its ``cal_mseloss``
switch, ``attach_meta_networks`` (here the block counts are an argument).
The test-time step is the community ``main.py`` ``adapt`` (last commit):
a regularised forward, ``(btsloss * lambda).backward()`` per part, a step;
then a plain forward, ``entropy_minmization`` (``utils.py``), a step. The
warm-up's learning rate is ``WarmUpLR`` over epoch 1 then ``MultiStepLR``
(milestones 3, 6, 8; 0.2) stepped with the epoch.
"""
import bisect

import torch
import torch.nn as nn
import torch.nn.functional as F


class SimplifiedWRN(nn.Module):
    """The notebook's ``simplify_wideresnet40`` for any RobustBench-named
    WideResNet (no input normalisation, as the notebook)."""

    def __init__(self, model, input_size):
        super().__init__()
        self.conv1 = model.conv1
        self.module_list = [u for b in (model.block1, model.block2,
                                        model.block3) for u in b.layer]
        depth, height = [], []
        x = torch.zeros(1, *input_size, dtype=model.conv1.weight.dtype)
        with torch.no_grad():
            x = model.conv1(x)
            was = model.training
            model.eval()
            for unit in self.module_list:
                depth.append(x.shape[1])
                height.append(x.shape[2])
                x = unit(x)
            model.train(was)
        self.input_depth_list = depth + [x.shape[1]]
        self.input_hight_list = height + [x.shape[2]]
        self.classifier = Classifier(model.bn1, model.relu, model.fc,
                                     model.nChannels)


class Classifier(nn.Module):

    def __init__(self, bn1, relu, fc, n_channels):
        super().__init__()
        self.bn1, self.relu, self.fc = bn1, relu, fc
        self.nChannels = n_channels

    def forward(self, x):
        out = self.relu(self.bn1(x))
        out = F.avg_pool2d(out, out.shape[-1])
        return self.fc(out.view(-1, self.nChannels))


class ConvBlock(nn.Module):

    def __init__(self, in_plane, out_plane, stride):
        super().__init__()
        self.conv = nn.Conv2d(in_plane, out_plane, kernel_size=3,
                              stride=stride, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(out_plane)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class MetaBlock(nn.Module):

    def __init__(self, depths, heights):
        super().__init__()
        self.meta_bn = nn.BatchNorm2d(depths[1])
        self.conv_block = ConvBlock(depths[0], depths[1],
                                    heights[0] // heights[1])

    def forward(self, x):
        return self.conv_block(x)


class OnePart(nn.Module):

    def __init__(self, original_part, meta_part):
        super().__init__()
        self.original_part = original_part
        self.meta_part = meta_part
        self.btsloss = None
        self.cal_mseloss = False

    def forward(self, x):
        if self.cal_mseloss:
            x = x.detach()
        out1 = self.original_part(x)
        out2 = self.meta_part.meta_bn(out1)
        out3 = self.meta_part(x)
        out = out2 + out3
        if self.cal_mseloss:
            self.btsloss = nn.L1Loss(reduction='none')(out,
                                                       out1.detach()).mean()
        return out


class EcoTTANetworks(nn.Module):
    """``attach_meta_networks`` with explicit ``num_blocks``."""

    def __init__(self, simplified, num_blocks):
        super().__init__()
        self.conv1 = simplified.conv1
        encoders, self.meta_parts, start = [], [], 0
        for n in num_blocks:
            depths = (simplified.input_depth_list[start],
                      simplified.input_depth_list[start + n])
            heights = (simplified.input_hight_list[start],
                       simplified.input_hight_list[start + n])
            meta = MetaBlock(depths, heights)
            encoders.append(OnePart(
                nn.Sequential(*simplified.module_list[start:start + n]),
                meta))
            self.meta_parts.append(meta)
            start += n
        self.encoders = nn.Sequential(*encoders)
        self.classifier = simplified.classifier

    def forward(self, x):
        return self.classifier(self.encoders(self.conv1(x)))


def set_cal_mseloss(net, value):
    for encoder in net.encoders:
        encoder.cal_mseloss = value


def softmax_entropy(x):
    return -(x.softmax(1) * x.log_softmax(1)).sum(1)


def entropy_minmization(outputs, e_margin):
    entropys = softmax_entropy(outputs)
    entropys = entropys[torch.where(entropys < e_margin)]
    return entropys.mean(0)


def build_reference(source_wrn, num_blocks, input_size):
    """The notebook's network on ``source_wrn`` (used in place), its
    original parameters frozen, its meta networks trainable."""
    net = EcoTTANetworks(SimplifiedWRN(source_wrn, input_size), num_blocks)
    for p in net.parameters():
        p.requires_grad = False
    for meta in net.meta_parts:
        for p in meta.parameters():
            p.requires_grad = True
    return net


def reference_adapt(net, optimizer, x, lambda_reg, e_margin, extra=None):
    """One batch of the community ``adapt``; ``extra(outputs)`` (optional)
    is added to the entropy loss (the STAG term in the tests). Returns the
    outputs it scores."""
    optimizer.zero_grad()
    set_cal_mseloss(net, True)
    net(x)
    for encoder in net.encoders:
        (encoder.btsloss * lambda_reg).backward()
    optimizer.step()
    optimizer.zero_grad()
    set_cal_mseloss(net, False)
    outputs = net(x)
    loss = entropy_minmization(outputs, e_margin=e_margin)
    if extra is not None:
        loss = loss + extra(outputs)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return outputs


def reference_warmup_lr(base_lr, epoch, batch_index, iters_per_epoch,
                        milestones=(3, 6, 8), gamma=0.2, warm=1):
    """The learning rate of batch ``batch_index`` (0-based) of ``epoch``
    (1-based): ``WarmUpLR`` (stepped after every batch of the first
    ``warm`` epochs, from 0) then ``MultiStepLR.step(epoch)``."""
    if epoch <= warm:
        done = (epoch - 1) * iters_per_epoch + batch_index
        return base_lr * done / (iters_per_epoch * warm + 1e-8)
    return base_lr * gamma**bisect.bisect_right(list(milestones), epoch)
