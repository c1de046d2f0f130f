# ImageNet-C: <data_root>/<corruption>/<severity>/<wnid>/*.JPEG, 50,000
# images per corruption; classes in sorted wnid order. Resize 256, center
# crop 224, ImageNet mean/std (resize=None gives SAR's ImageNet-C transform).
_base_ = ['./corruptions.py']
data = dict(
    type='ImageNetC',
    data_root='data/imagenet-c',
    severity=5,
    corruptions={{_base_.corruptions}},
    n_examples=None,
    resize=256,
    crop=224,
    mean=(0.485, 0.456, 0.406),
    std=(0.229, 0.224, 0.225))
