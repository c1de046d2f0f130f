# timm vit_base_patch16_224 (LayerNorm), ImageNet weights from a local file:
# a timm state dict (.pth/.safetensors) or the original .npz. Needs timm.
model = dict(
    type='TimmModel',
    model_name='vit_base_patch16_224',
    checkpoint='checkpoints/vit_base_patch16_224.pth',
    classifier='head')
