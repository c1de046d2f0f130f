# timm resnet50_gn (GroupNorm); CHECKPOINT: timm's
# resnet50_gn_a1h2-8fe6c4d0.pth (as SAR/DeYO use). Needs timm.
# The classifier the online loop probes is fc, the network's last
# nn.Linear (test_cfg.head_layer would name another module).
model = dict(
    type='OnlineClassifier',
    network=dict(type='TimmModel', model_name='resnet50_gn'),
    data_preprocessor=dict(
        mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)))
