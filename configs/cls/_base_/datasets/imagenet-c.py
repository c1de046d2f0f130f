# ImageNet-C: <data_root>/<corruption>/<severity>/<wnid>/*.JPEG, 50,000
# images per corruption; classes in sorted wnid order; resize 256, center
# crop 224 (resize=None gives SAR's ImageNet-C transform); the model's data
# preprocessor normalises. The scenario files set the order and batch size.
_base_ = ['./corruption_stream.py']
test_dataloader = dict(
    dataset=dict(
        corruption_set=dict(
            type='ImageNetC',
            data_root='data/imagenet-c',
            severity=5,
            n_examples=None,
            resize=256,
            crop=224)))
