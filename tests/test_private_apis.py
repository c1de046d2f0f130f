"""The project reaches into torch's and MMEngine's private attributes only
where no public API serves, and says so beside the use: a private name
changes without notice from one release to the next."""
import os
import os.path as osp
import re

from seg_helpers import REPO

#: private attributes of torch's and MMEngine's objects, with their public
#: stand-ins where there are ones
PRIVATE = ('_modules', '_parameters', '_buffers',
           '_non_persistent_buffers_set', '_version', '_test_loop',
           '_train_loop', '_val_loop', '_found_inf_per_device',
           '_per_optimizer_states', '_log_env', '_cfg_dict', '_scale',
           '_growth_tracker')
USE = re.compile(r'\.(%s)\b' % '|'.join(PRIVATE))
#: the words that say, within the three lines above, why no public API
#: serves
WHY = re.compile(r'no public|not public|public (API|accessor)', re.I)


def uses():
    for folder in ('mmseg_stag', 'tools', 'benchmarks', 'demo_data'):
        for root, _, names in os.walk(osp.join(REPO, folder)):
            for name in names:
                if not name.endswith('.py'):
                    continue
                path = osp.join(root, name)
                with open(path) as f:
                    lines = f.read().splitlines()
                for i, line in enumerate(lines):
                    if USE.search(line.split('#')[0]):
                        yield osp.relpath(path, REPO), i, lines


def test_a_private_attribute_is_used_only_with_the_reason_beside_it():
    unexplained = [f'{path}:{i + 1}: {lines[i].strip()}'
                   for path, i, lines in uses()
                   if not any(WHY.search(line)
                              for line in lines[max(0, i - 3):i + 1])]
    assert not unexplained, '\n'.join(unexplained)
