# torchvision ResNet-50 (BatchNorm); the ImageNet weights are the CHECKPOINT
# of tools/test.py (torchvision's resnet50-19c8e357.pth, as SAR/DeYO use).
# Needs torchvision.
# The classifier the online loop probes is fc, the network's last
# nn.Linear (test_cfg.head_layer would name another module).
model = dict(
    type='OnlineClassifier',
    network=dict(type='TorchvisionResNet50'),
    data_preprocessor=dict(
        mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)))
