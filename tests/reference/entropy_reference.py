"""The authors' ``softmax_entropy``: the same function in EATA
(github.com/mr-eggplant/EATA, ``eata.py``), SAR
(github.com/mr-eggplant/SAR, ``sar.py``) and DeYO (github.com/Jhyun17/DeYO,
``methods/deyo.py``), all ``@torch.jit.script``-ed there."""


def softmax_entropy(x):
    """Entropy of softmax distribution from logits."""
    return -(x.softmax(1) * x.log_softmax(1)).sum(1)
