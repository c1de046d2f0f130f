"""What a method saves at a stage's end and restores on a resume
(``OnlineAdaptationLoop``'s run state; ``OnlineInferencer``'s state): the
tensors its steps can change, its optimizer, ``t`` and its own attributes."""
from typing import Dict, Tuple

import torch


class MethodState:
    """The run state of a method (a :class:`~.base.BaseMethod`), after
    ``configure``: ``model``, ``params``, ``optimizer``, ``grad_scaler``,
    ``t``, ``num_updates`` and ``stage_index`` are the method's."""

    #: attributes :meth:`state_dict` saves under their names (through their
    #: own ``state_dict`` where they have one)
    state_attributes: Tuple[str, ...] = ()

    def state_dict(self) -> dict:
        """Return what the rest of the stream depends on (live tensors)."""
        if self.model is None:
            raise RuntimeError(f'{self.name}: configure before state_dict')
        state = dict(
            model=self.changing_state(),
            optimizer=None if self.optimizer is None
            else self.optimizer.state_dict(),
            grad_scaler=None if self.grad_scaler is None
            else self.grad_scaler.state_dict(),
            t=self.t, num_updates=self.num_updates,
            stage=self.stage_index)
        for name in self.state_attributes:
            value = getattr(self, name)
            state[name] = value.state_dict() if hasattr(
                value, 'state_dict') else value
        return state

    def changing_state(self) -> Dict[str, torch.Tensor]:
        """The adapted parameters and every buffer: what steps can change
        (the frozen ones are the checkpoint's, pinned by the run's identity).
        """
        state = {name: p.detach() for name, p in self.params}
        state.update((n, b) for n, b in self.model.named_buffers())
        return state

    @torch.no_grad()
    def load_changing_state(self, state: Dict[str, torch.Tensor]) -> None:
        """Copy :meth:`changing_state` back, onto the model's devices."""
        current = self.changing_state()
        if set(state) != set(current):
            missing = sorted(set(current) - set(state))[:5]
            extra = sorted(set(state) - set(current))[:5]
            raise ValueError(f'{self.name}: the saved state holds other '
                             f'tensors (missing {missing}, unexpected '
                             f'{extra})')
        for name, tensor in current.items():
            tensor.copy_(state[name])  # copy_ converts device and dtype

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict` of a method of the same config."""
        if self.model is None:
            raise RuntimeError(f'{self.name}: configure before '
                               'load_state_dict')
        self.load_changing_state(state['model'])
        # torch moves the optimizer state onto each parameter's device
        for key, what in (('optimizer', 'an optimizer'),
                          ('grad_scaler', 'a GradScaler (fp16)')):
            current = getattr(self, key)
            if (current is None) != (state[key] is None):
                raise ValueError(f'{self.name}: the saved state was written '
                                 'with' + ('out' if state[key] is None
                                           else '') + f' {what}')
            if current is not None:
                current.load_state_dict(state[key])
        self.t, self.num_updates = state['t'], state['num_updates']
        self.stage_index = state['stage']
        for name in self.state_attributes:
            if hasattr(getattr(self, name), 'load_state_dict'):
                getattr(self, name).load_state_dict(state[name])
            else:
                setattr(self, name, state[name])


#: torch optimizers whose every state tensor starts at zero, so that one
#: zeroed in place steps as a new optimizer's first step (SGD: where its
#: ``dampening`` is 0; a new buffer takes the gradient undampened)
ZERO_STATE_OPTIMIZERS = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)


@torch.no_grad()
def restart_in_place(optimizer) -> bool:
    """Restart ``optimizer`` as a new one of its config would start, in its
    own state tensors: every tensor of its ``state`` zeroed (Adam's and
    AdamW's step counts and moments, SGD's momentum), the same updates as
    a new optimizer's, bit for bit. A CUDA graph that steps those tensors
    stays valid. Return False (nothing changed) for an optimizer whose
    fresh state is not all zeros: the caller builds a new one."""
    if type(optimizer) not in ZERO_STATE_OPTIMIZERS or (
            type(optimizer) is torch.optim.SGD and any(
                group.get('dampening', 0) for group in
                optimizer.param_groups)):
        return False
    for state in optimizer.state.values():
        for value in state.values():
            if torch.is_tensor(value):
                value.zero_()
    return True

