# EATA (Niu et al., 2022): reliable (entropy < 0.4 ln C) and non-redundant
# samples, weighted entropy, Fisher regulariser (method defaults).
# The Fisher information comes from clean source images before the stream:
# 2,000 images of the ImageNet validation set (EATA's fisher_size), in
# <data_root>/<wnid>/*.JPEG, preprocessed like the test images, shuffled.
# `--cfg-options test_cfg.method.fisher_alpha=0 test_cfg.source_dataloader=None`
# runs ETA (no Fisher, no clean data: a source_dataloader is then refused).
test_cfg = dict(
    type='OnlineAdaptationLoop',
    method=dict(type='eata',
                # test-batch BN statistics (the authors' code)
                bn_batch_stats=True),
    source_dataloader=dict(
        batch_size=64,
        num_workers=2,
        sampler=dict(type='SeededShuffleSampler'),
        collate_fn=dict(type='pseudo_collate'),
        dataset=dict(
            type='SourceImages',
            images=dict(
                type='ImageFolder',
                data_root='data/imagenet/val',
                n_examples=2000,
                resize=256,
                crop=224))))
