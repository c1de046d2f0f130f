# torchvision ResNet-50 (BatchNorm), ImageNet weights from a local file
# (torchvision's resnet50-19c8e357.pth, as SAR/DeYO use). Needs torchvision.
model = dict(
    type='TorchvisionResNet50',
    checkpoint='checkpoints/resnet50-19c8e357.pth',
    classifier='fc')
