"""The run-state file (``mmseg_stag/engine/run_state.py``): a file of
another layout version is refused with its version named."""
import pytest
import torch

from mmseg_stag.engine.run_state import (STATE_VERSION, load_run_state,
                                         save_run_state)


def test_a_state_of_another_version_is_refused(tmp_path):
    path = str(tmp_path / 'state.pth')
    save_run_state(path, dict(batches_done=3))
    assert load_run_state(path)['batches_done'] == 3
    # version 2 saved SAR's count of recoveries as num_resets
    torch.save(dict(batches_done=3, version=2), path)
    with pytest.raises(RuntimeError, match=f'state version 2, this code '
                       f'reads {STATE_VERSION}'):
        load_run_state(path)
