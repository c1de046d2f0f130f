# timm vit_base_patch16_224 (LayerNorm); CHECKPOINT: a timm state dict
# (.pth/.safetensors) or the original .npz. Needs timm.
# The classifier the online loop probes is head, the network's last
# nn.Linear (test_cfg.head_layer would name another module).
model = dict(
    type='OnlineClassifier',
    network=dict(type='TimmModel', model_name='vit_base_patch16_224'),
    # ImageNet mean/std, as SAR's and DeYO's data code normalises every
    # model (dataset/selectedRotateImageFolder.py), though timm trained this
    # ViT with 0.5/0.5: set mean=std=(0.5, 0.5, 0.5) for timm's own
    data_preprocessor=dict(
        mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)))
