"""`mmrl.utils.rows` (each rank draws its rows of the global batch's noise) and
`mmrl.distributed.share` (each rank's rows of a minibatch): hand-checked cases."""

import pytest
import torch

from mmrl.distributed import Ranks, share
from mmrl.utils.rows import batch_rows, rand_rows, randint_rows, randn_rows, rows_generator, sub_rows


def gen(seed: int = 0) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


@pytest.mark.parametrize("draw", [randn_rows, rand_rows, lambda shape, generator: randint_rows(7, shape, generator)])
def test_ranks_draw_the_rows_one_process_draws(draw):
    whole = draw((6, 3, 2), generator=gen())
    parts = []
    for rank in range(3):
        with batch_rows(rank * 2, 2, 6):
            parts.append(draw((2, 3, 2), generator=gen()))
    assert torch.equal(torch.cat(parts), whole)


def test_outside_a_slice_each_draw_is_the_torch_call():
    assert torch.equal(randn_rows((4, 2), generator=gen()), torch.randn((4, 2), generator=gen()))
    with batch_rows(0, 4, 4):  # the whole batch: nothing changes
        assert torch.equal(randn_rows((4, 2), generator=gen()), torch.randn((4, 2), generator=gen()))
    with batch_rows(2, 2, 4):  # a draw that is not one row per batch row is a local draw
        assert torch.equal(randn_rows((3,), generator=gen()), torch.randn((3,), generator=gen()))


def test_a_stage_of_a_ranks_rows():
    whole = randn_rows((8, 2), generator=gen())
    with batch_rows(4, 4, 8), sub_rows(2, 2):  # rank 1 of 2, its second stage of 2
        assert torch.equal(randn_rows((2, 2), generator=gen()), whole[6:8])
    with sub_rows(2, 2):  # one process: a stage draws as it always did
        assert torch.equal(randn_rows((2, 2), generator=gen()), torch.randn((2, 2), generator=gen()))


def test_rows_generators_differ_by_rank_and_keep_the_shared_one_in_step():
    shared = [gen(), gen()]
    own = []
    for rank, g in enumerate(shared):
        with batch_rows(rank * 4, 4, 8):
            own.append(rows_generator(g))
    assert not torch.equal(torch.rand(5, generator=own[0]), torch.rand(5, generator=own[1]))
    assert torch.equal(shared[0].get_state(), shared[1].get_state())
    g = gen()
    assert rows_generator(g) is g  # one process: the generator itself


def test_share_splits_rows_evenly_in_rank_order():
    assert [share(10, Ranks(r, 3)) for r in range(3)] == [(0, 4), (4, 3), (7, 3)]
    assert [share(1, Ranks(r, 2)) for r in range(2)] == [(0, 1), (1, 0)]
    assert share(5, Ranks()) == (0, 5)
