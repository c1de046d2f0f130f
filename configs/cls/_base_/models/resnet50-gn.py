# timm resnet50_gn (GroupNorm); CHECKPOINT: timm's
# resnet50_gn_a1h2-8fe6c4d0.pth (as SAR/DeYO use). Needs timm.
model = dict(
    type='OnlineClassifier',
    network=dict(type='TimmModel', model_name='resnet50_gn'),
    classifier='fc',
    data_preprocessor=dict(
        mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)))
