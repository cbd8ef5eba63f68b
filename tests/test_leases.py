"""How many batches each call of a Ray worker takes (dispatch.Factoring): a pure rule, tested without Ray."""

from __future__ import annotations

from evalrun.pipeline.dispatch import Factoring


def leases(batches: int, slots: int) -> list[int]:
    """The sizes of the calls that take ``batches`` batches, as a dispatcher asks for them."""
    factoring, sizes, left = Factoring(), [], batches
    while left:
        size = min(left, factoring.next(left, slots))
        sizes.append(size)
        left -= size
    return sizes


def test_each_round_takes_half_of_what_was_left_in_one_size_a_call() -> None:
    # 188 batches (48,000 episodes in batches of 256) on 8 workers with 2 calls in flight each: rounds of 16 calls
    # of ceil(188 / 32) = 6, then ceil(92 / 32) = 3, ceil(44 / 32) = 2, and one batch a call for the last 12
    assert leases(188, 16) == [6] * 16 + [3] * 16 + [2] * 16 + [1] * 12


def test_no_call_takes_more_than_an_equal_share_of_what_is_left_so_the_workers_finish_together() -> None:
    for batches, slots in [(750, 16), (27, 4), (80, 4), (5, 16), (1, 1), (1000, 64), (3900, 4)]:
        sizes = leases(batches, slots)
        assert sum(sizes) == batches
        assert sizes[0] == -(-batches // (2 * slots))  # the first: half an equal share
        assert sizes == sorted(sizes, reverse=True) and sizes[-1] == 1  # the calls only shrink, to one batch
        left = [batches - sum(sizes[:i]) for i in range(len(sizes))]
        assert all(size <= -(-rest // slots) for size, rest in zip(sizes, left, strict=True))


def test_a_round_begun_keeps_its_size_while_the_slots_change() -> None:
    factoring = Factoring()
    assert factoring.next(100, 4) == 13  # ceil(100 / 8): a round of 4 calls
    assert [factoring.next(left, 2) for left in (87, 74, 61)] == [13, 13, 13]  # a worker lost mid-round
    assert factoring.next(48, 2) == 12  # the next round counts the slots left
