# The demo's ViT with LayerNorm (stands in for ViT-B/16); inputs [0, 1].
# The classifier the online loop probes is head, the network's last
# nn.Linear (test_cfg.head_layer would name another module).
model = dict(
    type='OnlineClassifier',
    network=dict(type='SmallViT', dim=48, depth=3, heads=3, patch_size=4))
