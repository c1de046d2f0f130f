# timm resnet50_gn (GroupNorm), ImageNet weights from a local file
# (timm's resnet50_gn_a1h2-8fe6c4d0.pth, as SAR/DeYO use). Needs timm.
model = dict(
    type='TimmModel',
    model_name='resnet50_gn',
    checkpoint='checkpoints/resnet50_gn_a1h2-8fe6c4d0.pth',
    classifier='fc')
