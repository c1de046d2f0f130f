# The demo's ViT with LayerNorm (stands in for ViT-B/16); inputs [0, 1].
model = dict(
    type='OnlineClassifier',
    network=dict(type='SmallViT', dim=48, depth=3, heads=3, patch_size=4),
    classifier='head')
