"""The bound of the memos keyed by what the node shows (the bytes of a cgroup file, a
directory's name): a node has a few thousand distinct keys, and a memo past
`MEMO_ENTRIES` means something churns (a cgroup made and removed over and over, a
container per second): it is emptied whole and fills again with what is current, so its
memory stays bounded whatever the node does."""

from __future__ import annotations

MEMO_ENTRIES = 65536


def make_room(memo: dict, entries: int = MEMO_ENTRIES) -> None:
    """Before a new key is added: `memo` emptied if it holds more than `entries`."""
    if len(memo) > entries:
        memo.clear()
