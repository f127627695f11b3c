"""regroup.GlobalSampler: libregroup's sampler from Python. Every sample of an epoch is used
exactly once across world-size changes with the cursor carried over, the shares are the
library's, and the sampler plugs into torch.utils.data.DataLoader."""
import collections

import pytest

import conftest  # noqa: F401  (the package's path)
import regroup


def take_steps(n, batch, seed, world, cursor, steps, drop_last):
    """Runs `steps` global steps at `world` ranks from cursor: the ids used, the new cursor."""
    samplers = [regroup.GlobalSampler(n, batch, seed, rank=r, world_size=world, cursor=cursor,
                                      drop_last=drop_last) for r in range(world)]
    used = []
    for _ in range(steps):
        epoch = samplers[0].epoch
        shares = [s.next_step() for s in samplers]
        counts = {s.global_count for s in samplers}
        assert len(counts) == 1 and sum(map(len, shares)) == counts.pop()
        used += [(epoch, i) for share in shares for i in share]
        assert len({s.cursor for s in samplers}) == 1
    return used, samplers[0].cursor


@pytest.mark.parametrize("drop_last", [False, True])
def test_exactly_once_across_resizes(drop_last):
    n, batch, seed, epochs = 1003, 16, 42, 3
    per_epoch = n // batch if drop_last else -(-n // batch)
    cursor = regroup.Cursor.start(seed)
    used = []
    worlds = [4, 3, 1, 7, 2, 16, 5]   # a resize every 13 steps, mid-epoch
    done = 0
    k = 0
    while done < epochs * per_epoch:
        steps = min(13, epochs * per_epoch - done)
        u, cursor = take_steps(n, batch, seed, worlds[k % len(worlds)], cursor, steps,
                               drop_last)
        used += u
        done += steps
        k += 1
    assert cursor == regroup.Cursor(seed, epochs, 0)
    count = collections.Counter(used)
    for e in range(epochs):
        ids = [i for (ep, i) in count if ep == e]
        assert all(count[(e, i)] == 1 for i in ids), "a sample used twice in epoch %d" % e
        want = n - (n % batch if drop_last else 0)
        assert len(ids) == want, (e, len(ids), want)
        # The epoch is the library's permutation, in order of global position.
        perm = regroup.permutation(seed, e, n)
        assert sorted(ids) == sorted(perm[:want])


def test_iteration_is_one_epoch_from_the_cursor():
    s = regroup.GlobalSampler(100, 10, seed=1, rank=1, world_size=3,
                              cursor=regroup.Cursor(1, 2, 7))
    assert len(s) == 3 and s.epoch == 2 and s.step == 7
    steps = list(s)
    assert len(steps) == 3 and all(len(x) == 3 for x in steps)   # 10 = 4 + 3 + 3
    assert s.cursor == regroup.Cursor(1, 3, 0) and len(s) == 10
    perm = regroup.permutation(1, 2, 100)
    assert steps[0] == perm[74:77]      # step 7: positions 70..79, rank 1's are 74..76


def test_bad_parameters():
    with pytest.raises(ValueError, match="rank 3 of world_size 3"):
        regroup.GlobalSampler(10, 2, rank=3, world_size=3)
    with pytest.raises(ValueError, match="global_batch 0"):
        regroup.GlobalSampler(10, 0)
    with pytest.raises(ValueError, match="cursor step 9"):
        regroup.GlobalSampler(10, 2, cursor=regroup.Cursor(0, 0, 9))
    with pytest.raises(regroup.Error, match="EINVAL"):
        regroup.GlobalSampler(10, 20, drop_last=True)   # no full batch


def test_rank_and_world_from_the_environment(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    s = regroup.GlobalSampler(64, 8, seed=3)
    assert (s.rank, s.world_size) == (2, 4)
    assert s.ids() == regroup.permutation(3, 0, 64)[4:6]


def test_dataloader():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset
    n = 51   # the short last step (3) still gives each of 3 ranks one (default_collate
             # cannot make a batch of none)
    ds = TensorDataset(torch.arange(n), torch.arange(n) * 2)
    seen = []
    for world in (1, 3):
        for r in range(world):
            s = regroup.GlobalSampler(n, 8, seed=9, rank=r, world_size=world)
            got = [x for x, y in DataLoader(ds, batch_sampler=s)]
            assert [g.tolist() for g in got] == [list(x) for x in
                                                 regroup.GlobalSampler(n, 8, 9, r, world)]
            assert all(torch.equal(y, x * 2) for x, y in DataLoader(ds, batch_sampler=s))
            seen += [i for g in got for i in g.tolist()]
        # sampler= with batch_size=None: each item is already this rank's batch
        s = regroup.GlobalSampler(n, 8, seed=9, rank=0, world_size=world)
        first = next(iter(DataLoader(ds, sampler=s, batch_size=None)))[0]
        assert first.tolist() == regroup.GlobalSampler(n, 8, 9, 0, world).ids()
        assert s.step == 1
    assert sorted(seen) == sorted(list(range(n)) * 2)
