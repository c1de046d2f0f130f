# EATA (Niu et al., 2022): reliable (entropy < 0.4 ln C) and non-redundant
# samples, weighted entropy, Fisher regulariser (method defaults).
method = dict(type='eata')
# The Fisher information comes from clean source images before the stream:
# 2,000 images of the ImageNet validation set (EATA's fisher_size), in
# <data_root>/<wnid>/*.JPEG, preprocessed like the test images.
# `--cfg-options method.fisher_alpha=0` runs ETA (no Fisher, no clean data).
source_data = dict(
    type='ImageFolder',
    data_root='data/imagenet/val',
    n_examples=2000,
    batch_size=64,
    resize=256,
    crop=224,
    mean=(0.485, 0.456, 0.406),
    std=(0.229, 0.224, 0.225))
