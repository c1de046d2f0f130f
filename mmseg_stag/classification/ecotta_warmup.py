"""EcoTTA's warm-up of the meta networks on the source training set
(``warmup_train`` of ``main.py`` in ``Lily-Le/EcoTTA``)."""
import bisect
import copy
import hashlib
import os.path as osp
import pickle
from typing import Dict, Optional, Tuple, Union

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.utils import ProgressBar, check_file_exist

from mmseg_stag.core.methods import cotta_transforms as T
from mmseg_stag.engine.report import write_torch

#: learning-rate milestones (epochs) and decay of the warm-up
MILESTONES, DECAY = (3, 6, 8), 0.2
WARMUP_STATE_FILE = 'ecotta_warmup_state.pth'


def warmup_device(device: Union[str, torch.device, None] = None
                  ) -> torch.device:
    """Return the warm-up's device: ``device``, or by default the one
    MMEngine's runner puts the model on for ``tools/test.py`` (CUDA where
    torch sees a GPU, else the CPU: ``mmengine.device.get_device``).

    Raises:
        ValueError: If ``device`` is not a device torch knows, or not one
            this machine has (a CUDA device without CUDA, an index past
            the last GPU): before any work.
    """
    if device is None:
        from mmengine.device import get_device
        device = get_device()
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f'EcoTTA warm-up: device={device!r} is not a '
                         f'device ({err})') from None
    if device.type == 'cuda':
        if not torch.cuda.is_available():
            raise ValueError(
                f"EcoTTA warm-up: device='{device}', but torch sees no CUDA "
                f'device (torch {torch.__version__}, CUDA build: '
                f'{torch.version.cuda}); use --device cpu')
        if device.index is not None and \
                device.index >= torch.cuda.device_count():
            raise ValueError(
                f"EcoTTA warm-up: device='{device}', but torch sees "
                f'{torch.cuda.device_count()} CUDA device(s)')
    elif device.type != 'cpu':
        try:  # another accelerator: usable if a tensor goes there
            torch.empty(0, device=device)
        except (RuntimeError, AssertionError) as err:
            first = str(err).strip().splitlines()[0] if str(err) else ''
            raise ValueError(f"EcoTTA warm-up: device='{device}' is not "
                             f'usable here: {first}') from None
    return device


def warmup_lr(base_lr: float, epoch: int, batch_index: int,
              iters_per_epoch: int) -> float:
    """Return the learning rate of a batch of ``epoch`` (1-based)."""
    if epoch == 1:
        return base_lr * batch_index / (iters_per_epoch + 1e-8)
    return base_lr * DECAY**bisect.bisect_right(MILESTONES, epoch)


def color_jitter(img: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Apply torchvision's ``ColorJitter(0.4, 0.4, 0.4, 0.1)`` to one image."""
    order = torch.randperm(4, generator=g).tolist()
    factors = [float(torch.empty(1).uniform_(0.6, 1.4, generator=g))
               for _ in range(3)]
    factors.append(float(torch.empty(1).uniform_(-0.1, 0.1, generator=g)))
    ops = (T.adjust_brightness, T.adjust_contrast, T.adjust_saturation,
           T.adjust_hue)
    for i in order:
        img = ops[i](img, factors[i])
    return img


def augment(batch: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Augment ``[N, 3, H, W]`` images in ``[0, 1]`` as the warm-up does."""
    out = []
    for img in batch:
        if float(torch.rand(1, generator=g)) < 0.4:
            img = color_jitter(img, g)
        if float(torch.rand(1, generator=g)) < 0.2:
            sigma = float(torch.empty(1).uniform_(0.1, 2.0, generator=g))
            img = T.gaussian_blur(img[None], 3, sigma)[0]
        if float(torch.rand(1, generator=g)) < 0.1:
            img = T.rgb_to_grayscale(img).expand(3, -1, -1)
        out.append(img)
    return torch.stack(out)


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickler of CIFAR batches that refuses anything but numpy arrays."""

    ALLOWED = {('numpy.core.multiarray', '_reconstruct'),
               ('numpy._core.multiarray', '_reconstruct'),
               ('numpy', 'ndarray'), ('numpy', 'dtype')}

    def find_class(self, module, name):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f'{module}.{name} is not allowed in a '
                                     'CIFAR batch file')


def _read_cifar_batch(path: str, label_key: bytes):
    with open(path, 'rb') as f:
        batch = _ArrayUnpickler(f, encoding='bytes').load()
    images = np.asarray(batch[b'data'], np.uint8).reshape(-1, 3, 32, 32)
    return images.transpose(0, 2, 3, 1), np.asarray(batch[label_key])


def read_training_set(path: str, labels: Optional[str] = None
                      ) -> Tuple[np.ndarray, np.ndarray]:
    """Return the uint8 ``[N, H, W, 3]`` images and the labels of a CIFAR
    python folder (or its parent), or of an images ``.npy`` and ``labels``."""
    if path.endswith('.npy'):
        if labels is None:
            raise ValueError(f'{path}: images as .npy need --train-labels')
        for p in (path, labels):
            check_file_exist(p, 'training-set file not found: {}')
        return np.load(path), np.load(labels)
    for folder in (path, osp.join(path, 'cifar-10-batches-py'),
                   osp.join(path, 'cifar-100-python')):
        c10 = [osp.join(folder, f'data_batch_{i}') for i in range(1, 6)]
        if all(osp.isfile(p) for p in c10):
            parts = [_read_cifar_batch(p, b'labels') for p in c10]
            return (np.concatenate([p[0] for p in parts]),
                    np.concatenate([p[1] for p in parts]))
        if osp.isfile(osp.join(folder, 'train')) and osp.isfile(
                osp.join(folder, 'meta')):
            return _read_cifar_batch(osp.join(folder, 'train'),
                                     b'fine_labels')
    raise FileNotFoundError(
        f'no training set at {path}: expected cifar-10-batches-py/'
        'data_batch_1..5, cifar-100-python/train, or an .npy of images '
        '(with --train-labels)')


def resume_warm_up(state_path: str, settings: dict, network: nn.Module,
                   optimizer) -> Tuple[Dict[str, list], int]:
    """The history and the next epoch of a warm-up saved in
    ``state_path`` (its network and optimizer loaded), or a fresh start
    where there is none; ``ValueError`` for another warm-up's state."""
    if not osp.isfile(state_path):
        return dict(loss=[], acc=[]), 1
    state = torch.load(state_path, map_location='cpu', weights_only=True)
    if state['settings'] != settings:
        diff = sorted(k for k in set(state['settings']) | set(settings)
                      if state['settings'].get(k) != settings.get(k))
        raise ValueError(f'{state_path} was written by another warm-up '
                         f'(differs in {diff}); use another work dir')
    network.load_state_dict(state['network'])
    optimizer.load_state_dict(state['optimizer'])
    return state['history'], state['epoch'] + 1


def warm_up(model: nn.Module, x_all: torch.Tensor, y_all: torch.Tensor,
            work_dir: str, epochs: int, lr: float, batch_size: int,
            seed: int, resume: bool, settings: dict) -> Dict[str, list]:
    """Train the meta networks of ``model`` (an ``OnlineClassifier`` over an
    ``EcoTTANetwork``) on the device of its parameters, saving the state in
    ``work_dir`` every epoch; the ``settings`` must match to resume. The
    data ``x_all``, ``y_all`` stay where they are (the CPU), a batch at a
    time goes to the device. Return loss and accuracy per epoch."""
    network = model.network
    device = next(network.parameters()).device
    for name, p in network.named_parameters():
        p.requires_grad_(name.startswith('ecotta.'))
    params = [p for p in network.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=lr, momentum=0.9)
    state_path = osp.join(work_dir, WARMUP_STATE_FILE)
    settings = dict(settings, lr=lr, batch_size=batch_size, seed=seed)
    history, start = resume_warm_up(state_path, settings, network,
                                    optimizer) if resume else (
        dict(loss=[], acc=[]), 1)
    preprocessor = model.data_preprocessor
    iters = (len(x_all) + batch_size - 1) // batch_size
    network.train()
    for epoch in range(start, epochs + 1):
        g = torch.Generator().manual_seed(seed * 1000 + epoch)
        order = torch.randperm(len(x_all), generator=g)
        bar = ProgressBar(iters)  # elapsed and ETA per epoch
        # summed on the device in float64 (as Python floats were), read
        # once an epoch: no wait for the device after every batch
        total = torch.zeros((), dtype=torch.float64, device=device)
        correct = torch.zeros((), dtype=torch.long, device=device)
        for b in range(iters):
            idx = order[b * batch_size:(b + 1) * batch_size]
            # the draws come from the CPU generator g, whatever the device
            x = augment(x_all[idx].to(device).float() / 255.0, g)
            labels = y_all[idx].to(device)
            if preprocessor.normalise:
                x = (x - preprocessor.mean) / preprocessor.std
            for group in optimizer.param_groups:
                group['lr'] = warmup_lr(lr, epoch, b, iters)
            logits = network(x)
            loss = F.cross_entropy(logits, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.detach().double() * len(idx)
            correct += (logits.argmax(1) == labels).sum()
            bar.update()
        history['loss'].append(float(total) / len(x_all))
        history['acc'].append(float(correct) / len(x_all))
        write_torch(state_path, dict(
            network=network.state_dict(), optimizer=optimizer.state_dict(),
            epoch=epoch, history=history, settings=settings))
    return history


@torch.no_grad()
def source_loss(model: nn.Module, x_all: torch.Tensor, y_all: torch.Tensor,
                batch_size: int = 256, seed: int = 0) -> float:
    """Return the mean cross-entropy on shuffled, un-augmented batches, on
    the device of the model (its preprocessor moves the images there)."""
    network = copy.deepcopy(model.network)
    device = next(network.parameters()).device
    order = torch.randperm(len(x_all),
                           generator=torch.Generator().manual_seed(seed))
    total = torch.zeros((), dtype=torch.float64, device=device)
    for i in range(0, len(x_all), batch_size):
        idx = order[i:i + batch_size]
        x = model.data_preprocessor(dict(inputs=x_all[idx]))
        logits = network(x['inputs'])
        total += F.cross_entropy(logits, y_all[idx].to(device),
                                 reduction='sum').double()
    return float(total) / len(x_all)


def ecotta_model(config: str, checkpoint: str, cfg_options: dict,
                 trust_pickle: bool = False) -> nn.Module:
    """The EcoTTA classifier of ``config``, its frozen part loaded from
    ``checkpoint`` (its meta networks at their initialisation).

    Raises:
        ValueError: If the config is not an EcoTTA classifier's.
    """
    from mmengine.config import Config

    import mmseg_stag  # noqa: F401  (registers the classification parts)
    from mmseg_stag.registry import MODELS
    cfg = Config.fromfile(config)
    cfg.merge_from_dict(cfg_options)
    model_cfg = cfg.get('model')
    if not model_cfg or model_cfg.get('type') != 'OnlineClassifier' or \
            model_cfg['network'].get('type') != 'EcoTTANetwork':
        raise ValueError(f'{config}: the warm-up needs model=dict(type='
                         "'OnlineClassifier', network=dict(type="
                         "'EcoTTANetwork', ...))")
    model = MODELS.build(dict(model_cfg, _scope_='mmseg_stag'))
    meta = model.network.ecotta
    cold, meta.allow_cold_start = meta.allow_cold_start, True
    model.load_weights(checkpoint, trust_pickle)  # frozen part
    meta.allow_cold_start = cold
    return model


def file_sha1(path: str) -> str:
    """SHA-1 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha1()
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 20), b''):
            digest.update(chunk)
    return digest.hexdigest()


def warm_up_checkpoint(config: str, checkpoint: str, out: str,
                       train_data: str, work_dir: str,
                       train_labels: Optional[str] = None, epochs: int = 10,
                       lr: float = 0.05, batch_size: int = 64, seed: int = 0,
                       limit: Optional[int] = None, resume: bool = False,
                       trust_pickle: bool = False,
                       cfg_options: Optional[dict] = None,
                       device: Union[str, torch.device, None] = None
                       ) -> dict:
    """``tools/ecotta_warmup.py`` (its options are the arguments): warm up
    the meta networks of an EcoTTA config from the source weights on
    ``device`` (default: :func:`warmup_device`'s, where ``tools/test.py``
    runs the model), save them to ``out``; return ``history`` and the
    source cross-entropy ``before`` and ``after``.

    Raises:
        ValueError: If ``device`` is not usable here, or the config is not
            an EcoTTA classifier's, before the training set is read.
    """
    cfg_options = dict(cfg_options or {})
    device = warmup_device(device)  # before any work
    torch.manual_seed(seed)  # the meta networks' initialisation
    model = ecotta_model(config, checkpoint, cfg_options, trust_pickle)
    meta = model.network.ecotta
    model.to(device)  # BaseModel.to: its preprocessor casts there too
    images, labels = read_training_set(train_data, train_labels)
    if limit:
        images, labels = images[:limit], labels[:limit]
    print(f'EcoTTA warm-up: {len(images)} images, {epochs} epochs, '
          f'batch {batch_size}, lr {lr}, on {device}, meta networks '
          f'{list(meta.blocks_per_part)} -> {out}')
    settings = dict(config=osp.abspath(config),
                    cfg_options=repr(sorted(cfg_options.items())),
                    source=file_sha1(checkpoint),
                    data=hashlib.sha1(np.ascontiguousarray(images)).hexdigest()
                    + hashlib.sha1(np.asarray(labels)).hexdigest())
    x_all = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2)
    y_all = torch.as_tensor(np.asarray(labels), dtype=torch.long)
    before = source_loss(model, x_all, y_all)
    history = warm_up(model, x_all, y_all, work_dir, epochs, lr, batch_size,
                      seed, resume, settings)
    after = source_loss(model, x_all, y_all)
    for epoch, (loss, acc) in enumerate(zip(history['loss'],
                                            history['acc']), 1):
        print(f'epoch {epoch}: train loss {loss:.4f}, acc {acc:.4f}')
    print(f'source cross-entropy (no augmentation): {before:.4f} before, '
          f'{after:.4f} after the warm-up')
    # on the CPU, whatever the device: the file loads anywhere
    state = {k: v.detach().cpu()
             for k, v in model.network.state_dict().items()}
    write_torch(out, dict(state_dict=state, meta=dict(ecotta_warmup=dict(
        epochs=epochs, lr=lr, batch_size=batch_size, seed=seed,
        images=len(images), device=str(device), source_loss_before=before,
        source_loss_after=after, history=history))))
    print(f'wrote {out}; run: python tools/test.py {config} {out}')
    return dict(history=history, before=before, after=after)
