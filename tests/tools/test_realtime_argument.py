"""``--realtime COST|measure`` of ``tools/test.py``, ``tools/adapt.py``
and ``tools/reproduce.py``: three copies of one small parser (a tool
imports no other tool, and ``reproduce.py --help`` answers before the
package and torch load), held equal here on what a user may type."""
import argparse

import pytest
from tool_runs import tool_module

TOOLS = ('test', 'adapt', 'reproduce')
GOOD = {'measure': 'measure', '2.5': 2.5, '1': 1.0, '0.25': 0.25,
        '1e1': 10.0}
BAD = ('0', '-1', '-0.5', 'fast', 'inf', 'nan', '', 'Measure')


@pytest.fixture(scope='module')
def parsers():
    return {name: tool_module(name).realtime_cost for name in TOOLS}


def test_the_three_parsers_read_a_cost_alike(parsers):
    for name, parse in parsers.items():
        assert {text: parse(text) for text in GOOD} == GOOD, name
        for text in BAD:
            with pytest.raises(argparse.ArgumentTypeError,
                               match='a number > 0, or measure'):
                parse(text)
