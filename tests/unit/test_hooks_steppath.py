"""The step path's shortcuts give what the general code gives (hooks/steppath.py): the step's end
starts the next step as ``_reset_step`` does, and sampled timing's share-of-the-step path equals
the path with carries whenever nothing carries."""
from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

import ranksight  # noqa: E402
from ranksight.hooks.timing import BWD, COMM, FWD, OPT, PBUSY, XCOMM  # noqa: E402

KINDS = (FWD, BWD, OPT, COMM, XCOMM, PBUSY)  # (the order of _sampled's result)


@pytest.fixture(autouse=True)
def _clean_env(clean_watch_env):
    yield


@pytest.fixture
def w():
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ranksight.watch(model, opt, [torch.randn(2, 4)], agent="off",
                    config={"hooks": {"table_every_steps": 0, "table_every_seconds": 0}})
    watcher = ranksight.hooks.current()
    yield watcher
    ranksight.unwatch()


def _dirty(w) -> None:
    """Every number of the watch (and the phase, the backward's start) set to a value of its own."""
    for i, (k, v) in enumerate(sorted(vars(w).items())):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            setattr(w, k, 1000.0 + i)
    w._t_bwd = 3.0
    w._phase = "dirty"


def test_the_step_end_starts_the_next_step_as_reset_step_does(w):
    w._active = False  # (the hooks stand still: the background thread sends nothing meanwhile)
    _dirty(w)
    w._reset_step(5000.0)
    reset = dict(vars(w))
    _dirty(w)
    w._step_end(5000.0)
    ended = dict(vars(w))
    assert ended.pop("_seq") == reset.pop("_seq") + 1  # the step's end records one step
    assert ended == reset


class _Idle:
    """A sampled timeline with nothing pending (what ``_sampled`` reads of it)."""
    pending = 0


def test_a_step_that_carries_nothing_gets_its_shares_as_the_carry_path_gives_them(w):
    rng = random.Random(3)
    w._gknown = True
    for _ in range(500):
        shares = [rng.random() for _ in KINDS]
        w._gshare.update(zip(KINDS, shares))
        w._gfast = w._shares_if_no_carry()
        assert w._gfast == tuple(shares)
        dur = rng.choice((0.0, rng.random(), rng.random() * 1e-4, rng.random() * 100))
        fast = w._sampled(_Idle(), dur, 1.0)
        assert fast == w._sampled_carry(dur)  # the same floats, to the last bit
        assert not any(w._gacc.values())  # nothing carried


def test_a_share_above_one_carries_its_excess_to_the_next_step(w):
    w._gknown = True
    w._gshare.update(dict.fromkeys(KINDS, 0.25), **{COMM: 1.5})
    w._gfast = w._shares_if_no_carry()
    assert w._gfast is None
    got = w._sampled(_Idle(), 2.0, 1.0)
    assert got[3] == 2.0 and w._gacc[COMM] == 1.0  # capped at the step, the excess carried
    assert w._gfast is None
    w._gshare[COMM] = 0.0
    got = w._sampled(_Idle(), 2.0, 2.0)
    assert got[3] == 1.0 and w._gacc[COMM] == 0.0  # the carry comes out on the next step
    assert w._gfast == (0.25, 0.25, 0.25, 0.0, 0.25, 0.25)  # nothing carries any more
